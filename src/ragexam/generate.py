"""The generate stage: one question and ground-truth answer per chunk of the collection."""

from __future__ import annotations

import asyncio
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
from ragexam.runner import (
    Outcome,
    Progress,
    Runner,
    Stage,
    Task,
    Work,
    run_closing,
    update_manifest,
)
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
) -> tuple[Outcome, Path]:
    """Write `qa_dataset.csv` in the run folder; checks inputs before any paid call."""
    settings.api_key()
    collection = open_collection(options.store)
    prompt = load_prompt("generate")
    llm = LLM(settings, settings.model_for("generate"))
    options.out.mkdir(parents=True, exist_ok=True)
    stage = Stage("generate", options.out / QA_FILE, "qa_id", QA_COLUMNS, llm.model, prompt.hash)
    runner = Runner(
        stage,
        concurrency=settings.concurrency,
        force=options.force,
        redact=settings.redact,
        progress=progress,
    )
    done = runner.resume()
    wanted = min(collection.count(), options.limit or collection.count())
    if progress is not None:
        progress.start(max(wanted - len(done), 0), len(done))
    chunks = islice(iter_chunks(collection, options.doc_key), options.limit)
    tasks = _tasks(chunks, done, options.max_chunk_chars)
    record = _manifest(settings, options, llm, prompt.hash, collection.name)
    update_manifest(options.out, "generate", {**record, "status": "running"})
    try:
        asyncio.run(run_closing(runner, tasks, _work(llm, prompt), llm))
    finally:
        release(options.store)
        record.update(status="finished", calls=llm.calls, structured_output=llm.method.value)
        update_manifest(options.out, "generate", {**record, **runner.outcome.record()})
    return runner.outcome, stage.path


def _work(llm: LLM, prompt: Prompt) -> Work:
    """One row: ask for a QAPair about the chunk."""

    async def work(task: Task) -> dict[str, Any]:
        text: str = task.payload
        if not text.strip():  # nothing to ask about: an error row, and no paid call
            raise RowError("the chunk is empty or whitespace only; nothing to ask about")
        values = prompt.fill(chunk=text, document=str(task.known["document"]))
        reply = await llm.structured(prompt.template.format_messages(**values), QAPair)
        return {
            "question": reply.value.question,
            "ground_truth_answer": reply.value.answer,
            **reply.cost(),
        }

    return work


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


def _manifest(
    settings: Settings, options: GenerateOptions, llm: LLM, prompt_hash: str, collection: str
) -> dict[str, Any]:
    return {
        "model": llm.model,
        "prompt": {"generate": prompt_hash},
        "store": options.store.describe(),
        "collection": collection,
        "settings": settings.public(),
        "options": {
            "limit": options.limit,
            "doc_key": options.doc_key,
            "max_chunk_chars": options.max_chunk_chars,
        },
    }
