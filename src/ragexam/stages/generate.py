"""The generate stage: one question and ground-truth answer per chunk of the collection."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field, field_validator

from ragexam.analysis.sampling import Sampling, assign_splits, check_resume, choose
from ragexam.config import Settings
from ragexam.errors import RowError
from ragexam.io.csvfile import read_rows
from ragexam.io.fingerprint import input_hash
from ragexam.io.runfolder import RunFolder
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Prompt, load_prompt
from ragexam.options import Given
from ragexam.stages.batch import run_settings
from ragexam.stages.flags import Critique, cheap_flags, critic_flags, join_flags, normalise
from ragexam.stages.runner import Stage, StageResult, Task, execute
from ragexam.stages.session import Session
from ragexam.stages.setup import identity, store_ref
from ragexam.store.chroma import StoreRef, check_doc_key, iter_chunks, open_collection, release

QA_COLUMNS = (
    "chunk_id",
    "document",
    "question",
    "ground_truth_answer",
    "truncated",
    "chunk_chars",
    "split",
    "flags",
)


class QAPair(BaseModel):
    """What the exam writer must return for one chunk."""

    question: str = Field(min_length=1, description="A question that the chunk answers.")
    answer: str = Field(min_length=1, description="The correct, complete answer to it.")

    @field_validator("question", "answer")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()


def qa_id_for(chunk_id: str, index: int = 0) -> str:
    """A stable id for the index-th question written from a chunk."""
    return hashlib.blake2b(f"{chunk_id}\x1f{index}".encode(), digest_size=8).hexdigest()


def run_generate(settings: Settings, given: Given, session: Session) -> StageResult:
    """Write `qa_dataset.csv` in the run folder; checks inputs before any paid call."""
    settings.api_key()
    folder = RunFolder(given.out)
    store = store_ref(given, settings, session)
    collection = open_collection(store)
    folder.claim(identity(store, collection))
    sampling = sampling_of(given)
    check_resume(folder.path, folder.qa_dataset, sampling)
    check_doc_key(collection, given.exam.doc_key)
    plan = GeneratePlan(settings, given, store, collection, session)
    stage = Stage(
        "generate", folder.qa_dataset, "qa_id", QA_COLUMNS, plan.llm.model, plan.prompt.hash
    )
    how = run_settings(given, settings)
    outcome = execute(stage, plan, plan.manifest(settings), how, session)
    return StageResult(outcome, stage.path)


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
        self.llm = LLM(
            settings,
            settings.model_for("generate"),
            max_tokens=settings.max_tokens_for("generate"),
            memory=session.endpoints,
        )
        self.seen: set[str] = set()  # normalised questions written so far, for duplicates

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The first --limit chunks (of the sample, if any), less those already done."""
        path = RunFolder(self.out).qa_dataset
        if path.exists():  # the runner kept only the ok rows: their questions came earlier
            self.seen = {normalise(row["question"]) for row in read_rows(path, ["question"])}
        if self.sampling.active:
            return self._sampled(done)
        count = self.collection.count()
        wanted = min(count, self.limit or count)
        chunks = islice(iter_chunks(self.collection, self.doc_key), self.limit)
        left = max(wanted - len(done), 0)
        return left, _tasks(chunks, done, self.max_chunk_chars)

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
        return left, _tasks(chunks, done, self.max_chunk_chars, splits)

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every chunk this run wants: its text as sent, and its document."""
        if self.sampling.active:
            tasks = self._sampled(set())[1]
        else:
            chunks = islice(iter_chunks(self.collection, self.doc_key), self.limit)
            tasks = _tasks(chunks, set(), self.max_chunk_chars)
        return {task.key: task.known["input_hash"] for task in tasks}

    async def work(self, task: Task) -> dict[str, Any]:
        """Ask for a QAPair about the chunk."""
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
            "flags": join_flags(flags),
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
        """Nothing to check beyond what run_generate did."""

    async def aclose(self) -> None:
        """Close the model's connections and ragexam's client of the store."""
        await self.llm.aclose()
        release(self.store)

    def figures(self) -> dict[str, Any]:
        """Calls made, and the structured-output method that was used in the end."""
        return {
            "calls": self.llm.calls,
            "structured_output": self.llm.method.value,
            "tokens_billed": {"prompt": self.llm.tokens[0], "completion": self.llm.tokens[1]},
        }

    def manifest(self, settings: Settings) -> dict[str, Any]:
        """What the questions depend on."""
        return {
            "model": self.llm.model,
            "prompt": {"generate": self.prompt.hash}
            | ({"critic": self.critic.hash} if self.critic else {}),
            "store": self.store.describe(),
            "collection": self.collection.name,
            "settings": settings.public(),
            "options": {
                "limit": self.limit,
                "doc_key": self.doc_key,
                "max_chunk_chars": self.max_chunk_chars,
                "sampling": self.sampling.record(),
                "check": self.critic is not None,
            },
        }


def _tasks(
    chunks: Iterator[Any], done: set[str], max_chars: int, splits: dict[str, str] | None = None
) -> Iterator[Task]:
    for chunk in chunks:
        qa_id = qa_id_for(chunk.id)
        if qa_id in done:
            continue
        text = chunk.text[:max_chars]
        known = {
            "chunk_id": chunk.id,
            "document": chunk.document,
            "truncated": len(chunk.text) > max_chars,
            "chunk_chars": len(chunk.text),
            "split": (splits or {}).get(chunk.id),
            "input_hash": input_hash(text, chunk.document),
        }
        yield Task(qa_id, known, text)
