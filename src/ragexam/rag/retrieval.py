"""Retrieval for the built-in RAG chain: embed questions in batches, query Chroma in batches.

A query vector whose dimension differs from the collection's is an error naming both. Before
the first query, a few stored chunks are embedded as queries are: vectors that do not point
where the stored ones do (another model, even of the same size) are refused, since every
question would then be asked in the wrong space.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Mapping
from typing import Any

from ragexam.errors import ConfigError
from ragexam.rag.base import Hit
from ragexam.rag.embedders import Embedder

AGREEMENT_SAMPLE = 4  # stored chunks embedded again before the first query
TIES = 4  # hits fetched past k, so that chunks tied at the k-th distance are chosen by id
AGREEMENT = 0.7  # cosine below which the query embedding is another model's (1.0: the same)


def collection_dimension(collection: Any) -> int | None:
    """The dimension of the collection's stored vectors."""
    try:
        sample = collection.get(limit=1, include=["embeddings"])
    except Exception:  # Chroma's Python server 1.5 fails to return vectors (a 500)
        known = getattr(getattr(collection, "_model", None), "dimension", None)
        return known if isinstance(known, int) else None
    embeddings = sample.get("embeddings")
    return len(embeddings[0]) if embeddings is not None and len(embeddings) else None


class Retriever:
    """Top-k chunks for batches of questions, with one embedding and one query call per batch."""

    def __init__(self, collection: Any, embedder: Embedder, k: int) -> None:
        self.collection, self.embedder, self.k = collection, embedder, k
        self.dimension = collection_dimension(collection)

    async def retrieve(self, questions: list[str]) -> list[list[Hit]]:
        """The hits of each question, best first."""
        vectors = await self.embedder.embed(questions)
        self.check_dimension(vectors)
        found = await asyncio.to_thread(
            self.collection.query,
            query_embeddings=vectors,
            n_results=self.k + TIES,
            include=["documents", "distances"],
        )
        documents = found.get("documents") or [[None] * len(ids) for ids in found["ids"]]
        distances = found.get("distances") or [[0.0] * len(ids) for ids in found["ids"]]
        return [
            _ordered(ids, texts, far)[: self.k]
            for ids, texts, far in zip(found["ids"], documents, distances, strict=True)
        ]

    def check_dimension(self, vectors: list[list[float]]) -> None:
        """Raise when the query vectors cannot be compared with the collection's."""
        if vectors and self.dimension is not None and len(vectors[0]) != self.dimension:
            raise ConfigError(
                f"the query embeddings ({self.embedder.name}) have dimension {len(vectors[0])} "
                f"but the collection's vectors have dimension {self.dimension}: pass the "
                "--embedding the store was built with"
            )

    async def check_agreement(self) -> None:
        """Embed a few stored chunks as queries are, and compare with their stored vectors."""
        try:
            sample = await asyncio.to_thread(
                self.collection.get,
                limit=AGREEMENT_SAMPLE,
                include=["documents", "embeddings", "metadatas"],
            )
        except Exception:  # a server that cannot return vectors: nothing to compare with
            return
        documents = sample.get("documents") or []
        metadatas = [*(sample.get("metadatas") or []), *[None] * len(documents)]  # none kept
        stored_vectors = _listed(sample.get("embeddings"))
        pairs = [
            ({text, embedded_text(text, metadata)}, stored)
            for text, metadata, stored in zip(documents, metadatas, stored_vectors, strict=False)
            if text and stored is not None
        ]
        if not pairs:
            return
        texts = sorted({text for made_from, _ in pairs for text in made_from})
        vectors = dict(zip(texts, await self.embedder.embed(texts), strict=True))
        self.check_dimension(list(vectors.values()))
        agreement = statistics.median(  # each chunk by the text its vector was made from
            max(cosine(vectors[text], stored) for text in made_from) for made_from, stored in pairs
        )
        if agreement < AGREEMENT:
            raise ConfigError(
                f"the query embeddings ({self.embedder.name}) are not the store's: "
                f"{len(pairs)} stored chunks embedded again have cosine {agreement:.2f} with "
                "their stored vectors (1.00 when one model made both), so every question would "
                "be asked in another model's space: pass --embedding openai:MODEL with the model "
                "the store was built with"
            )


def embedded_text(text: str, metadata: Mapping[str, Any] | None) -> str:
    """The text a stored chunk's vector was made from: its text, but in a store LlamaIndex
    built, its metadata too (a node's get_content(MetadataMode.EMBED), from the node it
    keeps beside the chunk), unless the node says to leave it out."""
    raw = (metadata or {}).get("_node_content")
    try:
        node = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return text
    fields = node.get("metadata") if isinstance(node, dict) else None
    if not isinstance(node, dict) or not isinstance(fields, dict):
        return text
    left_out = set(node.get("excluded_embed_metadata_keys") or ())
    template = str(node.get("metadata_template") or "{key}: {value}")
    separator = node.get("metadata_separator", node.get("metadata_seperator", "\n"))
    lines = (
        template.format(key=key, value=str(value))
        for key, value in fields.items()
        if key not in left_out
    )
    try:
        shown = str(separator).join(lines).strip()  # formatted as joined: may raise below
        form = str(node.get("text_template") or "{metadata_str}\n\n{content}")
        return form.format(content=text, metadata_str=shown).strip() if shown else text
    except (KeyError, IndexError, ValueError):  # a template of its own: the text alone
        return text


def _listed(embeddings: Any) -> list[Any]:
    return [] if embeddings is None else list(embeddings)


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two vectors (0 when either is all zeros)."""
    dot = sum(float(x) * float(y) for x, y in zip(a, b, strict=False))
    norms = sum(float(x) ** 2 for x in a) ** 0.5 * sum(float(y) ** 2 for y in b) ** 0.5
    return dot / norms if norms else 0.0


def _ordered(ids: list[str], texts: list[str | None], distances: list[float]) -> list[Hit]:
    """Hits best first; chunks at the same distance by id, so that a question asked again
    gets the same chunks in the same order, and so the same prompt (the index returns ties in
    any order; the batch road matches a result to its row by the very request it was asked
    with)."""
    ranked = sorted(zip(distances, ids, texts, strict=True), key=lambda hit: (hit[0], hit[1]))
    return [Hit(chunk_id, text) for _, chunk_id, text in ranked]
