"""How one answer is graded: a Grader per scale, each giving validated samples.

A grade comes only from a reply that validated against the schema, bounds included: a value
out of range is re-asked, never clamped. The unit and ten scales ask for two numbers (kept for
comparison with older runs); the key-points scale (marking.py) asks for verdicts and counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from ragexam.config import Scale
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Call, Delimited, Prompt, load_prompt
from ragexam.stages.exams import Exam

REASONING = "Briefly: the ground truth's facts found or missing, and the answer's extra statements."


class UnitGrade(BaseModel):
    """Grades on the unit scale."""

    reasoning: str = Field(description=REASONING)
    completeness: float = Field(ge=0, le=1, description="Share of the ground truth present.")
    conciseness: float = Field(ge=0, le=1, description="Share of the answer that is useful.")


class TenGrade(BaseModel):
    """Grades on the ten-point scale."""

    reasoning: str = Field(description=REASONING)
    completeness: int = Field(ge=0, le=10, description="Share of the ground truth present, 0-10.")
    conciseness: int = Field(ge=0, le=10, description="Share of the answer that is useful, 0-10.")


SCALES: dict[Scale, tuple[type[UnitGrade] | type[TenGrade], float, str]] = {
    Scale.unit: (
        UnitGrade,
        1.0,
        "Give each grade as a decimal number from 0 to 1, such as 0.5 when half of it is there.",
    ),
    Scale.ten: (
        TenGrade,
        10.0,
        "Give each grade as a whole number from 0 to 10, such as 5 when half of it is there.",
    ),
}


@dataclass(frozen=True)
class Sample:
    """One validated grade of an answer, and the replies it took (a re-ask included)."""

    completeness: float
    conciseness: float
    reasoning: str
    replies: tuple[Reply[Any], ...]
    marks: Any = None  # the key-points grader's verdicts

    def cost(self) -> dict[str, Any]:
        """Tokens, HTTP calls and seconds of its replies."""
        return {
            "prompt_tokens": sum(reply.prompt_tokens for reply in self.replies),
            "completion_tokens": sum(reply.completion_tokens for reply in self.replies),
            "attempts": sum(reply.attempts for reply in self.replies),
            "latency_s": sum(reply.latency for reply in self.replies),
        }


class Grader(Protocol):
    """Grades one answer on one scale."""

    prompt: Prompt

    def input_hash(self, exam: Exam) -> str:
        """What the grade is made from: a changed input redoes the row."""
        ...

    def check(self, exam: Exam) -> None:
        """Raise RowError when the exam cannot be graded on this scale (before any call)."""
        ...

    def opening(self, exam: Exam) -> Call:
        """The first call that grades the answer: its prompt, values and schema."""
        ...

    def messages(self, exam: Exam) -> list[BaseMessage]:
        """The prompt that grades the answer."""
        ...

    async def sample(self, llm: LLM, exam: Exam) -> Sample:
        """One validated grade; LLMError when the reply never validated."""
        ...

    def settled(self, exam: Exam, reply: Reply[Any]) -> Sample | None:
        """The grade when the opening call's valid reply is all it takes; None: more calls."""
        ...

    def columns(self, samples: Sequence[Sample], exam: Exam) -> dict[str, Any]:
        """The scale's own columns of the row, from its valid samples."""
        ...


class ScaleGrader:
    """Grades as two numbers on the unit or ten scale, as before key points."""

    def __init__(self, scale: Scale, prompts: Path | None) -> None:
        self.schema, self.divisor, note = SCALES[scale]
        self.note = Delimited(note)
        self.prompt = load_prompt("judge", prompts)

    def input_hash(self, exam: Exam) -> str:
        """The question, ground truth and answer."""
        return exam.input_hash

    def check(self, exam: Exam) -> None:
        """Any answer with a question can be graded."""

    def opening(self, exam: Exam) -> Call:
        """The judge prompt, with the scale's note: the one call of a grade."""
        values = {
            "question": exam.question or "",
            "ground_truth": exam.ground_truth or "",
            "answer": exam.answer,
            "scale": self.note,
        }
        return Call(self.prompt, values, self.schema)

    def messages(self, exam: Exam) -> list[BaseMessage]:
        """The judge prompt, with the scale's note."""
        return self.opening(exam).messages()

    async def sample(self, llm: LLM, exam: Exam) -> Sample:
        """The two numbers, stored in [0, 1]."""
        return self.settled(exam, await llm.structured(self.messages(exam), self.schema))

    def settled(self, exam: Exam, reply: Reply[Any]) -> Sample:
        """A valid reply is the grade."""
        return Sample(*self.grades(reply.value), (reply,))

    def grades(self, grade: UnitGrade | TenGrade) -> tuple[float, float, str]:
        """A valid reply's completeness and conciseness in [0, 1], and its reasoning."""
        divisor = self.divisor
        return grade.completeness / divisor, grade.conciseness / divisor, grade.reasoning

    def columns(self, samples: Sequence[Sample], exam: Exam) -> dict[str, Any]:
        """The first sample's reasoning."""
        return {"reasoning": samples[0].reasoning}


def merged(samples: Sequence[Sample]) -> dict[str, Any]:
    """The columns every scale shares: means and spreads of the samples, and their cost."""
    if len(samples) == 1:  # the common case, at a million rows: the same values, 4 µs sooner
        cost = samples[0].cost()
        return {
            "completeness": float(samples[0].completeness),
            "conciseness": float(samples[0].conciseness),
            "completeness_std": None,
            "conciseness_std": None,
            "samples_valid": 1,
            **cost,
            "latency_s": round(cost["latency_s"], 3),
        }
    completeness = [sample.completeness for sample in samples]
    conciseness = [sample.conciseness for sample in samples]
    costs = [sample.cost() for sample in samples]
    return {
        "completeness": statistics.fmean(completeness),
        "conciseness": statistics.fmean(conciseness),
        "completeness_std": _std(completeness),
        "conciseness_std": _std(conciseness),
        "samples_valid": len(samples),
        **{name: sum(cost[name] for cost in costs) for name in costs[0]},
        "latency_s": round(sum(cost["latency_s"] for cost in costs), 3),
    }


def _std(values: list[float]) -> float | None:
    """Sample standard deviation; none for a single value."""
    return statistics.stdev(values) if len(values) > 1 else None
