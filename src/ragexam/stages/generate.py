"""The generate stage: one question, its ground-truth answer and its key points per chunk,
and the harder questions asked for (harder.py): multi-hop and unanswerable ones, verified."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from itertools import islice
from typing import Any

from langchain_core.messages import BaseMessage
from pydantic import Field

from ragexam.analysis.keypoints import FEWEST, MOST, dump
from ragexam.analysis.sampling import Sampling, assign_splits, check_resume, choose
from ragexam.config import Settings
from ragexam.errors import RowError
from ragexam.io.cells import MULTI_HOP, SINGLE, UNANSWERABLE
from ragexam.io.csvfile import read_rows
from ragexam.io.fingerprint import input_hash, text_hash
from ragexam.io.runfolder import RunFolder
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Prompt, load_prompt
from ragexam.options import Given
from ragexam.stages.batch import run_settings
from ragexam.stages.flags import (
    Critique,
    Written,
    cheap_flags,
    critic_flags,
    join_flags,
    normalise,
)
from ragexam.stages.harder import harder_for
from ragexam.stages.runner import Stage, StageResult, Task, execute
from ragexam.stages.session import Session
from ragexam.stages.setup import identity, store_ref
from ragexam.store.chroma import (
    StoreRef,
    check_doc_key,
    iter_chunks,
    open_collection,
    release,
)

QA_COLUMNS = (
    "chunk_id",
    "kind",
    "chunk_ids",
    "document",
    "question",
    "ground_truth_answer",
    "key_points",
    "language",
    "truncated",
    "chunk_chars",
    "chunk_hash",
    "temperature",
    "split",
    "flags",
    "link",
    "verification",
    "calls",
)


class QAPair(Written):
    """What the exam writer must return for one chunk."""

    language: str = Field("", description="The language the chunk is written in, e.g. English.")
    question: str = Field(min_length=1, description="A question that the chunk answers.")
    answer: str = Field(min_length=1, description="The correct, complete answer to it.")
    key_points: list[str] = Field(
        min_length=FEWEST,
        max_length=MOST,
        description="The answer's atomic facts, each one short statement, in its language.",
    )


def qa_id_for(chunk_id: str, index: int = 0) -> str:
    """A stable id for the index-th question written from a chunk."""
    return hashlib.blake2b(f"{chunk_id}\x1f{index}".encode(), digest_size=8).hexdigest()


def run_generate(settings: Settings, given: Given, session: Session) -> StageResult:
    """Write `qa_dataset.csv` in the run folder; checks inputs before any paid call."""
    settings.api_key()
    folder = RunFolder(given.out)
    store = store_ref(given, settings, session)
    collection = open_collection(store)
    exam = identity(store, collection)
    folder.check(exam)
    sampling = sampling_of(given)
    check_resume(folder.path, folder.qa_dataset, sampling)
    used = check_doc_key(collection, given.exam.doc_key)
    session.observer.note(_named_by(used))
    plan = GeneratePlan(settings, given, store, collection, session)
    plan.doc_key_used = used
    fixed = {"temperature": plan.temperature}  # part of the fingerprint: another exam else
    stage = Stage(
        "generate",
        folder.qa_dataset,
        "qa_id",
        QA_COLUMNS,
        plan.llm.model,
        plan.prompt.hash,
        fixed,
        legacy=fixed,  # older versions recorded no temperature: theirs is not a difference
        required=("question", "ground_truth_answer"),
    )
    how = run_settings(given, settings)
    folder.claim(exam)
    outcome = execute(stage, plan, plan.manifest(settings), how, session)
    return StageResult(outcome, stage.path, notes=tuple(plan.notes()))


def _named_by(used: str | None) -> str:
    """Which metadata field names the documents, said once: the report groups by it."""
    if used is None:
        return "documents: the chunks have no metadata, so all are one document, (unknown)"
    return f"documents are named by the metadata field {used!r} (--doc-key chooses)"


def sampling_of(given: Given) -> Sampling:
    """How the options choose and split the chunks."""
    exam = given.exam
    return Sampling(exam.sample, exam.per_document, given.folder.seed, exam.validation)


class GeneratePlan:
    """One question and answer per chunk, through the generate prompt."""

    def __init__(
        self, settings: Settings, given: Given, store: StoreRef, collection: Any, session: Session
    ) -> None:
        self.store, self.collection = store, collection
        self.out, self.limit, self.doc_key = given.out, given.calls.limit, given.exam.doc_key
        self.max_chunk_chars, self.sampling = given.store.max_chunk_chars, sampling_of(given)
        self.prompt: Prompt = load_prompt("generate", settings.prompts_dir)
        self.critic = load_prompt("critic", settings.prompts_dir) if given.exam.check else None
        self.temperature = given.exam.exam_temperature  # 0: the server's default would vary
        self.llm = LLM(
            settings,
            settings.model_for("generate"),
            temperature=self.temperature,
            max_tokens=settings.max_tokens_for("generate"),
            memory=session.endpoints,
        )
        self.seen: set[str] = set()  # normalised questions written so far, for duplicates
        self.doc_key_used: str | None = None
        self.harder = harder_for(settings, given, collection, session, self.llm)

    def tasks(self, done: set[str]) -> tuple[int, AsyncIterator[Task]]:
        """The first --limit chunks (of the sample, if any), less those already done; then
        the harder questions' candidates, while more are wanted."""
        path = RunFolder(self.out).qa_dataset
        rows = read_rows(path, ["question"]) if path.exists() else []
        # The runner kept only the ok rows: their questions came earlier.
        self.seen = {normalise(row["question"]) for row in rows}
        kinds = Counter(row.get("kind") or SINGLE for row in rows if row["qa_id"] in done)
        singles = {row["qa_id"] for row in rows if (row.get("kind") or SINGLE) == SINGLE}
        left, tasks = self.single_tasks(done & singles if rows else done)
        wanted = self.harder.start(kinds) if self.harder is not None else 0
        return left + wanted, self._all(tasks, done)

    async def _all(self, singles: Iterator[Task], done: set[str]) -> AsyncIterator[Task]:
        """The single questions' tasks, then the harder ones'."""
        for task in singles:
            yield task
        if self.harder is not None:
            splits = self.harder.splits(self.sampling.split, self.sampling.seed)
            async for task in self.harder.tasks(done, splits):
                yield task

    def single_tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The single questions' tasks: the first --limit chunks (of the sample, if any)."""
        if self.sampling.active:
            return self._sampled(done)
        count = self.collection.count()
        wanted = min(count, self.limit or count)
        chunks = islice(iter_chunks(self.collection, self.doc_key), self.limit)
        left = max(wanted - len(done), 0)
        return left, _tasks(chunks, done, self.max_chunk_chars, None, self.temperature)

    def _sampled(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """List the chunks without their texts, draw the sample and splits, then read the texts."""
        sampling = self.sampling
        pairs = [
            (chunk.id, chunk.document)
            for chunk in iter_chunks(self.collection, self.doc_key, texts=False)
        ]
        chosen = choose(pairs, sampling)
        selected = [pair for pair in pairs if pair[0] in chosen][: self.limit]
        splits = assign_splits(selected, sampling.split, sampling.seed) if sampling.split else {}
        wanted = {chunk_id for chunk_id, _ in selected}
        chunks = (c for c in iter_chunks(self.collection, self.doc_key) if c.id in wanted)
        left = sum(qa_id_for(chunk_id) not in done for chunk_id in wanted)
        return left, _tasks(chunks, done, self.max_chunk_chars, splits, self.temperature)

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every chunk this run wants: its text as sent, and its document."""
        if self.sampling.active:
            tasks = self._sampled(set())[1]
        else:
            chunks = islice(iter_chunks(self.collection, self.doc_key), self.limit)
            tasks = _tasks(chunks, set(), self.max_chunk_chars)
        found = {task.key: task.known["input_hash"] for task in tasks}
        return found | (self.harder.inputs() if self.harder is not None else {})

    async def work(self, task: Task) -> dict[str, Any] | None:
        """Ask for a QAPair about the chunk; a harder question is written and verified."""
        if self.harder is not None and task.known["kind"] != SINGLE:
            return await self.harder.work(task, self.seen)
        text: str = task.payload
        if not text.strip():  # nothing to ask about: an error row, and no paid call
            raise RowError("the chunk is empty or whitespace only; nothing to ask about")
        reply = await self.llm.structured(self.messages(task), QAPair)
        question, truth = reply.value.question, reply.value.answer
        cost, critique = reply.cost(), []
        if self.critic is not None:
            review = await self._review(text, question, truth)
            critique = critic_flags(review.value)
            cost = {name: value + review.cost()[name] for name, value in cost.items()}
        # Once the row is done, and with no wait between: the first question to be done is
        # the original, and a row the batch road stops at its critic leaves no trace.
        flags = cheap_flags(question, truth, int(task.known["chunk_chars"]), self.seen)
        self.seen.add(normalise(question))
        flags += critique
        return {
            "question": question,
            "ground_truth_answer": truth,
            "key_points": dump(reply.value.key_points),
            "language": reply.value.language,
            "flags": join_flags(flags),
            "calls": 2 if self.critic is not None else 1,
            **cost,
        }

    async def _review(self, chunk: str, question: str, truth: str) -> Reply[Critique]:
        """One critic call: is the question standalone, answerable, its answer supported?"""
        assert self.critic is not None
        values = self.critic.fill(chunk=chunk, question=question, answer=truth)
        return await self.llm.structured(self.critic.template.format_messages(**values), Critique)

    def messages(self, task: Task) -> list[BaseMessage]:
        """The prompt that asks about the task's chunk."""
        values = self.prompt.fill(chunk=task.payload, document=str(task.known["document"]))
        return self.prompt.template.format_messages(**values)

    async def preflight(self) -> None:
        """The harder questions' embedding, if any; the rest run_generate checked."""
        if self.harder is not None:
            await self.harder.preflight()

    async def aclose(self) -> None:
        """Close the models' connections and ragexam's client of the store."""
        try:
            await self.llm.aclose()
            if self.harder is not None:
                await self.harder.aclose()
        finally:
            release(self.store)

    def figures(self) -> dict[str, Any]:
        """Calls made, the structured-output method used in the end, and the harder questions'
        figures (kept, dropped, the verifier's calls and tokens by model)."""
        return {
            **self.llm.figures(),
            **(self.harder.figures() if self.harder is not None else {}),
        }

    def notes(self) -> list[str]:
        """What to tell of the harder questions: kept of asked, dropped and why."""
        return self.harder.notes() if self.harder is not None else []

    def harder_asked(self, kind: str) -> int | None:
        """How many questions of a harder kind this run was asked for."""
        item = self.harder.asked.get(kind) if self.harder is not None else None
        return item.asked if item is not None else None

    def manifest(self, settings: Settings) -> dict[str, Any]:
        """What the questions depend on."""
        return {
            "model": self.llm.model,
            "prompt": {"generate": self.prompt.hash}
            | ({"critic": self.critic.hash} if self.critic else {})
            | (self.harder.prompt_hashes() if self.harder else {}),
            "store": self.store.describe(),
            "collection": self.collection.name,
            "settings": settings.public(),
            "options": {
                "limit": self.limit,
                "doc_key": self.doc_key,
                "doc_key_used": self.doc_key_used,
                "max_chunk_chars": self.max_chunk_chars,
                "sampling": self.sampling.record(),
                "check": self.critic is not None,
                "multi_hop": self.harder_asked(MULTI_HOP),
                "unanswerable": self.harder_asked(UNANSWERABLE),
                "temperature": self.temperature,
            },
        }


def _tasks(
    chunks: Iterator[Any],
    done: set[str],
    max_chars: int,
    splits: dict[str, str] | None = None,
    temperature: float = 0.0,
) -> Iterator[Task]:
    for chunk in chunks:
        qa_id = qa_id_for(chunk.id)
        if qa_id in done:
            continue
        text = chunk.text[:max_chars]
        known = {
            "chunk_id": chunk.id,
            "kind": SINGLE,
            "chunk_ids": json.dumps([chunk.id], ensure_ascii=False),
            "document": chunk.document,
            "truncated": len(chunk.text) > max_chars,
            "chunk_chars": len(chunk.text),
            "chunk_hash": text_hash(chunk.text),
            "split": (splits or {}).get(chunk.id),
            "temperature": temperature,
            "input_hash": input_hash(text, chunk.document),
        }
        yield Task(qa_id, known, text)
