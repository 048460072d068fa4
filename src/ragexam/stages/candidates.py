"""Candidates for harder questions: pairs of chunks that belong together, and seed chunks.

`generate --multi-hop N` draws pairs: neighbours in one document (the next chunk in the
store's order, else the one before), and near neighbours across documents (the nearest chunk
of another document by the store's own vectors), alternately. `--unanswerable N` draws seed
chunks, whose subject its questions take. Both are stratified by document as `--sample` is
(proportional allocation, at least one per document when the budget allows), seeded, and
interleaved so that the first candidates already cover the documents: more are drawn than
asked for, since verification drops some, and they are tried in order until N are kept.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ragexam.analysis.sampling import allocate
from ragexam.io.cells import MULTI_HOP, UNANSWERABLE
from ragexam.io.fingerprint import input_hash, text_hash
from ragexam.store.chroma import Chunk, document_of, iter_chunks, nearest_elsewhere

TRIES = 3  # candidates drawn per question asked: verification drops some
EMPTY = Chunk("", "", "", {})
NEIGHBOURS, NEAR = "neighbours", "near"  # how the chunks of a pair belong together


@dataclass(frozen=True)
class Candidate:
    """A harder question to try: its kind, its chunks (two, or the seed), and how they link."""

    kind: str
    chunks: tuple[Chunk, ...]
    link: str = ""

    @property
    def key(self) -> str:
        """Its qa_id: stable for the same kind and chunks."""
        text = "\x1f".join([self.kind, *(chunk.id for chunk in self.chunks)])
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def input_hash(self, salt: tuple[str, ...] = ()) -> str:
        """What its question is made from: the texts of its chunks, and the `salt` (the prompts
        and models that write and verify it: a change to one redoes it)."""
        return input_hash(self.kind, *(chunk.text for chunk in self.chunks), *salt)

    def known(self, max_chars: int, salt: tuple[str, ...] = ()) -> dict[str, Any]:
        """The columns of its row known before any call."""
        first = self.chunks[0]
        sources = [chunk.id for chunk in self.chunks] if self.kind == MULTI_HOP else []
        return {
            "chunk_id": sources[0] if sources else "",
            "kind": self.kind,
            "chunk_ids": json.dumps(sources, ensure_ascii=False),
            "chunk_hash": " ".join(text_hash(chunk.text) for chunk in self.chunks if sources),
            "document": first.document,
            "truncated": any(len(chunk.text) > max_chars for chunk in self.chunks),
            "chunk_chars": sum(len(chunk.text) for chunk in self.chunks),
            "link": self.link,
            "input_hash": self.input_hash(salt),
        }


def listing(collection: Any, doc_key: str | None) -> dict[str, list[str]]:
    """Every chunk id by document, in the store's order (no texts read)."""
    by_document: dict[str, list[str]] = {}
    for chunk in iter_chunks(collection, doc_key, texts=False):
        by_document.setdefault(chunk.document, []).append(chunk.id)
    return by_document


def draw_seeds(
    by_document: dict[str, list[str]], count: int, seed: int, salt: str
) -> list[tuple[str, str]]:
    """(document, chunk id) of TRIES x count chunks, stratified, interleaved across documents."""
    budget = min(TRIES * count, sum(len(ids) for ids in by_document.values()))
    wanted = allocate({doc: len(ids) for doc, ids in by_document.items()}, budget)
    rng = random.Random(f"{seed}:{salt}")
    drawn = {doc: rng.sample(ids, wanted[doc]) for doc, ids in sorted(by_document.items())}
    return list(_interleaved(drawn))


def _interleaved(drawn: dict[str, list[str]]) -> Iterator[tuple[str, str]]:
    """Each document's draws spread over the whole order, in proportion to its share."""
    placed = [
        ((place + 0.5) / len(ids), doc, chunk_id)
        for doc, ids in drawn.items()
        for place, chunk_id in enumerate(ids)
    ]
    for _, doc, chunk_id in sorted(placed):
        yield doc, chunk_id


def draw_pairs(collection: Any, doc_key: str | None, count: int, seed: int) -> list[Candidate]:
    """TRIES x count pairs, alternately neighbours in a document and near across documents."""
    by_document = listing(collection, doc_key)
    seeds = draw_seeds(by_document, count, seed, MULTI_HOP)
    across = nearest_elsewhere(collection, [chunk_id for _, chunk_id in seeds[1::2]], doc_key)
    pairs, seen = [], set()
    for place, (doc, chunk_id) in enumerate(seeds):
        order = [_neighbour(by_document[doc], chunk_id), (across.get(chunk_id), NEAR)]
        for partner, link in order if place % 2 == 0 else reversed(order):
            pair = frozenset((chunk_id, partner or chunk_id))
            if partner is not None and pair not in seen:
                seen.add(pair)
                pairs.append((chunk_id, partner, link))
                break
    return _with_texts(collection, doc_key, pairs)


def _neighbour(ids: list[str], chunk_id: str) -> tuple[str | None, str]:
    """The next chunk of the document, else the one before (None for a lone chunk)."""
    at = ids.index(chunk_id)
    after = ids[at + 1] if at + 1 < len(ids) else ids[at - 1] if at else None
    return after, NEIGHBOURS


def _with_texts(
    collection: Any, doc_key: str | None, pairs: list[tuple[str, str, str]]
) -> list[Candidate]:
    """The pairs as candidates, with their chunks' texts and documents read in one call."""
    chunks = _chunks(
        collection, doc_key, {i for first, second, _ in pairs for i in (first, second)}
    )
    return [
        Candidate(MULTI_HOP, (chunks[first], chunks[second]), link)
        for first, second, link in pairs
        if chunks.get(first, EMPTY).text.strip() and chunks.get(second, EMPTY).text.strip()
    ]


def draw_unanswerable(
    collection: Any, doc_key: str | None, count: int, seed: int
) -> list[Candidate]:
    """TRIES x count seed chunks, stratified by document, each the subject of a question."""
    seeds = draw_seeds(listing(collection, doc_key), count, seed, UNANSWERABLE)
    chunks = _chunks(collection, doc_key, {chunk_id for _, chunk_id in seeds})
    return [
        Candidate(UNANSWERABLE, (chunks[chunk_id],))
        for _, chunk_id in seeds
        if chunk_id in chunks and chunks[chunk_id].text.strip()
    ]


def _chunks(collection: Any, doc_key: str | None, ids: Iterable[str]) -> dict[str, Chunk]:
    """The chunks with these ids, texts and documents."""
    wanted = sorted(ids)
    if not wanted:
        return {}
    found = collection.get(ids=wanted, include=["documents", "metadatas"])
    return {
        chunk_id: Chunk(chunk_id, text or "", document_of(metadata, doc_key), metadata or {})
        for chunk_id, text, metadata in zip(
            found["ids"], found["documents"] or [], found["metadatas"] or [], strict=True
        )
    }
