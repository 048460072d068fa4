"""The answer stage: the RAG system sits the exam; each answer is kept with its source's rank."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from ragexam.config import AnswerContext, Settings
from ragexam.errors import ConfigError
from ragexam.io.csvfile import read_rows
from ragexam.rag.base import Question, RagSystem
from ragexam.rag.builtin import BuiltinRag
from ragexam.rag.custom import CustomRag, rag_name, rag_object
from ragexam.rag.given import GivenContext
from ragexam.stages.generate import QA_FILE
from ragexam.stages.runner import Progress, RunSettings, Stage, StageResult, Task, execute
from ragexam.store.chroma import StoreRef, open_collection

ANSWERS_FILE = "answers.csv"
ANSWER_COLUMNS = ("answer", "retrieved_ids", "target_rank", "k", "rag", "context", "embedding")
TEXT_COLUMNS = ("retrieved_texts", "source_text")  # what the answerer saw; off with --no-texts
QA_REQUIRED = ("qa_id", "chunk_id", "question")
BATCH = 64  # questions per embedding call and per Chroma query
PREFETCH = 2  # batches retrieved ahead of the workers


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
    system.text_chars = options.max_chunk_chars if options.texts else None
    plan = AnswerPlan(system, list(islice(questions, options.limit)))
    stage = Stage(
        "answer",
        options.out / ANSWERS_FILE,
        "qa_id",
        ANSWER_COLUMNS + TEXT_COLUMNS if options.texts else ANSWER_COLUMNS,
        system.model,
        system.prompt_hash,
        system.fixed(),
    )
    record = {**plan.manifest(settings, options, collection), "skipped": skipped}
    how = RunSettings(options.out, settings.concurrency, options.force, settings.redact)
    outcome = execute(stage, plan, record, how, progress)
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
        return GivenContext(
            settings, options.store, collection, options.context, options.max_chunk_chars
        )
    return BuiltinRag(
        settings,
        options.store,
        collection,
        options.k,
        trust=options.trust_store_endpoint,
        max_chars=options.max_chunk_chars,
    )


class AnswerPlan:
    """The questions still to answer, in batches the RAG system prepares ahead of its answers."""

    def __init__(self, system: RagSystem, questions: list[Question]) -> None:
        self.system, self.questions = system, questions
        self.pending: list[Question] = []
        self.llm = getattr(system, "llm", None)  # the runner shows its calls' counters

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
                ahead.append((batch, asyncio.create_task(self.system.prepare(batch))))

        fixed = {**self.system.fixed(), "rag": self.system.name}
        try:
            for _ in range(PREFETCH):
                launch()
            while ahead:
                batch, prepared = ahead.popleft()
                payloads = await prepared
                launch()
                for question, payload in zip(batch, payloads, strict=True):
                    known = {**fixed, "input_hash": question.input_hash}
                    yield Task(question.qa_id, known, payload)
        finally:
            for _, prepared in ahead:
                prepared.cancel()

    async def preflight(self) -> None:
        """What would fail every row is found on the first batch."""
        await self.system.preflight(self.pending[:BATCH])

    async def work(self, task: Task) -> dict[str, Any]:
        """Answer one question."""
        return await self.system.answer(task.payload)

    def manifest(
        self, settings: Settings, options: AnswerOptions, collection: Any
    ) -> dict[str, Any]:
        """What the answers depend on."""
        return {
            **self.system.describe(),
            **self.system.fixed(),
            "store": options.store.describe() if options.store else None,
            "collection": collection.name if collection is not None else None,
            "qa_dataset": str((options.qa_path or options.out / QA_FILE).resolve()),
            "settings": settings.public(),
        }

    def figures(self) -> dict[str, Any]:
        """LLM calls made, when ragexam made them."""
        return self.system.figures()

    async def aclose(self) -> None:
        """Release the system's connections and ragexam's client of the store."""
        await self.system.aclose()
