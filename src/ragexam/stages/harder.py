"""Harder questions for generate: multi-hop ones that need two chunks, and unanswerable ones.

Candidates (candidates.py) are tried in order until `--multi-hop N` and `--unanswerable N` are
kept: each is written in one call, then verified (verify.py). A kept question is a row of
qa_dataset.csv; a dropped one goes to dropped_questions.csv with the reason and the checks, and
is not tried again. Never more candidates are in flight than could still be needed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage
from pydantic import Field

from ragexam.analysis.sampling import assign_splits
from ragexam.config import Settings
from ragexam.errors import AuthError, EndpointError, RagexamError
from ragexam.io.cells import MULTI_HOP, UNANSWERABLE
from ragexam.io.csvfile import read_columns
from ragexam.io.rowlog import RowLog
from ragexam.io.runfolder import RunFolder
from ragexam.llm.client import LLM
from ragexam.llm.prompts import Prompt, load_prompt
from ragexam.options import Given
from ragexam.rag.embedders import make_embedder
from ragexam.rag.retrieval import Retriever
from ragexam.stages.candidates import Candidate, draw_pairs, draw_unanswerable
from ragexam.stages.flags import Written, cheap_flags, join_flags, normalise
from ragexam.stages.quota import Asked, Quota
from ragexam.stages.runner import Task
from ragexam.stages.session import Session
from ragexam.stages.verify import NEAREST, Tally, Verdict, Verifier

DROPPED_COLUMNS = (
    "qa_id",
    "kind",
    "chunk_ids",
    "document",
    "link",
    "language",
    "question",
    "ground_truth_answer",
    "key_points",
    "reason",
    "verification",
    "calls",
    "prompt_tokens",
    "completion_tokens",
    "model",
    "input_hash",
)
FAILED = "failed"  # the reason of a candidate whose calls failed: tried again by the next run
LONG_ENOUGH = 10**9  # a harder question's chunks are not flagged short: it has two, or none


class KeyedQA(Written):
    """What the writer of a harder question returns."""

    language: str = Field("", description="The language the chunk is written in, e.g. English.")
    question: str = Field(min_length=1, description="The question.")
    answer: str = Field(min_length=1, description="Its correct, complete answer.")
    key_points: list[str] = Field(
        min_length=1,
        max_length=8,
        description="The answer's atomic facts, one short sentence each.",
    )


class Checks(NamedTuple):
    """A candidate's verification prompts: the answerer's, and the judge model's."""

    answerer: list[list[BaseMessage]]
    judge: list[list[BaseMessage]]


class Harder:
    """The multi-hop and unanswerable candidates of a generate run: tasks, work and records."""

    def __init__(
        self,
        llm: LLM,
        prompts: Mapping[str, Prompt],
        verifier: Verifier,
        asked: list[Asked],
        dropped: RowLog,
        max_chars: int,
    ) -> None:
        self.llm, self.prompts, self.verifier = llm, prompts, verifier
        self.asked = {item.kind: item for item in asked}
        self.dropped, self.max_chars = dropped, max_chars
        self.calls = dict.fromkeys(self.asked, 0)
        # Dropped by an earlier run (qa_id -> input_hash): not tried again while current.
        self.finished = {
            row["qa_id"]: row["input_hash"]
            for row in dropped.load()
            if not str(row.get("reason", "")).startswith(FAILED)
        }

    def salt(self, kind: str) -> tuple[str, ...]:
        """What a question of this kind is made with beside its chunks: prompts and models."""
        return (self.prompts[kind].hash, self.llm.model, *self.verifier.fingerprint(kind))

    def inputs(self) -> dict[str, str]:
        """The input hash of every candidate."""
        return {
            candidate.key: candidate.input_hash(self.salt(kind))
            for kind, item in self.asked.items()
            for candidate in item.candidates
        }

    def splits(self, fraction: float | None, seed: int) -> dict[str, str]:
        """Each candidate's split, per document, when the exam is split (`--validation F`)."""
        if not fraction:
            return {}
        keys = [
            (candidate.key, candidate.chunks[0].document)
            for item in self.asked.values()
            for candidate in item.candidates
        ]
        return assign_splits(keys, fraction, seed)

    def start(self, kept: Mapping[str, int]) -> int:
        """Set each kind's quota from those kept before; how many more are wanted."""
        for kind, item in self.asked.items():
            item.kept_before = kept.get(kind, 0)
            item.quota = Quota(max(item.asked - item.kept_before, 0))
        return sum(item.quota.wanted for item in self.asked.values())

    async def tasks(self, done: set[str], splits: Mapping[str, str]) -> AsyncIterator[Task]:
        """Each kind's candidates not yet tried, while its quota wants more."""
        for kind, item in self.asked.items():
            salt = self.salt(kind)
            for candidate in item.candidates:
                fingerprint = candidate.input_hash(salt)
                if candidate.key in done or self.finished.get(candidate.key) == fingerprint:
                    continue
                if not await item.quota.admit():
                    break
                known = candidate.known(self.max_chars, salt)
                yield Task(candidate.key, known | {"split": splits.get(candidate.key)}, candidate)

    async def work(self, task: Task, seen: set[str]) -> dict[str, Any] | None:
        """Write the question, verify it: its row if kept, None if dropped or failed (both
        recorded in dropped_questions.csv; a failed one is tried again by the next run)."""
        candidate: Candidate = task.payload
        quota, tally, started = self.asked[candidate.kind].quota, Tally(), time.monotonic()
        written, verdict, reason = None, None, ""
        try:
            written = await self._write(candidate, tally)
            verdict = await self._verify(candidate, written, tally)
            reason = verdict.reason
        except (AuthError, EndpointError):
            raise  # every candidate would fail so: the runner stops the stage
        except RagexamError as exc:
            reason = f"{FAILED}: {' '.join(str(exc).split())[:300]}"
        finally:
            self.calls[candidate.kind] += tally.calls
            await quota.settle(verdict is not None and verdict.kept, reason.split(":")[0])
        row = self._row(task, written, verdict, tally, time.monotonic() - started)
        if verdict is not None and verdict.kept and written is not None:
            flags = cheap_flags(written.question, written.answer, LONG_ENOUGH, seen)
            seen.add(normalise(written.question))
            return row | {"flags": join_flags(flags)}
        self.dropped.append({**task.known, **row, "reason": reason, "model": self.llm.model})
        return None

    async def _write(self, candidate: Candidate, tally: Tally) -> KeyedQA:
        """One call to the writer of the candidate's kind."""
        reply = await self.llm.structured(self.messages(candidate), KeyedQA)
        tally.add(reply)
        return reply.value

    def messages(self, candidate: Candidate) -> list[BaseMessage]:
        """The writer's prompt for a candidate."""
        prompt = self.prompts[candidate.kind]
        texts = [chunk.text[: self.max_chars] for chunk in candidate.chunks]
        if candidate.kind == MULTI_HOP:
            first, second = candidate.chunks
            values = prompt.fill(
                first_chunk=texts[0],
                first_document=first.document,
                second_chunk=texts[1],
                second_document=second.document,
            )
        else:
            values = prompt.fill(chunk=texts[0], document=candidate.chunks[0].document)
        return prompt.template.format_messages(**values)

    def checks(self, candidate: Candidate, filler: str) -> Checks:
        """The verification prompts of a candidate whose question, answer and key point are
        `filler`, and whose checks all run (none fails early), by the model that reads them:
        for the dry run's estimate."""
        texts = [chunk.text[: self.max_chars] for chunk in candidate.chunks]
        if (
            candidate.kind != MULTI_HOP
        ):  # the nearest chunks: as many as retrieved, each the seed's size
            return Checks([], [self.verifier.reading(filler, texts * NEAREST)])
        written = KeyedQA(question=filler, answer=filler, key_points=[filler])
        asked = [
            self.verifier.prompts(written, context, filler)
            for context in (texts, texts[:1], texts[1:])
        ]
        return Checks([answer for answer, _ in asked], [judge for _, judge in asked])

    async def _verify(self, candidate: Candidate, written: KeyedQA, tally: Tally) -> Verdict:
        if candidate.kind == MULTI_HOP:
            first, second = (chunk.text[: self.max_chars] for chunk in candidate.chunks)
            return await self.verifier.pair(written, (first, second), tally)
        return await self.verifier.unanswerable(written, tally)

    def _row(
        self,
        task: Task,
        written: KeyedQA | None,
        verdict: Verdict | None,
        tally: Tally,
        seconds: float,
    ) -> dict[str, Any]:
        candidate: Candidate = task.payload
        done = verdict.checks if verdict is not None else ()
        checks: dict[str, Any] = {"checks": [check.record() for check in done]}
        if candidate.kind == UNANSWERABLE:
            checks["seed"] = candidate.chunks[0].id
        return {
            "question": written.question if written else None,
            "ground_truth_answer": written.answer if written else None,
            "key_points": json.dumps(written.key_points, ensure_ascii=False) if written else None,
            "language": written.language if written else None,
            "verification": json.dumps(checks, ensure_ascii=False),
            "calls": tally.calls,
            "prompt_tokens": tally.tokens[0],
            "completion_tokens": tally.tokens[1],
            "attempts": tally.calls,
            "latency_s": round(seconds, 3),
        }

    def figures(self) -> dict[str, Any]:
        """Per kind asked: asked, kept, tried, dropped and why, calls; the verifier's models."""
        kinds = {kind: item.record(self.calls[kind]) for kind, item in self.asked.items()}
        return {"harder": kinds, "verification": self.verifier.figures()}

    def notes(self) -> list[str]:
        """A line per kind asked, for the terminal."""
        return [item.note(self.calls[kind]) for kind, item in self.asked.items()]

    def prompt_hashes(self) -> dict[str, str]:
        """The prompts the harder questions are written and verified with, for the manifest."""
        written = {self.prompts[kind].name: self.prompts[kind].hash for kind in self.asked}
        return written | self.verifier.prompt_hashes()

    async def preflight(self) -> None:
        """Before any paid call: the embedding that verifies unanswerable questions is the
        store's (each candidate's question is written, and paid for, before it is checked)."""
        if self.verifier.retriever is not None:
            await self.verifier.retriever.check_agreement()

    async def aclose(self) -> None:
        """Close the verifier's models and the record of dropped questions."""
        try:
            await self.verifier.aclose()
        finally:
            self.dropped.close()


def harder_held(given: Given) -> tuple[Counter[str], dict[str, str]]:
    """The harder questions the options ask for that the run folder's exam still lacks, by
    kind, and the kind of each it holds, by qa_id."""
    asked = Counter(
        {MULTI_HOP: given.exam.multi_hop or 0, UNANSWERABLE: given.exam.unanswerable or 0}
    )
    path, held = RunFolder(given.out).qa_dataset, {}
    if path.is_file():
        rows = read_columns(path, ["qa_id"], optional=("kind",))
        pairs = zip(rows["qa_id"], rows.get("kind", ()), strict=False)
        held = {qa_id: kind for qa_id, kind in pairs if kind in asked}
    asked.subtract(Counter(held.values()))
    return +asked, held  # only the kinds still lacking some


def harder_for(
    settings: Settings, given: Given, collection: Any, session: Session, llm: LLM
) -> Harder | None:
    """The harder questions the options ask for, their candidates drawn; None for none."""
    exam, seed, doc_key = given.exam, given.folder.seed, given.exam.doc_key
    if not (exam.multi_hop or exam.unanswerable):
        return None
    retriever = None
    if exam.unanswerable:  # its verification retrieves: the embedding is checked before a call
        trust = given.store.trust_store_endpoint
        embedder = make_embedder(settings.embedding, collection, settings, trust)
        retriever = Retriever(collection, embedder, NEAREST)
    asked, prompts = [], {}
    if exam.multi_hop:
        prompts[MULTI_HOP] = load_prompt("generate_multi_hop", settings.prompts_dir)
        pairs = draw_pairs(collection, doc_key, exam.multi_hop, seed)
        asked.append(Asked(MULTI_HOP, exam.multi_hop, pairs))
    if exam.unanswerable:
        prompts[UNANSWERABLE] = load_prompt("generate_unanswerable", settings.prompts_dir)
        seeds = draw_unanswerable(collection, doc_key, exam.unanswerable, seed)
        asked.append(Asked(UNANSWERABLE, exam.unanswerable, seeds))
    verifier = Verifier(settings, session, retriever)
    dropped = RowLog(RunFolder(given.out).dropped, DROPPED_COLUMNS)
    return Harder(llm, prompts, verifier, asked, dropped, given.store.max_chunk_chars)
