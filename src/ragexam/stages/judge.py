"""The judge stage: grade each answer against its ground truth on completeness and conciseness.

By key points (the default when the exam has them: marking.py) or as two numbers on the unit
or ten scale (grading.py). A row whose every sample failed is an `error` row with the reason
and the raw reply, never a default score.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

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
from ragexam.io.cells import SINGLE, UNANSWERABLE
from ragexam.io.manifest import read_manifest
from ragexam.io.runfolder import RunFolder
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Call, Prompt
from ragexam.options import Given
from ragexam.stages.batch import run_settings
from ragexam.stages.bulk import Rows
from ragexam.stages.exams import INPUTS, Exam, Exams, inputs
from ragexam.stages.grading import Grader, Sample, ScaleGrader, merged
from ragexam.stages.marking import KeyPointGrader
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
    "with_context",
    "reasoning",
    "key_point_verdicts",
    "key_point_evidence",
    "key_point_context",
    "lost_in_generation",
    "lost_in_retrieval",
    "key_point_samples",
    "answer_statements",
    "sample_error",
)
# Recorded since 0.2 (temperature) and since key points (with_context): an older row's empty
# cell is no change; its input hash still tells a grade made without the context apart.


def run_judge(settings: Settings, given: Given, session: Session, exams: Exams) -> StageResult:
    """Write `judgments.csv`; inputs and key are checked before the first paid call."""
    settings.api_key()
    given.out.mkdir(parents=True, exist_ok=True)
    plan = JudgePlan(settings, given, exams.exams, session, exams.scale)
    stage = plan.stage("judge", RunFolder(given.out).judgments, "qa_id", JUDGE_COLUMNS)
    outcome = _execute(settings, given, plan, stage, {"skipped": exams.skipped}, session)
    keys = frozenset(exam.qa_id for exam in exams.exams)
    return StageResult(outcome, stage.path, exams.skipped, keys=keys)


def sources_of(exams: list[Exam], scale: Scale = Scale.unit) -> list[Source]:
    """The questions controls can be built from: those with a question and ground truth (and
    key points, graded by them: a question whose key points could not be written is graded
    by none), and single ones (else multi-hop ones). To an unanswerable question "I don't
    know" is the right answer, not a control's wrong one; and a multi-hop question's ground
    truth holds facts of another document, so it is no wrong answer there."""
    marked = scale is Scale.key_points
    graded = [
        (Source(e.qa_id, e.document, e.question, e.ground_truth, e.key_points), e.kind)
        for e in exams
        if e.question is not None
        and e.ground_truth is not None
        and (e.key_points is not None or not marked)
    ]
    single = [source for source, kind in graded if kind == SINGLE]
    return single or [source for source, kind in graded if kind != UNANSWERABLE]


def run_controls(settings: Settings, given: Given, session: Session, exams: Exams) -> StageResult:
    """Write `judge_controls.csv`: known answers to `--controls` of the exam's questions."""
    count, seed = given.grading.controls, given.folder.seed
    controls = build_controls(sources_of(exams.exams, exams.scale), count, seed, exams.scale)
    settings.api_key()
    plan = ControlPlan(_exam_method(settings, given.out), given, controls, session, exams.scale)
    grades = JUDGE_COLUMNS.index("conciseness") + 1
    columns = (*CONTROL_COLUMNS, *JUDGE_COLUMNS[:grades], "passed", *JUDGE_COLUMNS[grades:])
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
        "prompt": {plan.prompt.name: plan.prompt.hash},
        "scale": plan.scale.value,
        "with_context": plan.with_context,
        "samples": given.grading.samples,
        "temperature": plan.temperature,
        **extra,
        "settings": settings.public(),
        **{name: str(path.resolve()) for name, path in zip(INPUTS, inputs(given), strict=True)},
    }
    how = run_settings(given, settings)
    return execute(stage, plan, record, how, session)


def grader_for(scale: Scale, with_context: bool, prompts: Path | None) -> Grader:
    """The key-points grader, or the one that asks for two numbers on the unit or ten scale."""
    if scale is Scale.key_points:
        return KeyPointGrader(prompts, with_context)
    return ScaleGrader(scale, prompts)


class JudgePlan:
    """Grade every answered question, `samples` times each."""

    def __init__(
        self, settings: Settings, given: Given, exams: list[Exam], session: Session, scale: Scale
    ) -> None:
        self.exams, grading = exams, given.grading
        self.samples, self.scale = grading.samples, scale
        self.with_context = grading.with_context
        self.grader = grader_for(scale, grading.with_context, settings.prompts_dir)
        default = 0.0 if grading.samples == 1 else 0.7  # several samples need some variety
        chosen = default if grading.temperature is None else grading.temperature
        self.temperature = float(chosen)  # 0 and 0.0 are one setting, as a row records it
        self.prompt: Prompt = self.grader.prompt
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
            "with_context": self.with_context,
        }
        model, prompt = self.llm.model, self.prompt.hash
        legacy = {"temperature": self._recorded_temperature(path.parent, name)}
        legacy["with_context"] = False  # versions before it graded without the context
        values = ("completeness", "conciseness")
        return Stage(name, path, key, columns, model, prompt, fixed, legacy, values)

    def _recorded_temperature(self, out: Path, stage: str) -> float:
        """The temperature older rows, which did not record it, were graded at: the one the
        stage's manifest recorded, else the default of their time."""
        recorded = read_manifest(out).get("stages", {}).get(stage, {}).get("temperature")
        if isinstance(recorded, int | float) and not isinstance(recorded, bool):
            return float(recorded)
        return 0.0 if self.samples == 1 else 0.7

    def known(self) -> dict[str, Any]:
        """The columns every row of this plan has before its call."""
        known: dict[str, Any] = {"samples": self.samples, "scale": self.scale.value}
        return {**known, "temperature": self.temperature, "with_context": self.with_context}

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The answers not yet judged."""
        left = [exam for exam in self.exams if exam.qa_id not in done]
        known, late = self.known(), self._hashed
        return len(left), (Task(e.qa_id, known, e, late) for e in left)

    def _hashed(self, exam: Exam) -> dict[str, str]:
        """A row's input hash, made when the row is written."""
        return {"input_hash": self.grader.input_hash(exam)}

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every answer this run wants graded."""
        return {exam.qa_id: self.grader.input_hash(exam) for exam in self.exams}

    async def work(self, task: Task) -> dict[str, Any]:
        """Grade the answer `samples` times; the row is ok if one sample validated."""
        exam: Exam = task.payload
        if exam.question is None or exam.ground_truth is None:
            raise RowError("no ok question with this qa_id in the qa dataset: nothing to grade by")
        self.grader.check(exam)
        samples: list[Sample] = []
        failure: LLMError | None = None
        spent = [0, 0, 0]  # prompt and completion tokens, and attempts, of the failed samples
        for _ in range(self.samples):
            try:
                samples.append(await self.grader.sample(self.llm, exam))
            except LLMError as exc:
                failure = exc
                spent = [
                    spent[0] + exc.tokens[0],
                    spent[1] + exc.tokens[1],
                    spent[2] + exc.attempts,
                ]
        if not samples:
            assert failure is not None
            failure.tokens, failure.attempts = (spent[0], spent[1]), spent[2]  # every sample's
            raise failure
        return self.finish(task, samples, failure)

    def finish(self, task: Task, samples: list[Sample], failure: LLMError | None) -> dict[str, Any]:
        """The row's values, from its valid samples (and why the others failed)."""
        row = {**merged(samples), **self.grader.columns(samples, task.payload)}
        return {**row, "sample_error": failure.reason if failure else None}

    def opening(self, task: Task) -> Call | None:
        """The row's first call, as `work` makes it; None when the row fails before any call
        (the batch road writes a row's first request, and reads its first reply, from this)."""
        exam: Exam = task.payload
        if exam.question is None or exam.ground_truth is None:
            return None
        try:
            self.grader.check(exam)
        except RowError:
            return None
        return self.grader.opening(exam)

    def answered(self, task: Task, reply: Reply[Any]) -> dict[str, Any] | None:
        """The row's values when the first call's valid reply is all `work` needs (one sample,
        which it settles); None: the row goes on to more calls."""
        if self.samples != 1:
            return None
        sample = self.grader.settled(task.payload, reply)
        return None if sample is None else self.finish(task, [sample], None)

    def bulk(self) -> Rows | None:
        """The commonest row, for the batch road's bulk lane: one sample on the unit or ten
        scale, its grades and reasoning the reply's (the key-points scale counts verdicts
        against the row's own key points: its rows go the direct lane)."""
        grader = self.grader
        if self.samples != 1 or not isinstance(grader, ScaleGrader):
            return None
        return Rows(grader.schema, ("completeness", "conciseness", "reasoning"), grader.grades)

    def messages(self, exam: Exam) -> list[BaseMessage]:
        """The prompt that grades one answer."""
        return self.grader.messages(exam)

    async def preflight(self) -> None:
        """Nothing to check beyond what run_judge did."""

    async def aclose(self) -> None:
        """Close the model's connections."""
        await self.llm.aclose()

    def figures(self) -> dict[str, Any]:
        """Calls made, and the structured-output method that was used in the end."""
        return self.llm.figures()


class ControlPlan(JudgePlan):
    """Grade the known-answer controls like the exam, and say whether each one passed."""

    def __init__(
        self,
        settings: Settings,
        given: Given,
        controls: list[Control],
        session: Session,
        scale: Scale,
    ) -> None:
        # A control answer was retrieved from nothing: it is graded without context.
        super().__init__(settings, given.but(with_context=False), [], session, scale)
        self.controls = controls

    def tasks(self, done: set[str]) -> tuple[int, Iterator[Task]]:
        """The controls not yet graded."""
        left = [control for control in self.controls if control.key not in done]
        return len(left), (self._task(control) for control in left)

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every control this run wants graded."""
        return {c.key: self.grader.input_hash(self._exam(c)) for c in self.controls}

    def _task(self, control: Control) -> Task:
        exam = self._exam(control)
        hashed = self.grader.input_hash(exam)
        known = {**self.known(), **control.columns(), "input_hash": hashed}
        return Task(control.key, known, exam)

    def _exam(self, control: Control) -> Exam:
        source = control.source
        return Exam(
            source.qa_id, source.question, source.ground_truth, control.answer,
            key_points=source.key_points,
        )  # fmt: skip

    def bulk(self) -> Rows | None:
        """None: a control's row says whether it passed, and there are a few dozen of them."""
        return None

    def finish(self, task: Task, samples: list[Sample], failure: LLMError | None) -> dict[str, Any]:
        """The control's grades; it passes when they fall within its kind's bounds."""
        row = super().finish(task, samples, failure)
        bounds = KINDS[task.known["control"]].bounds
        return {**row, "passed": bounds.passes(row["completeness"], row["conciseness"])}
