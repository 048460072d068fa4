"""The judge stage: grade each answer against its ground truth on completeness and conciseness.

A grade comes only from a reply that validated against the schema, bounds included: a value
out of range is re-asked, never clamped, and a row whose every sample failed is an `error`
row with the reason and the raw reply, never a default score.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from ragexam.analysis.controls import (
    CONTROL_COLUMNS,
    KINDS,
    Control,
    Source,
    build_controls,
    keep_planned,
)
from ragexam.config import Scale, Settings, StructuredMethod
from ragexam.errors import LLMError, RowError
from ragexam.io.csvfile import read_columns
from ragexam.io.fingerprint import input_hash
from ragexam.io.manifest import read_manifest
from ragexam.io.runfolder import RunFolder
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Delimited, Prompt, load_prompt
from ragexam.options import Given
from ragexam.stages.batch import run_settings
from ragexam.stages.runner import (
    Outcome,
    Stage,
    StageResult,
    Task,
    execute,
)
from ragexam.stages.session import Session

JUDGE_COLUMNS = (
    "completeness",
    "conciseness",
    "completeness_std",
    "conciseness_std",
    "samples",
    "samples_valid",
    "scale",
    "temperature",
    "reasoning",
    "sample_error",
)
ADDED = frozenset({"temperature"})  # recorded since 0.2: an older row's empty cell is no change
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


class Exam(NamedTuple):
    """One answered question: what the judge is shown.

    A tuple of strings, which the cycle collector stops tracking: a 100,000-row exam as frozen
    dataclasses made its first full pass after reading cost 0.06-0.13 s more.
    """

    qa_id: str
    question: str | None
    ground_truth: str | None
    answer: str
    document: str = ""

    @property
    def input_hash(self) -> str:
        """What a grade is made from: the question, its ground truth and the answer."""
        return input_hash(self.question, self.ground_truth, self.answer)


def read_exams(qa_path: Path, answers_path: Path) -> tuple[list[Exam], int]:
    """Answered questions joined on qa_id, and the count of error answers skipped."""
    return _joined_files(qa_path, answers_path)


def _joined_files(qa_path: Path, answers_path: Path) -> tuple[list[Exam], int]:
    qa = read_columns(
        qa_path,
        ("qa_id", "question", "ground_truth_answer"),
        key="qa_id",
        filled=("question", "ground_truth_answer"),
    )
    answers = read_columns(answers_path, ("qa_id", "answer", "status"), key="qa_id")
    ok = [i for i, status in enumerate(answers["status"]) if status == "ok"]
    exams = _joined(qa, [answers["qa_id"][i] for i in ok], [answers["answer"][i] for i in ok])
    return exams, len(answers["status"]) - len(ok)


def _joined(qa: Mapping[str, Sequence[str]], ids: list[str], replies: list[str]) -> list[Exam]:
    """The exam of each answer, by its qa_id's row of the qa dataset: without an ok one, the
    question and ground truth are None (and the document empty without a row)."""
    size = len(qa["qa_id"])
    usable = [status in ("ok", "") for status in qa.get("status", ())] + [False]
    questions: list[str | None] = [*qa["question"], None]  # a last row for ids without one
    truths: list[str | None] = [*qa["ground_truth_answer"], None]
    if not all(usable[:-1]):
        questions = [text if ok else None for text, ok in zip(questions, usable, strict=True)]
        truths = [text if ok else None for text, ok in zip(truths, usable, strict=True)]
    documents = [*qa.get("document", [""] * size), ""]
    where = dict(zip(qa["qa_id"], range(size), strict=True))
    rows = [where.get(qa_id, size) for qa_id in ids]
    question, truth = map(questions.__getitem__, rows), map(truths.__getitem__, rows)
    return list(map(Exam, ids, question, truth, replies, map(documents.__getitem__, rows)))


def run_judge(settings: Settings, given: Given, session: Session) -> StageResult:
    """Write `judgments.csv`; inputs and key are checked before the first paid call."""
    exams, skipped = read_exams(*inputs(given))
    settings.api_key()
    given.out.mkdir(parents=True, exist_ok=True)
    plan = JudgePlan(settings, given, exams[: given.calls.limit], session)
    stage = plan.stage("judge", RunFolder(given.out).judgments, "qa_id", JUDGE_COLUMNS)
    outcome = _execute(settings, given, plan, stage, {"skipped": skipped}, session)
    return StageResult(outcome, stage.path, skipped)


def run_controls(settings: Settings, given: Given, session: Session) -> StageResult:
    """Write `judge_controls.csv`: known answers to `--controls` of the exam's questions."""
    exams, _ = read_exams(*inputs(given))
    sources = [
        Source(exam.qa_id, exam.document, exam.question, exam.ground_truth)
        for exam in exams[: given.calls.limit]
        if exam.question is not None and exam.ground_truth is not None
    ]
    count, seed = given.grading.controls, given.folder.seed
    controls = build_controls(sources, count, seed)
    settings.api_key()
    plan = ControlPlan(_exam_method(settings, given.out), given, controls, session)
    columns = (*CONTROL_COLUMNS, *JUDGE_COLUMNS)
    stage = plan.stage("judge_controls", RunFolder(given.out).controls, "control_id", columns)
    keep_planned(stage.path, stage.all_columns(), controls)
    record = {"controls": count, "seed": seed, "rows": len(controls)}
    outcome = _execute(settings, given, plan, stage, record, session)
    return StageResult(outcome, stage.path)


def _exam_method(settings: Settings, out: Path) -> Settings:
    """Settings whose structured-output method is the one the exam's run settled on.

    The exam already found what the endpoint accepts; the controls start there, not probe again.
    """
    method = read_manifest(out).get("stages", {}).get("judge", {}).get("structured_output")
    if method not in set(StructuredMethod):
        return settings
    return settings.model_copy(update={"structured_output": StructuredMethod(method)})


INPUTS = ("qa_dataset", "answers")  # the manifest's names for the files judge reads


def inputs(given: Given) -> tuple[Path, Path]:
    """The exam (given, in the run folder, or where `answer` recorded it) and the answers."""
    folder = RunFolder(given.out)
    return given.inputs.qa_dataset or folder.exam(), given.inputs.answers or folder.answers


def _execute(
    settings: Settings,
    given: Given,
    plan: JudgePlan,
    stage: Stage,
    extra: dict[str, Any],
    session: Session,
) -> Outcome:
    """Run the plan's rows into the stage's file, with the judge's manifest record."""
    record = {
        "model": plan.llm.model,
        "prompt": {"judge": plan.prompt.hash},
        "scale": given.grading.scale.value,
        "samples": given.grading.samples,
        "temperature": plan.temperature,
        **extra,
        "settings": settings.public(),
        **{name: str(path.resolve()) for name, path in zip(INPUTS, inputs(given), strict=True)},
    }
    how = run_settings(given, settings)
    return execute(stage, plan, record, how, session)


class JudgePlan:
    """Grade every answered question, `samples` times each."""

    def __init__(
        self, settings: Settings, given: Given, exams: list[Exam], session: Session
    ) -> None:
        self.exams, grading = exams, given.grading
        self.samples, self.scale = grading.samples, grading.scale
        self.schema, self.divisor, self.scale_note = SCALES[grading.scale]
        default = 0.0 if grading.samples == 1 else 0.7  # several samples need some variety
        self.temperature = default if grading.temperature is None else grading.temperature
        self.prompt: Prompt = load_prompt("judge", settings.prompts_dir)
        self.llm = LLM(
            settings,
            settings.model_for("judge"),
            temperature=self.temperature,
            max_tokens=settings.max_tokens_for("judge"),
            memory=session.endpoints,
        )

    def stage(self, name: str, path: Path, key: str, columns: tuple[str, ...]) -> Stage:
        """The output this plan writes, fingerprinted by its model, prompt and grading."""
        fixed = {
            "scale": self.scale.value,
            "samples": self.samples,
            "temperature": self.temperature,
        }
        model, prompt = self.llm.model, self.prompt.hash
        return Stage(name, path, key, columns, model, prompt, fixed, added=ADDED)

    def known(self) -> dict[str, Any]:
        """The columns every row of this plan has before its call."""
        known: dict[str, Any] = {"samples": self.samples, "scale": self.scale.value}
        return {**known, "temperature": self.temperature}

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The answers not yet judged."""
        left = [exam for exam in self.exams if exam.qa_id not in done]
        tasks = (Task(e.qa_id, {**self.known(), "input_hash": e.input_hash}, e) for e in left)
        return len(left), tasks

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every answer this run wants graded."""
        return {exam.qa_id: exam.input_hash for exam in self.exams}

    async def work(self, task: Task) -> dict[str, Any]:
        """Ask for the grades `samples` times; the row is ok if one sample validated."""
        exam: Exam = task.payload
        if exam.question is None or exam.ground_truth is None:
            raise RowError("no ok question with this qa_id in the qa dataset: nothing to grade by")
        messages = self.messages(exam)
        replies: list[Reply[Any]] = []
        failure: LLMError | None = None
        spent = [0, 0, 0]  # prompt and completion tokens, and attempts, of the failed samples
        for _ in range(self.samples):
            try:
                replies.append(await self.llm.structured(messages, self.schema))
            except LLMError as exc:
                failure = exc
                spent = [
                    spent[0] + exc.tokens[0],
                    spent[1] + exc.tokens[1],
                    spent[2] + exc.attempts,
                ]
        if not replies:
            assert failure is not None
            failure.tokens, failure.attempts = (spent[0], spent[1]), spent[2]  # every sample's
            raise failure
        return self._row(replies, failure)

    def messages(self, exam: Exam) -> list[BaseMessage]:
        """The prompt that grades one answer."""
        values = self.prompt.fill(
            question=exam.question or "",
            ground_truth=exam.ground_truth or "",
            answer=exam.answer,
            scale=Delimited(self.scale_note),
        )
        return self.prompt.template.format_messages(**values)

    def _row(self, replies: list[Reply[Any]], failure: LLMError | None) -> dict[str, Any]:
        completeness = [reply.value.completeness / self.divisor for reply in replies]
        conciseness = [reply.value.conciseness / self.divisor for reply in replies]
        return {
            "completeness": statistics.fmean(completeness),
            "conciseness": statistics.fmean(conciseness),
            "completeness_std": _std(completeness),
            "conciseness_std": _std(conciseness),
            "samples_valid": len(replies),
            "reasoning": replies[0].value.reasoning,
            "sample_error": failure.reason if failure else None,
            "prompt_tokens": sum(reply.prompt_tokens for reply in replies),
            "completion_tokens": sum(reply.completion_tokens for reply in replies),
            "attempts": sum(reply.attempts for reply in replies),
            "latency_s": round(sum(reply.latency for reply in replies), 3),
        }

    async def preflight(self) -> None:
        """Nothing to check beyond what run_judge did."""

    async def aclose(self) -> None:
        """Close the model's connections."""
        await self.llm.aclose()

    def figures(self) -> dict[str, Any]:
        """Calls made, and the structured-output method that was used in the end."""
        return {
            "calls": self.llm.calls,
            "structured_output": self.llm.method.value,
            "tokens_billed": {"prompt": self.llm.tokens[0], "completion": self.llm.tokens[1]},
        }


class ControlPlan(JudgePlan):
    """Grade the known-answer controls like the exam, and say whether each one passed."""

    def __init__(
        self, settings: Settings, given: Given, controls: list[Control], session: Session
    ) -> None:
        super().__init__(settings, given, [], session)
        self.controls = controls

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The controls not yet graded."""
        left = [control for control in self.controls if control.key not in done]
        return len(left), (self._task(control) for control in left)

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every control this run wants graded."""
        return {control.key: self._exam(control).input_hash for control in self.controls}

    def _task(self, control: Control) -> Task:
        exam = self._exam(control)
        known = {**self.known(), **control.columns(), "input_hash": exam.input_hash}
        return Task(control.key, known, exam)

    def _exam(self, control: Control) -> Exam:
        source = control.source
        return Exam(source.qa_id, source.question, source.ground_truth, control.answer)

    async def work(self, task: Task) -> dict[str, Any]:
        """Grade the control answer; it passes when its grades fall within its kind's bounds."""
        row = await super().work(task)
        bounds = KINDS[task.known["control"]].bounds
        return {**row, "passed": bounds.passes(row["completeness"], row["conciseness"])}


def _std(values: list[float]) -> float | None:
    """Sample standard deviation; none for a single value."""
    return statistics.stdev(values) if len(values) > 1 else None
