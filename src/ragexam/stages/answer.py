"""The answer stage: the RAG system sits the exam; each answer is kept with its source's rank."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from ragexam.config import AnswerContext, Settings
from ragexam.errors import ConfigError
from ragexam.io.csvfile import read_rows
from ragexam.io.runfolder import RunFolder
from ragexam.options import DEFAULT_K, Given
from ragexam.rag.base import Question, RagSystem
from ragexam.rag.builtin import BuiltinRag
from ragexam.rag.custom import CustomRag, rag_name, rag_object
from ragexam.rag.given import GivenContext
from ragexam.stages.batch import run_settings
from ragexam.stages.runner import Stage, StageResult, Task, execute
from ragexam.stages.session import Session
from ragexam.stages.setup import identity, store_ref
from ragexam.store.chroma import StoreRef, open_collection

ANSWER_COLUMNS = ("answer", "retrieved_ids", "target_rank", "k", "rag", "context", "embedding")
TEXT_COLUMNS = ("retrieved_texts", "source_text")  # what the answerer saw; off with --no-texts
QA_REQUIRED = ("qa_id", "chunk_id", "question")
BATCH = 64  # questions per embedding call and per Chroma query
PREFETCH = 2  # batches retrieved ahead of the workers


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


def run_answer(settings: Settings, given: Given, session: Session) -> StageResult:
    """Write `answers.csv`; every input is checked before the first paid call."""
    asked = given.answering
    if asked.rag is not None and asked.context != AnswerContext.retrieved:
        raise ConfigError(
            f"--context {asked.context.value} needs the built-in answerer: a --rag system "
            "cannot be handed a context; drop --rag, or use --context retrieved"
        )
    folder = RunFolder(given.out)
    store = store_ref(given, settings, session) if needs_store(given) else None
    exam = given.inputs.qa_dataset or folder.qa_dataset
    questions, skipped = read_questions(exam)
    rag = rag_object(asked.rag)  # before the store is opened: it may open the store too
    collection = open_collection(store) if store is not None else None
    if store is not None:
        folder.claim(identity(store, collection))
    system = _system(settings, given, store, collection, rag, session)
    system.text_chars = given.store.max_chunk_chars if asked.texts else None
    plan = AnswerPlan(system, list(islice(questions, given.calls.limit)))
    stage = Stage(
        "answer",
        folder.answers,
        "qa_id",
        ANSWER_COLUMNS + TEXT_COLUMNS if asked.texts else ANSWER_COLUMNS,
        system.model,
        system.prompt_hash,
        system.fixed(),
    )
    record = {
        **plan.manifest(settings, store, collection),
        "qa_dataset": str(exam.resolve()),
        "skipped": skipped,
    }
    how = run_settings(given, settings)
    outcome = execute(stage, plan, record, how, session)
    return StageResult(outcome, stage.path, skipped)


def needs_store(given: Given) -> bool:
    """Whether answering opens the store: the built-in chain and gold context read it."""
    asked = given.answering
    builtin = asked.rag is None or asked.rag == ""
    return given.store.given or (builtin and asked.context != AnswerContext.none)


def _system(
    settings: Settings,
    given: Given,
    store: StoreRef | None,
    collection: Any,
    rag: Any,
    session: Session,
) -> RagSystem:
    asked = given.answering
    k = asked.k or DEFAULT_K
    if asked.rag is not None:
        timeout = asked.rag_timeout or settings.timeout
        return CustomRag(rag, rag_name(asked.rag), store, collection, k, timeout)
    settings.api_key()
    chars, memory = given.store.max_chunk_chars, session.endpoints
    if asked.context != AnswerContext.retrieved:
        return GivenContext(settings, store, collection, asked.context, chars, memory=memory)
    trust = given.store.trust_store_endpoint
    return BuiltinRag(settings, store, collection, k, trust=trust, max_chars=chars, memory=memory)


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
        self, settings: Settings, store: StoreRef | None, collection: Any
    ) -> dict[str, Any]:
        """What the answers depend on."""
        return {
            **self.system.describe(),
            **self.system.fixed(),
            "store": store.describe() if store else None,
            "collection": collection.name if collection is not None else None,
            "settings": settings.public(),
        }

    def figures(self) -> dict[str, Any]:
        """LLM calls made, when ragexam made them."""
        return self.system.figures()

    async def aclose(self) -> None:
        """Release the system's connections and ragexam's client of the store."""
        await self.system.aclose()
