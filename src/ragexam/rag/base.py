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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragexam.config import AnswerContext
from ragexam.io.cells import question_chunks
from ragexam.io.fingerprint import answer_hash, text_hash
from ragexam.store.chroma import StoreRef, get_chunks, release

if TYPE_CHECKING:
    from ragexam.llm.client import LLM


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk: its id (when known) and its text (when known)."""

    id: str | None
    text: str | None


def ranks_of(
    source_ids: Sequence[str],
    source_texts: Sequence[str | None],
    hits: Sequence[Hit],
    source_hashes: Sequence[str] = (),
) -> list[int | None]:
    """Each source chunk's 1-based rank among hits (same id, or identical text: the store's, or
    the exam's `chunk_hash` of it), else None.

    A hit counts for one source chunk at most, as trec_eval judges a retrieved document once:
    two sources of one text take two hits.
    """
    # Hashes beyond the sources (a hand-made exam's) are ignored; missing ones match nothing.
    hashes = (list(source_hashes) + [""] * len(source_ids))[: len(source_ids)]
    hashed = any(hashes)
    hit_hashes = [text_hash(hit.text) if hashed and hit.text is not None else None for hit in hits]
    ranks: list[int | None] = []
    taken: set[int] = set()
    for source_id, text, digest in zip(source_ids, source_texts, hashes, strict=True):
        rank = next(
            (
                rank
                for rank, (hit, hit_hash) in enumerate(zip(hits, hit_hashes, strict=True), 1)
                if rank not in taken and _is_source(hit, hit_hash, source_id, text, digest)
            ),
            None,
        )
        ranks.append(rank)
        if rank is not None:
            taken.add(rank)
    return ranks


def _is_source(
    hit: Hit, hit_hash: str | None, source_id: str, text: str | None, digest: str
) -> bool:
    """Whether a hit is this source chunk: its id, its text, or the exam's hash of its text."""
    return hit.id == source_id or _same_text(hit, text) or bool(digest and hit_hash == digest)


def _same_text(hit: Hit, text: str | None) -> bool:
    return text is not None and hit.text is not None and hit.text == text


@dataclass(frozen=True)
class Question:
    """One exam question and the chunks it was written from (none for an unanswerable one)."""

    qa_id: str
    chunk_id: str
    text: str
    ground_truth: str = ""
    chunk_ids: tuple[str, ...] = ()  # every source chunk; empty: chunk_id alone, if any
    chunk_hashes: tuple[str, ...] = ()  # of their texts, when the exam records them

    @property
    def sources(self) -> tuple[str, ...]:
        """The ids of every source chunk, best first as the exam lists them."""
        return question_chunks(self.chunk_id, self.chunk_ids)

    @property
    def input_hash(self) -> str:
        """What an answer to it is made from: the question, its ground truth and its sources."""
        return answer_hash(self.text, self.ground_truth, self.sources)


@dataclass(frozen=True)
class Sources:
    """A question's source chunks: their ids and, where the store has them, their texts."""

    ids: tuple[str, ...]
    texts: tuple[str | None, ...]
    hashes: tuple[str, ...] = ()  # of their texts, as the exam recorded them

    @property
    def first(self) -> str | None:
        """The first source chunk's text (the `source_text` column), if known."""
        return self.texts[0] if self.texts else None

    def ranks(self, hits: Sequence[Hit]) -> list[int | None]:
        """Where each source chunk ranked among hits."""
        return ranks_of(self.ids, self.texts, hits, self.hashes)


def sources_of(question: Question, texts: Mapping[str, str]) -> Sources:
    """The question's sources, with the texts found in `texts` (by id)."""
    ids = question.sources
    return Sources(ids, tuple(texts.get(chunk_id) for chunk_id in ids), question.chunk_hashes)


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
        texts = await self.source_texts(source_ids(batch))
        return [(question, sources_of(question, texts)) for question in batch]

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

    def row(self, answer: str, hits: Sequence[Hit], sources: Sources) -> dict[str, Any]:
        """The value columns of one answered question, with the texts it saw when asked."""
        row = answer_row(answer, hits, sources.ranks(hits))
        limit = self.text_chars
        if limit is not None:
            texts = [None if hit.text is None else hit.text[:limit] for hit in hits]
            row["retrieved_texts"] = json.dumps(texts, ensure_ascii=False)
            row["source_text"] = None if sources.first is None else sources.first[:limit]
        return row


def source_ids(batch: Sequence[Question]) -> list[str]:
    """Every source chunk id of a batch of questions, once each."""
    return list(dict.fromkeys(chunk_id for question in batch for chunk_id in question.sources))


def answer_row(answer: str, hits: Sequence[Hit], ranks: Sequence[int | None]) -> dict[str, Any]:
    """The value columns of one answered question: `target_rank` is the best of `target_ranks`."""
    found = [rank for rank in ranks if rank is not None]
    return {
        "answer": answer,
        "retrieved_ids": json.dumps([hit.id for hit in hits]),
        "target_rank": min(found, default=None),
        "target_ranks": json.dumps(list(ranks)),
    }


def chat_figures(llm: LLM) -> dict[str, Any]:
    """The figures of an answerer of ragexam's own: chat calls made, and the tokens billed (on
    the batch road: its job's, from every run of it, which the rows of this run alone do not
    tell, so that the stage's record stays its cost)."""
    figures = llm.figures()
    return {name: figures[name] for name in ("calls", "tokens_billed")}
