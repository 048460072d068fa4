"""The generate stage: one question and ground-truth answer per chunk of the collection."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ragexam.config import Settings
from ragexam.errors import RowError
from ragexam.llm import LLM
from ragexam.prompts import Prompt, load_prompt
from ragexam.runner import Progress, RunSettings, Stage, StageResult, Task, execute
from ragexam.store import StoreRef, iter_chunks, open_collection, release

QA_FILE = "qa_dataset.csv"
QA_COLUMNS = ("chunk_id", "document", "question", "ground_truth_answer", "truncated", "chunk_chars")


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


@dataclass(frozen=True)
class GenerateOptions:
    """What `ragexam generate` was asked to do."""

    store: StoreRef
    out: Path
    limit: int | None = None
    doc_key: str | None = None
    max_chunk_chars: int = 8000
    force: bool = False


def qa_id_for(chunk_id: str, index: int = 0) -> str:
    """A stable id for the index-th question written from a chunk."""
    return hashlib.blake2b(f"{chunk_id}\x1f{index}".encode(), digest_size=8).hexdigest()


def run_generate(
    settings: Settings, options: GenerateOptions, progress: Progress | None = None
) -> StageResult:
    """Write `qa_dataset.csv` in the run folder; checks inputs before any paid call."""
    settings.api_key()
    collection = open_collection(options.store)
    plan = GeneratePlan(settings, options, collection)
    options.out.mkdir(parents=True, exist_ok=True)
    stage = Stage(
        "generate", options.out / QA_FILE, "qa_id", QA_COLUMNS, plan.llm.model, plan.prompt.hash
    )
    how = RunSettings(options.out, settings.concurrency, options.force, settings.redact)
    outcome = execute(stage, plan, plan.manifest(settings), how, progress)
    return StageResult(outcome, stage.path)


class GeneratePlan:
    """One question and answer per chunk, through the generate prompt."""

    def __init__(self, settings: Settings, options: GenerateOptions, collection: Any) -> None:
        self.options, self.collection = options, collection
        self.prompt: Prompt = load_prompt("generate", settings.prompts_dir)
        self.llm = LLM(settings, settings.model_for("generate"))

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The first --limit chunks, less those already done."""
        count = self.collection.count()
        wanted = min(count, self.options.limit or count)
        chunks = islice(iter_chunks(self.collection, self.options.doc_key), self.options.limit)
        left = max(wanted - len(done), 0)
        return left, _tasks(chunks, done, self.options.max_chunk_chars)

    async def work(self, task: Task) -> dict[str, Any]:
        """Ask for a QAPair about the chunk."""
        text: str = task.payload
        if not text.strip():  # nothing to ask about: an error row, and no paid call
            raise RowError("the chunk is empty or whitespace only; nothing to ask about")
        values = self.prompt.fill(chunk=text, document=str(task.known["document"]))
        reply = await self.llm.structured(self.prompt.template.format_messages(**values), QAPair)
        return {
            "question": reply.value.question,
            "ground_truth_answer": reply.value.answer,
            **reply.cost(),
        }

    async def preflight(self) -> None:
        """Nothing to check beyond what run_generate did."""

    async def aclose(self) -> None:
        """Close the model's connections and ragexam's client of the store."""
        await self.llm.aclose()
        release(self.options.store)

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
            "prompt": {"generate": self.prompt.hash},
            "store": self.options.store.describe(),
            "collection": self.collection.name,
            "settings": settings.public(),
            "options": {
                "limit": self.options.limit,
                "doc_key": self.options.doc_key,
                "max_chunk_chars": self.options.max_chunk_chars,
            },
        }


def _tasks(chunks: Iterator[Any], done: set[str], max_chars: int) -> Iterator[Task]:
    for chunk in chunks:
        qa_id = qa_id_for(chunk.id)
        if qa_id in done:
            continue
        known = {
            "chunk_id": chunk.id,
            "document": chunk.document,
            "truncated": len(chunk.text) > max_chars,
            "chunk_chars": len(chunk.text),
        }
        yield Task(qa_id, known, chunk.text[:max_chars])
