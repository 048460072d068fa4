"""The judge stage: grade each answer against its ground truth on completeness and conciseness.

A grade comes only from a reply that validated against the schema, bounds included: a value
out of range is re-asked, never clamped, and a row whose every sample failed is an `error`
row with the reason and the raw reply, never a default score.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from ragexam.analysis.controls import (
    CONTROL_COLUMNS,
    CONTROLS_FILE,
    KINDS,
    Control,
    Source,
    build_controls,
    keep_planned,
)
from ragexam.config import Scale, Settings, StructuredMethod
from ragexam.errors import LLMError, RowError
from ragexam.io.csvfile import gc_paused, read_columns
from ragexam.io.fingerprint import input_hash
from ragexam.io.manifest import input_file, read_manifest
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Delimited, Prompt, load_prompt
from ragexam.stages.answer import ANSWERS_FILE
from ragexam.stages.generate import QA_FILE
from ragexam.stages.runner import (
    Outcome,
    Progress,
    RunSettings,
    Stage,
    StageResult,
    Task,
    execute,
)

JUDGMENTS_FILE = "judgments.csv"
JUDGE_COLUMNS = (
    "completeness",
    "conciseness",
    "completeness_std",
    "conciseness_std",
    "samples",
    "samples_valid",
    "scale",
    "reasoning",
    "sample_error",
)
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
class JudgeOptions:
    """What `ragexam judge` was asked to do."""

    out: Path
    qa_path: Path | None = None
    answers_path: Path | None = None
    limit: int | None = None
    samples: int = 1
    temperature: float | None = None
    scale: Scale = Scale.unit
    force: bool = False
    controls: int = 10
    seed: int = 0


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
    with gc_paused():  # a large exam is many objects, none in a cycle
        return _joined_files(qa_path, answers_path)  # its columns freed before the collector runs


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


def run_judge(
    settings: Settings, options: JudgeOptions, progress: Progress | None = None
) -> StageResult:
    """Write `judgments.csv`; inputs and key are checked before the first paid call."""
    exams, skipped = _read_exams(options)
    settings.api_key()
    options.out.mkdir(parents=True, exist_ok=True)
    plan = JudgePlan(settings, options, exams[: options.limit])
    stage = plan.stage("judge", JUDGMENTS_FILE, "qa_id", JUDGE_COLUMNS)
    outcome = _execute(settings, options, plan, stage, {"skipped": skipped}, progress)
    return StageResult(outcome, stage.path, skipped)


def run_controls(
    settings: Settings, options: JudgeOptions, progress: Progress | None = None
) -> StageResult:
    """Write `judge_controls.csv`: known answers to `options.controls` of the exam's questions."""
    exams, _ = _read_exams(options)
    sources = [
        Source(exam.qa_id, exam.document, exam.question, exam.ground_truth)
        for exam in exams[: options.limit]
        if exam.question is not None and exam.ground_truth is not None
    ]
    controls = build_controls(sources, options.controls, options.seed)
    settings.api_key()
    plan = ControlPlan(_exam_method(settings, options.out), options, controls)
    columns = (*CONTROL_COLUMNS, *JUDGE_COLUMNS)
    stage = plan.stage("judge_controls", CONTROLS_FILE, "control_id", columns)
    keep_planned(stage.path, stage.all_columns(), controls)
    record = {"controls": options.controls, "seed": options.seed, "rows": len(controls)}
    outcome = _execute(settings, options, plan, stage, record, progress)
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


def _inputs(options: JudgeOptions) -> tuple[Path, Path]:
    """The exam (given, in the run folder, or where `answer` recorded it) and the answers."""
    qa_path = options.qa_path or input_file(options.out, QA_FILE, "qa_dataset")
    return qa_path, options.answers_path or options.out / ANSWERS_FILE


def _read_exams(options: JudgeOptions) -> tuple[list[Exam], int]:
    return read_exams(*_inputs(options))


def _execute(
    settings: Settings,
    options: JudgeOptions,
    plan: JudgePlan,
    stage: Stage,
    extra: dict[str, Any],
    progress: Progress | None,
) -> Outcome:
    """Run the plan's rows into the stage's file, with the judge's manifest record."""
    record = {
        "model": plan.llm.model,
        "prompt": {"judge": plan.prompt.hash},
        "scale": options.scale.value,
        "samples": options.samples,
        "temperature": plan.temperature,
        **extra,
        "settings": settings.public(),
        **{name: str(path.resolve()) for name, path in zip(INPUTS, _inputs(options), strict=True)},
    }
    how = RunSettings(options.out, settings.concurrency, options.force, settings.redact)
    return execute(stage, plan, record, how, progress)


class JudgePlan:
    """Grade every answered question, `samples` times each."""

    def __init__(self, settings: Settings, options: JudgeOptions, exams: list[Exam]) -> None:
        self.options, self.exams = options, exams
        self.schema, self.divisor, self.scale_note = SCALES[options.scale]
        default = 0.0 if options.samples == 1 else 0.7  # several samples need some variety
        self.temperature = default if options.temperature is None else options.temperature
        self.prompt: Prompt = load_prompt("judge", settings.prompts_dir)
        self.llm = LLM(
            settings,
            settings.model_for("judge"),
            temperature=self.temperature,
            max_tokens=settings.max_tokens_for("judge"),
        )

    def stage(self, name: str, file: str, key: str, columns: tuple[str, ...]) -> Stage:
        """The output this plan writes, fingerprinted by its model and prompt."""
        return Stage(name, self.options.out / file, key, columns, self.llm.model, self.prompt.hash)

    def known(self) -> dict[str, Any]:
        """The columns every row of this plan has before its call."""
        return {"samples": self.options.samples, "scale": self.options.scale.value}

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
        for _ in range(self.options.samples):
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

    def __init__(self, settings: Settings, options: JudgeOptions, controls: list[Control]) -> None:
        super().__init__(settings, options, [])
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
