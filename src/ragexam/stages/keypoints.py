"""Key points for an exam written without them (an older exam, or a user's own), written once.

When judge grades by key points and some questions have none, one call per such question
writes them from its question and ground truth into `key_points.csv` in the run folder (a
control run uses its run's). They are written once: a rerun skips the questions done, and
redoes one only when its question or ground truth changes. A person may edit them there; the
judge's fingerprint sees the edit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ragexam.analysis.keypoints import FEWEST, MOST, dump, source_hash, stripped
from ragexam.config import Scale, Settings
from ragexam.io.runfolder import RunFolder
from ragexam.llm.client import LLM
from ragexam.llm.prompts import Prompt, load_prompt
from ragexam.options import Given
from ragexam.stages.batch import run_settings
from ragexam.stages.exams import Exam, Exams, load_exams
from ragexam.stages.runner import Stage, StageResult, Task, execute
from ragexam.stages.session import Session

COLUMNS = ("document", "question", "ground_truth_answer", "key_points")


class KeyPoints(BaseModel):
    """What the writer must return for one ground truth."""

    key_points: list[str] = Field(
        min_length=FEWEST,
        max_length=MOST,
        description="The ground truth's atomic facts, each one short statement, in its language.",
    )

    @field_validator("key_points")
    @classmethod
    def _points(cls, points: list[str]) -> list[str]:
        return stripped(points)


def write_key_points(
    settings: Settings, given: Given, exams: Exams, session: Session
) -> tuple[Exams, StageResult | None]:
    """Write the missing key points, if the exam is graded by key points and lacks some; the
    exams again, with them."""
    lacking = {exam.qa_id: exam for exam in exams.lacking}
    if exams.scale is not Scale.key_points or not lacking:
        return exams, None
    settings.api_key()
    path = RunFolder(given.out).key_points
    plan = KeyPointsPlan(settings, list(lacking.values()), session)
    stage = Stage("key_points", path, "qa_id", COLUMNS, plan.llm.model, plan.prompt.hash)
    record = {"model": plan.llm.model, "prompt": {"key_points": plan.prompt.hash}}
    how = replace(run_settings(given, settings), out=path.parent)  # the batch road, if asked
    outcome = execute(stage, plan, {**record, "settings": settings.public()}, how, session)
    return load_exams(given), StageResult(outcome, path)


class KeyPointsPlan:
    """One call per question without key points: its question and ground truth in, the key
    points out."""

    def __init__(self, settings: Settings, exams: list[Exam], session: Session) -> None:
        self.exams = exams
        self.prompt: Prompt = load_prompt("key_points", settings.prompts_dir)
        self.llm = LLM(
            settings,
            settings.model_for("judge"),
            max_tokens=settings.max_tokens_for("generate"),
            memory=session.endpoints,
        )

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The questions whose key points are not written yet."""
        left = [exam for exam in self.exams if exam.qa_id not in done]
        return len(left), (self._task(exam) for exam in left)

    def _task(self, exam: Exam) -> Task:
        known = {
            "document": exam.document,
            "question": exam.question,
            "ground_truth_answer": exam.ground_truth,
            "input_hash": source_hash(exam.question, exam.ground_truth),
        }
        return Task(exam.qa_id, known, exam)

    def inputs(self) -> Mapping[str, str]:
        """The question and ground truth each set of key points is written from."""
        return {exam.qa_id: source_hash(exam.question, exam.ground_truth) for exam in self.exams}

    async def work(self, task: Task) -> dict[str, Any]:
        """Ask for the key points of one ground truth."""
        exam: Exam = task.payload
        values = self.prompt.fill(
            question=exam.question or "", ground_truth=exam.ground_truth or ""
        )
        messages = self.prompt.template.format_messages(**values)
        reply = await self.llm.structured(messages, KeyPoints)
        return {"key_points": dump(reply.value.key_points), **reply.cost()}

    async def preflight(self) -> None:
        """Nothing to check beyond what judge did."""

    async def aclose(self) -> None:
        """Close the model's connections."""
        await self.llm.aclose()

    def figures(self) -> dict[str, Any]:
        """Calls made, and the structured-output method that was used in the end."""
        return self.llm.figures()
