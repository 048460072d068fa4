"""Grading by key points: a verdict per key point and per statement of the answer, then counts.

One call per answer. A reply whose verdict list is not as long as the key points, or whose
evidence is not the answer's own words, gets one re-ask saying why; a second such reply makes
the sample fail (an error row when no sample of the row validated), never a made-up number.
With --with-context the judge also sees the retrieved chunks and says, for each key point,
whether they state it: a missed point they held was lost in generation, one they did not hold
was lost in retrieval.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from ragexam.analysis.keypoints import (
    CREDIT,
    BadKeyPoints,
    completeness,
    conciseness,
    held_for_losses,
    marked_hash,
    parse_key_points,
)
from ragexam.errors import LLMError, OutputError, RowError
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Call, Delimited, context_block, load_prompt, neutralise
from ragexam.llm.structured import reask
from ragexam.stages.exams import Exam
from ragexam.stages.grading import Sample

CONTEXT_RULE = (
    "\n- in_context: for every key point, whether the chunks inside <context>, which the "
    "answer was written from, state it."
)


class PointMark(BaseModel):
    """The verdict on one key point."""

    point: str = Field(description="The key point, in a few words.")
    verdict: Literal["present", "partial", "absent"]
    evidence: str = Field(
        description="Present or partial: the answer's words that state it, copied exactly. "
        "Absent: empty."
    )


class PointMarkInContext(PointMark):
    """The verdict on one key point, and whether the retrieved chunks state it."""

    in_context: bool = Field(description="Whether the chunks in <context> state this key point.")


class StatementMark(BaseModel):
    """The verdict on one statement of the answer."""

    statement: str = Field(description="The statement, briefly.")
    verdict: Literal["supported", "unsupported", "contradicted"]


class Marks(BaseModel):
    """A verdict per key point, in order, and per statement of the answer."""

    key_points: list[PointMark]
    answer_statements: list[StatementMark]


class MarksInContext(BaseModel):
    """Marks, each key point also read against the retrieved chunks."""

    key_points: list[PointMarkInContext]
    answer_statements: list[StatementMark]


class KeyPointGrader:
    """Grades by key points, optionally against the retrieved chunks too."""

    def __init__(self, prompts: Path | None, with_context: bool) -> None:
        self.prompt = load_prompt("judge_key_points", prompts)
        self.with_context = with_context
        self.schema: type[Marks] | type[MarksInContext] = MarksInContext if with_context else Marks

    def input_hash(self, exam: Exam) -> str:
        """The texts, the key points, and with --with-context the retrieved chunks."""
        context = (exam.context or "") if self.with_context else None
        return marked_hash(exam.question, exam.ground_truth, exam.answer, exam.key_points, context)

    def check(self, exam: Exam) -> None:
        """Key points to grade by, and with --with-context the chunks, or an error row."""
        self._points(exam)
        if self.with_context:
            self._chunks(exam)

    def messages(self, exam: Exam) -> list[BaseMessage]:
        """The marking prompt: the question, ground truth, numbered key points and answer."""
        return self.opening(exam).messages()

    def opening(self, exam: Exam) -> Call:
        """The marking call: the question, ground truth, numbered key points and answer."""
        points = self._points(exam)
        listed = "\n".join(f"{n}. {neutralise(point)}" for n, point in enumerate(points, 1))
        context = ""
        if self.with_context:
            context = f"\n<context>\n{context_block(self._chunks(exam))}\n</context>\n"
        values = {
            "question": exam.question or "",
            "ground_truth": exam.ground_truth or "",
            "key_points": Delimited(listed),
            "answer": exam.answer,
            "context": Delimited(context),
            "context_rule": Delimited(CONTEXT_RULE if self.with_context else ""),
        }
        return Call(self.prompt, values, self.schema)

    async def sample(self, llm: LLM, exam: Exam) -> Sample:
        """One call, and one re-ask if its verdicts do not fit the key points or the answer."""
        messages, points = self.messages(exam), len(self._points(exam))
        replies: list[Reply[Any]] = [await llm.structured(messages, self.schema)]
        problem = misfit(replies[0].value, points, exam.answer)
        if problem is not None:
            again = reask(messages, OutputError(problem))
            replies.append(await llm.structured(again, self.schema))
            problem = misfit(replies[-1].value, points, exam.answer)
        if problem is not None:
            raise _failed(problem, replies)
        return self._sample(replies)

    def settled(self, exam: Exam, reply: Reply[Any]) -> Sample | None:
        """The grade when the first reply's verdicts fit; None: it is asked again."""
        if misfit(reply.value, len(self._points(exam)), exam.answer) is not None:
            return None
        return self._sample([reply])

    def _sample(self, replies: list[Reply[Any]]) -> Sample:
        marks = replies[-1].value
        verdicts = [mark.verdict for mark in marks.key_points]
        statements = [mark.verdict for mark in marks.answer_statements]
        reading = _reading(verdicts, statements)
        return Sample(
            completeness(verdicts), conciseness(statements), reading, tuple(replies), marks
        )

    def columns(self, samples: Sequence[Sample], exam: Exam) -> dict[str, Any]:
        """Verdicts (the samples' majority), evidence, statements and the samples' verdicts."""
        marks = [sample.marks for sample in samples]
        majority = majority_verdicts([[m.verdict for m in mark.key_points] for mark in marks])
        chosen = [  # each point's evidence from the first sample that gave the majority verdict
            next(mark.key_points[n] for mark in marks if mark.key_points[n].verdict == verdict)
            for n, verdict in enumerate(majority)
        ]
        statements = [
            {"statement": m.statement, "verdict": m.verdict} for m in marks[0].answer_statements
        ]
        columns: dict[str, Any] = {
            "reasoning": samples[0].reasoning,
            "key_point_verdicts": _json(majority),
            "key_point_evidence": _json([mark.evidence for mark in chosen]),
            "answer_statements": _json(statements),
        }
        if self.with_context:
            held = [mark.in_context for mark in chosen]
            columns["key_point_context"] = _json(held)  # the judge's reading, as it read it
            columns.update(losses(majority, held_for_losses(held, exam.kind)))
        if len(samples) > 1:
            columns["key_point_samples"] = _json(
                [[m.verdict for m in mark.key_points] for mark in marks]
            )
        return columns

    def _points(self, exam: Exam) -> list[str]:
        try:
            points = parse_key_points(exam.key_points)
        except BadKeyPoints as exc:
            raise RowError(f"{exc}; mend the cell of qa_id {exam.qa_id} and rerun judge") from None
        if points is None:
            raise RowError("the exam has no key points for this question")
        return points

    def _chunks(self, exam: Exam) -> list[str]:
        try:
            texts = json.loads(exam.context or "")
        except ValueError:
            texts = None
        if not isinstance(texts, list):
            raise RowError(
                "answers.csv records no retrieved_texts for this answer: answer with --texts "
                "(the default) to judge --with-context"
            )
        return [str(text or "") for text in texts]


def misfit(marks: Marks | MarksInContext, points: int, answer: str) -> str | None:
    """Why the verdicts do not fit: a list of another length, or evidence not in the answer."""
    given = len(marks.key_points)
    if given != points:
        return (
            f"key_points holds {given} verdicts for the {points} key points: give exactly one "
            "per key point, in the order given"
        )
    for number, mark in enumerate(marks.key_points, 1):
        if mark.verdict != "absent" and not quoted(mark.evidence, answer):
            return (
                f"the evidence for key point {number} ({mark.evidence[:80]!r}) is not in the "
                "answer: copy the answer's own words, or mark the point absent"
            )
    return None


_GAP = re.compile(r"\.\.\.|\u2026")  # a quotation that leaves words out
_WORD = re.compile(r"\w+")


def quoted(evidence: str, answer: str) -> bool:
    """Whether evidence is the answer's own words: each part between ellipses found in it as
    a run of whole words, whatever the case, spacing, punctuation and quotation marks."""
    parts = [_words(part) for part in _GAP.split(evidence)]
    parts = [part for part in parts if part]
    shown = {f" {_words(answer)} ", f" {_words(neutralise(answer))} "}  # as the judge saw it
    return bool(parts) and all(any(f" {part} " in text for text in shown) for part in parts)


def _words(text: str) -> str:
    return " ".join(_WORD.findall(text.casefold()))


def majority_verdicts(samples: Sequence[Sequence[str]]) -> list[str]:
    """Each key point's most frequent verdict over the samples; a tie goes to the lower credit."""
    columns = zip(*samples, strict=True)
    return [
        max(Counter(column).items(), key=lambda item: (item[1], -CREDIT[item[0]]))[0]
        for column in columns
    ]


def losses(verdicts: Sequence[str], held: Sequence[bool]) -> dict[str, float]:
    """Key points lost (a partial one half): in generation when the retrieved chunks held
    them, in retrieval when they did not."""
    lost = [1 - CREDIT[verdict] for verdict in verdicts]
    return {
        "lost_in_generation": float(sum(p for p, was in zip(lost, held, strict=True) if was)),
        "lost_in_retrieval": float(sum(p for p, was in zip(lost, held, strict=True) if not was)),
    }


def _reading(verdicts: Sequence[str], statements: Sequence[str]) -> str:
    """The verdicts in words, for the reasoning column."""
    counts, said = Counter(verdicts), Counter(statements)
    points = ", ".join(f"{counts[v]} {v}" for v in ("present", "partial", "absent") if counts[v])
    states = ", ".join(
        f"{said[v]} {v}" for v in ("supported", "unsupported", "contradicted") if said[v]
    )
    return f"key points: {points}; statements: {states or 'none'}"


def _failed(problem: str, replies: Sequence[Reply[Any]]) -> LLMError:
    """A sample whose re-ask did not mend it: its reason, the last reply, what both cost."""
    tokens = (sum(r.prompt_tokens for r in replies), sum(r.completion_tokens for r in replies))
    attempts = sum(reply.attempts for reply in replies)
    return LLMError(
        f"{problem} (after a re-ask)", attempts=attempts, raw=replies[-1].raw, tokens=tokens
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
