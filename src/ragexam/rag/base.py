"""The RAG system under test: what every implementation offers the answer stage.

An implementation prepares a batch of questions (what each needs, such as retrieved chunks),
then answers one question from what was prepared, and says what its answers depend on.
builtin.py retrieves and answers with the chat model; given.py answers from a context ragexam
chooses (the control runs); custom.py calls the user's own system.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragexam.config import AnswerContext
from ragexam.io.fingerprint import input_hash, text_hash
from ragexam.store.chroma import StoreRef, get_chunks, release


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk: its id (when known) and its text (when known)."""

    id: str | None
    text: str | None


def rank_of(
    source_id: str, source_text: str | None, hits: Sequence[Hit], source_hash: str = ""
) -> int | None:
    """1-based rank of the source chunk among hits: same id, or identical text (the store's, or
    the exam's `chunk_hash` of it); else None."""
    for rank, hit in enumerate(hits, start=1):
        if hit.id is not None and hit.id == source_id:
            return rank
        if hit.text is None:
            continue
        if hit.text == source_text or (source_hash and text_hash(hit.text) == source_hash):
            return rank
    return None


@dataclass(frozen=True)
class Question:
    """One exam question and the chunk it was written from."""

    qa_id: str
    chunk_id: str
    text: str
    ground_truth: str = ""
    chunk_hash: str = ""  # of the source chunk's text, when the exam records it

    @property
    def input_hash(self) -> str:
        """What an answer to it is made from: the question, its ground truth and its source."""
        return input_hash(self.text, self.ground_truth, self.chunk_id)


class RagSystem(ABC):
    """What answers the questions: the built-in chain or the user's callable."""

    model: str
    prompt_hash: str
    name: str
    context = AnswerContext.retrieved
    embedding: str | None = None

    def __init__(self, store: StoreRef | None, collection: Any, k: int) -> None:
        self.store, self.collection, self.k = store, collection, k
        self.text_chars: int | None = None  # record chunk texts, cut at this length

    async def prepare(self, batch: list[Question]) -> list[Any]:
        """Per-question payloads for one batch."""
        sources = await self.source_texts([question.chunk_id for question in batch])
        return [(question, sources.get(question.chunk_id)) for question in batch]

    async def source_texts(self, ids: list[str]) -> dict[str, str]:
        """Texts of chunks by id, for matching duplicates by text (none without a store)."""
        if self.collection is None or not ids:
            return {}
        return await asyncio.to_thread(get_chunks, self.collection, ids)

    def fixed(self) -> dict[str, Any]:
        """The settings every row of an answers file shares; resuming with others is refused."""
        return {"k": self.k, "context": self.context.value, "embedding": self.embedding}

    async def preflight(self, first: list[Question]) -> None:  # noqa: B027 - optional hook
        """Check, before the run, what would fail for every row (given the first batch)."""

    @abstractmethod
    async def answer(self, payload: Any) -> dict[str, Any]:
        """Answer one question, from what `prepare` made for it."""

    def describe(self) -> dict[str, Any]:
        """What the answers depend on, beyond the stage's own record."""
        return {"model": self.model, "prompt": {"answer": self.prompt_hash}, "rag": self.name}

    def figures(self) -> dict[str, Any]:
        """LLM calls made, when ragexam made them."""
        return {}

    async def aclose(self) -> None:
        """Release ragexam's client of the store."""
        release(self.store)

    def row(
        self, answer: str, hits: Sequence[Hit], rank: int | None, source: str | None
    ) -> dict[str, Any]:
        """The value columns of one answered question, with the texts it saw when asked."""
        row = answer_row(answer, hits, rank)
        limit = self.text_chars
        if limit is not None:
            texts = [None if hit.text is None else hit.text[:limit] for hit in hits]
            row["retrieved_texts"] = json.dumps(texts, ensure_ascii=False)
            row["source_text"] = None if source is None else source[:limit]
        return row


def answer_row(answer: str, hits: Sequence[Hit], rank: int | None) -> dict[str, Any]:
    """The value columns of one answered question."""
    return {
        "answer": answer,
        "retrieved_ids": json.dumps([hit.id for hit in hits]),
        "target_rank": rank,
    }
