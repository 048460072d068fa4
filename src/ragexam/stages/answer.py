"""The answer stage: the RAG system sits the exam; each answer is kept with its source's rank."""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from ragexam.config import AnswerContext, Settings
from ragexam.errors import ConfigError, RagexamError, RowError
from ragexam.io.csvfile import read_rows
from ragexam.io.fingerprint import input_hash
from ragexam.llm.client import LLM, describe
from ragexam.llm.prompts import Prompt, context_block, load_prompt
from ragexam.rag.custom import call_rag, rag_name, rag_object
from ragexam.rag.retrieval import Hit, Retriever, make_embedder, rank_of
from ragexam.stages.generate import QA_FILE
from ragexam.stages.runner import Progress, RunSettings, Stage, StageResult, Task, execute
from ragexam.store.chroma import StoreRef, get_chunks, open_collection, release

ANSWERS_FILE = "answers.csv"
ANSWER_COLUMNS = ("answer", "retrieved_ids", "target_rank", "k", "rag", "context", "embedding")
TEXT_COLUMNS = ("retrieved_texts", "source_text")  # what the answerer saw; off with --no-texts
QA_REQUIRED = ("qa_id", "chunk_id", "question")
BATCH = 64  # questions per embedding call and per Chroma query
PREFETCH = 2  # batches retrieved ahead of the workers


@dataclass(frozen=True)
class Question:
    """One exam question and the chunk it was written from."""

    qa_id: str
    chunk_id: str
    text: str
    ground_truth: str = ""

    @property
    def input_hash(self) -> str:
        """What an answer to it is made from: the question, its ground truth and its source."""
        return input_hash(self.text, self.ground_truth, self.chunk_id)


@dataclass(frozen=True)
class AnswerOptions:
    """What `ragexam answer` was asked to do."""

    store: StoreRef | None
    out: Path
    qa_path: Path | None = None
    k: int = 5
    limit: int | None = None
    rag: Any = None  # "module:callable", or (from the Python API) the callable itself
    force: bool = False
    context: AnswerContext = AnswerContext.retrieved
    trust_store_endpoint: bool = False
    rag_timeout: float | None = None  # seconds per call of a --rag callable [RAGEXAM_TIMEOUT]
    max_chunk_chars: int = 8000  # each retrieved chunk is cut to this in the prompt
    texts: bool = True  # record retrieved_texts and source_text in answers.csv


def read_questions(path: Path) -> tuple[list[Question], int]:
    """The `ok` questions of a qa_dataset.csv (ours or hand-made), and the count skipped."""
    rows = read_rows(path, QA_REQUIRED, key="qa_id", filled=("question", "ground_truth_answer"))
    questions, skipped = [], 0
    for row in rows:
        if row.get("status", "ok") not in ("ok", ""):
            skipped += 1
            continue
        ground_truth = row.get("ground_truth_answer", "")
        questions.append(Question(row["qa_id"], row["chunk_id"], row["question"], ground_truth))
    return questions, skipped


def run_answer(
    settings: Settings, options: AnswerOptions, progress: Progress | None = None
) -> StageResult:
    """Write `answers.csv`; every input is checked before the first paid call."""
    if options.rag is not None and options.context != AnswerContext.retrieved:
        raise ConfigError(
            f"--context {options.context.value} needs the built-in answerer: a --rag system "
            "cannot be handed a context; drop --rag, or use --context retrieved"
        )
    questions, skipped = read_questions(options.qa_path or options.out / QA_FILE)
    rag = rag_object(options.rag)  # first: it may open the store too
    collection = _collection(options)
    system = _system(settings, options, collection, rag)
    system.questions = list(islice(questions, options.limit))
    system.text_chars = options.max_chunk_chars if options.texts else None
    stage = Stage(
        "answer",
        options.out / ANSWERS_FILE,
        "qa_id",
        ANSWER_COLUMNS + TEXT_COLUMNS if options.texts else ANSWER_COLUMNS,
        system.model,
        system.prompt_hash,
        system.fixed(),
    )
    record = {**system.manifest(settings, options, collection), "skipped": skipped}
    how = RunSettings(options.out, settings.concurrency, options.force, settings.redact)
    outcome = execute(stage, system, record, how, progress)
    return StageResult(outcome, stage.path, skipped)


def _collection(options: AnswerOptions) -> Any:
    if options.store is None:
        if options.rag is None and options.context != AnswerContext.none:
            raise ConfigError("the built-in RAG chain needs --chroma PATH or --chroma-url URL")
        return None
    return open_collection(options.store)


def _system(settings: Settings, options: AnswerOptions, collection: Any, rag: Any) -> RagSystem:
    if options.rag is not None:
        timeout = options.rag_timeout or settings.timeout
        return CustomRag(rag, rag_name(options.rag), options.store, collection, options.k, timeout)
    settings.api_key()
    if options.context != AnswerContext.retrieved:
        from ragexam.rag.given import GivenContext

        return GivenContext(
            settings, options.store, collection, options.context, options.max_chunk_chars
        )
    return BuiltinRag(settings, options, collection)


class RagSystem(ABC):
    """What answers the questions: the built-in chain or the user's callable."""

    model: str
    prompt_hash: str
    name: str
    context = AnswerContext.retrieved
    embedding: str | None = None

    def __init__(self, store: StoreRef | None, collection: Any, k: int) -> None:
        self.store, self.collection, self.k = store, collection, k
        self.questions: list[Question] = []
        self.pending: list[Question] = []
        self.text_chars: int | None = None  # record chunk texts, cut at this length

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every question this run wants."""
        return {question.qa_id: question.input_hash for question in self.questions}

    def tasks(self, done: set[str]) -> tuple[int, AsyncIterator[Task]]:
        """The questions not yet answered, prepared in batches."""
        self.pending = [question for question in self.questions if question.qa_id not in done]
        return len(self.pending), self._batches(self.pending)

    async def _batches(self, questions: list[Question]) -> AsyncIterator[Task]:
        """Tasks in batches, each carrying what its row needs.

        The next PREFETCH batches are prepared while this one is answered, so no worker
        waits for an embedding call or a Chroma query.
        """
        batches = iter([questions[i : i + BATCH] for i in range(0, len(questions), BATCH)])
        ahead: deque[tuple[list[Question], asyncio.Task[list[Any]]]] = deque()

        def launch() -> None:
            batch = next(batches, None)
            if batch is not None:
                ahead.append((batch, asyncio.create_task(self.prepare(batch))))

        try:
            for _ in range(PREFETCH):
                launch()
            while ahead:
                batch, prepared = ahead.popleft()
                payloads = await prepared
                launch()
                for question, payload in zip(batch, payloads, strict=True):
                    known = {**self.fixed(), "rag": self.name, "input_hash": question.input_hash}
                    yield Task(question.qa_id, known, payload)
        finally:
            for _, prepared in ahead:
                prepared.cancel()

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

    async def preflight(self) -> None:  # noqa: B027 - optional hook
        """Check, before the run, what would fail for every row."""

    @abstractmethod
    async def work(self, task: Task) -> dict[str, Any]:
        """Answer one question."""

    def manifest(
        self, settings: Settings, options: AnswerOptions, collection: Any
    ) -> dict[str, Any]:
        """What the answers depend on."""
        return {
            "model": self.model,
            "prompt": {"answer": self.prompt_hash},
            "rag": self.name,
            **self.fixed(),
            "store": options.store.describe() if options.store else None,
            "collection": collection.name if collection is not None else None,
            "qa_dataset": str((options.qa_path or options.out / QA_FILE).resolve()),
            "settings": settings.public(),
        }

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


class BuiltinRag(RagSystem):
    """Retrieve the top k chunks from the collection, then answer from them with the chat model."""

    name = "builtin"

    def __init__(self, settings: Settings, options: AnswerOptions, collection: Any) -> None:
        super().__init__(options.store, collection, options.k)
        trust = options.trust_store_endpoint
        embedder = make_embedder(settings.embedding, collection, settings, trust)
        self.retriever = Retriever(collection, embedder, options.k)
        self.embedding = self.retriever.embedder.name
        self.max_chars = options.max_chunk_chars
        self.ready: dict[str, list[list[Hit]]] = {}  # hits of batches retrieved in advance
        self.prompt: Prompt = load_prompt("answer", settings.prompts_dir)
        self.llm = LLM(
            settings, settings.model_for("answer"), max_tokens=settings.max_tokens_for("answer")
        )
        self.model, self.prompt_hash = self.llm.model, self.prompt.hash

    async def prepare(self, batch: list[Question]) -> list[Any]:
        """Retrieve for the whole batch; a failed batch fails its rows, not the run."""
        sources = await self.source_texts([question.chunk_id for question in batch])
        try:
            hits = self.ready.pop(batch[0].qa_id, None) or await self.retriever.retrieve(
                [question.text for question in batch]
            )
        except ConfigError:
            raise  # wrong for every batch: stop the run
        except Exception as exc:  # e.g. an embedding endpoint that failed after its retries
            reason = f"retrieval failed: {describe(exc)[:300]}"
            return [RowError(reason)] * len(batch)
        return [(q, sources.get(q.chunk_id), h) for q, h in zip(batch, hits, strict=True)]

    async def preflight(self) -> None:
        """Retrieve the first batch: the embedding works, and its dimension fits the collection.

        Its hits are kept for the run, so checking costs no extra round trip.
        """
        first = self.pending[:BATCH]
        if first:
            self.ready[first[0].qa_id] = await self.retriever.retrieve([q.text for q in first])

    async def work(self, task: Task) -> dict[str, Any]:
        """Answer from the retrieved chunks."""
        if isinstance(task.payload, RagexamError):
            raise task.payload
        question, source_text, hits = task.payload
        if not question.text.strip():
            raise RowError("the question is empty")
        values = self.prompt.fill(
            question=question.text,
            context=context_block([(hit.text or "")[: self.max_chars] for hit in hits]),
        )
        reply = await self.llm.text(self.prompt.template.format_messages(**values))
        rank = rank_of(question.chunk_id, source_text, hits)
        return {**self.row(reply.value, hits, rank, source_text), **reply.cost()}

    def manifest(
        self, settings: Settings, options: AnswerOptions, collection: Any
    ) -> dict[str, Any]:
        """Adds where the query embeddings are computed."""
        endpoint = self.retriever.embedder.endpoint
        return {**super().manifest(settings, options, collection), "embedding_endpoint": endpoint}

    def figures(self) -> dict[str, Any]:
        """Chat calls made."""
        return {"calls": self.llm.calls}

    async def aclose(self) -> None:
        """Close the chat model's and the embedder's connections, and the store's client."""
        await self.llm.aclose()
        await self.retriever.embedder.aclose()
        await super().aclose()


class CustomRag(RagSystem):
    """The user's RAG callable, from `--rag module:callable`."""

    def __init__(
        self, rag: Any, spec: str, store: StoreRef | None, collection: Any, k: int, timeout: float
    ) -> None:
        super().__init__(store, collection, k)
        self.rag, self.name, self.timeout = rag, spec, timeout
        self.model, self.prompt_hash = f"rag:{spec}", ""

    async def work(self, task: Task) -> dict[str, Any]:
        """Ask the callable; match what it retrieved against the source chunk."""
        question, source_text = task.payload
        started = time.monotonic()
        answer, hits = await call_rag(self.rag, question.text, self.timeout)
        latency = round(time.monotonic() - started, 3)
        missing = [hit.id for hit in hits if hit.text is None and hit.id is not None]
        if missing and (source_text is not None or self.text_chars is not None):
            texts = await self.source_texts(missing)  # ids only: texts match duplicates
            hits = [Hit(hit.id, texts.get(hit.id or "", hit.text)) for hit in hits]
        rank = rank_of(question.chunk_id, source_text, hits)
        return {**self.row(answer, hits, rank, source_text), "latency_s": latency}
