"""The answer stage: the RAG system sits the exam; each answer is kept with its source's rank."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from ragexam.config import AnswerContext, Settings
from ragexam.errors import ConfigError, InputFileError
from ragexam.io.cells import KINDS, NOT_A_KIND, id_list
from ragexam.io.csvfile import header_of, read_rows
from ragexam.io.runfolder import RunFolder, file_identity
from ragexam.options import DEFAULT_K, Given
from ragexam.rag.base import Question, RagSystem
from ragexam.rag.builtin import BuiltinRag
from ragexam.rag.custom import CustomRag, rag_name, rag_object
from ragexam.rag.embedders import make_embedder
from ragexam.rag.given import GivenContext
from ragexam.rag.retrieval import Retriever
from ragexam.stages import stopping
from ragexam.stages.batch import run_settings
from ragexam.stages.runner import Stage, StageResult, Task, execute
from ragexam.stages.session import Session
from ragexam.stages.setup import identity, store_ref
from ragexam.store.chroma import StoreRef, existing_ids, open_collection, release

logger = logging.getLogger("ragexam")
ANSWER_COLUMNS: tuple[str, ...] = ("answer", "retrieved_ids", "target_rank", "target_ranks")
ANSWER_COLUMNS += ("k", "rag", "context", "embedding")
TEXT_COLUMNS = ("retrieved_texts", "source_text")  # what the answerer saw; off with --no-texts
QA_REQUIRED = ("qa_id", "chunk_id", "question")
BATCH = 64  # questions per embedding call and per Chroma query
PREFETCH = 2  # batches retrieved ahead of the workers


def read_questions(path: Path) -> tuple[list[Question], int]:
    """The `ok` questions of a qa_dataset.csv (ours or hand-made), and the count skipped."""
    rows = read_rows(path, QA_REQUIRED, key="qa_id", filled=("question", "ground_truth_answer"))
    if not rows:
        raise InputFileError(path, "holds no questions, only its header: nothing to answer")
    questions, skipped = [], 0
    for row in rows:
        if row.get("status", "ok") not in ("ok", ""):
            skipped += 1
            continue
        if row.get("kind", "") not in ("", *KINDS):  # refused before any paid call, not by stats
            raise InputFileError(
                path, f"the row of qa_id {row['qa_id']!r} has status ok but {NOT_A_KIND}"
            )
        truth, sources = row.get("ground_truth_answer", ""), _chunk_ids(path, row)
        hashes = tuple((row.get("chunk_hash") or "").split())
        question = Question(row["qa_id"], row["chunk_id"], row["question"], truth, sources, hashes)
        questions.append(question)
    return questions, skipped


def _chunk_ids(path: Path, row: dict[str, str]) -> tuple[str, ...]:
    """The row's source chunks: `chunk_ids` when the exam has them, else its `chunk_id`."""
    if "chunk_ids" not in row:
        return ()
    ids = id_list(row["chunk_ids"])
    if ids is None:
        raise InputFileError(
            path, f"the row of qa_id {row['qa_id']!r} has chunk_ids that are no JSON array of ids"
        )
    return ids


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
    exam_of = identity(store, collection) if store is not None else None
    if exam_of is not None:
        folder.check(exam_of)
        check_sources(collection, questions)
    system = _system(settings, given, store, collection, rag, session)
    system.text_chars = given.store.max_chunk_chars if asked.texts else None
    plan = AnswerPlan(system, list(islice(questions, given.calls.limit)))
    stage = Stage(
        "answer",
        folder.answers,
        "qa_id",
        # --no-texts on a file written with them: its rows keep theirs, new ones leave them empty
        ANSWER_COLUMNS + TEXT_COLUMNS
        if asked.texts or set(TEXT_COLUMNS) <= set(header_of(folder.answers))
        else ANSWER_COLUMNS,
        system.model,
        system.prompt_hash,
        system.fixed(),
        required=("answer",),
    )
    record = {
        **plan.manifest(settings, store, collection),
        "qa_dataset": str(exam.resolve()),
        # as read, when this run covered every question (it drops the answers of those edited
        # among them): an exam edited since, or a run cut by --limit, leaves stale answers
        "qa_dataset_read": file_identity(exam) if len(plan.questions) == len(questions) else None,
        "skipped": skipped,
    }
    how = run_settings(given, settings)
    if exam_of is not None:
        folder.claim(exam_of)
    outcome = execute(stage, plan, record, how, session)
    keys = frozenset(question.qa_id for question in plan.questions)
    return StageResult(outcome, stage.path, skipped, keys=keys)


def embeds_questions(given: Given) -> bool:
    """Whether `answer` embeds the questions: the built-in chain, retrieving."""
    asked = given.answering
    return asked.rag in (None, "") and asked.context == AnswerContext.retrieved


def check_inputs(settings: Settings, given: Given, session: Session) -> None:
    """What `answer` would refuse, found before `run` pays for the exam: the --rag module,
    the store, and that its chunks are embedded as the questions will be."""
    asked = given.answering
    if asked.rag not in (None, ""):
        rag_object(asked.rag)
        return
    if not embeds_questions(given):
        return
    store = store_ref(given, settings, session)
    collection = open_collection(store)
    try:
        stopping.run(_check_embedding(settings, given, collection))
    finally:
        release(store)


async def _check_embedding(settings: Settings, given: Given, collection: Any) -> None:
    trust = given.store.trust_store_endpoint
    embedder = make_embedder(settings.embedding, collection, settings, trust)
    try:
        await Retriever(collection, embedder, DEFAULT_K).check_agreement()
    finally:
        await embedder.aclose()


def check_sources(collection: Any, questions: list[Question]) -> None:
    """Say when the exam's chunk ids are not in the store, as after it was built again.

    LangChain and LlamaIndex draw new ids on every ingestion: such a source chunk is found by
    its text when the exam kept its hash (`chunk_hash`), and is otherwise never found.
    """
    ids = [chunk_id for question in questions for chunk_id in question.sources]
    missing = set(ids) - existing_ids(collection, ids)
    if not missing:
        return
    lost = [q for q in questions if set(q.sources) & missing and not q.chunk_hashes]
    said = f"{len(missing)} of {len(set(ids))} of the exam's chunk ids are not in the store"
    if lost:
        logger.warning(
            f"{said} (was it built again since the exam was written?), and {len(lost)} of "
            "their questions have no chunk_hash to find their source by its text: they will "
            "count as misses; write the exam again with this version (ragexam generate)"
        )
    else:
        logger.warning(
            f"{said} (was it built again since the exam was written?): their source chunks "
            "are found by their text (the exam's chunk_hash)"
        )


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
