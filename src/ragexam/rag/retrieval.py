"""Retrieval for the built-in RAG chain: embed questions in batches, query Chroma in batches.

A query vector whose dimension differs from the collection's is an error naming both.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ragexam.errors import ConfigError
from ragexam.rag.base import Hit
from ragexam.rag.embedders import Embedder


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
            n_results=self.k,
            include=["documents"],
        )
        documents = found.get("documents") or [[None] * len(ids) for ids in found["ids"]]
        return [
            [Hit(chunk_id, text) for chunk_id, text in zip(ids, texts, strict=True)]
            for ids, texts in zip(found["ids"], documents, strict=True)
        ]

    def check_dimension(self, vectors: list[list[float]]) -> None:
        """Raise when the query vectors cannot be compared with the collection's."""
        if vectors and self.dimension is not None and len(vectors[0]) != self.dimension:
            raise ConfigError(
                f"the query embeddings ({self.embedder.name}) have dimension {len(vectors[0])} "
                f"but the collection's vectors have dimension {self.dimension}: pass the "
                "--embedding the store was built with"
            )
