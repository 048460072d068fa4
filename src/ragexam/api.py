"""The Python API, and the one orchestration: `ragexam COMMAND` calls these same functions.

    import ragexam
    exam = ragexam.generate("examples/chroma", limit=20)
    answers = ragexam.answer("examples/chroma", rag=my_chain)  # a callable or Runnable
    ragexam.judge()
    report = ragexam.stats()
    report.frame()  # summary_by_document.csv as a DataFrame
    ragexam.run("examples/chroma", control_runs=True)  # every stage, as `ragexam run`

A function takes its command's options as keyword arguments, each declared once, with its
default, in options.py (`help(ragexam.run)` lists them). It returns a `Result` and prints
nothing: a `session` whose observer prints (the CLI's) is told what happens as it happens.
Inside a running event loop (Jupyter), the work runs in a worker thread with its own loop, so
the call still simply returns its result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ragexam.config import Scale
from ragexam.errors import (
    BatchPending,
    ConfigError,
    InputFileError,
    OutputFileError,
    TooManyErrors,
)
from ragexam.io.atomic import unwritable
from ragexam.io.runfolder import CONTROL_RUNS, RunFolder
from ragexam.options import (
    ANSWER,
    CALIBRATE,
    COMPARE,
    GENERATE,
    JUDGE,
    RUN,
    SLOTS,
    STATS,
    Given,
    Spec,
    hints,
    meta,
)
from ragexam.stages.runner import BatchesSent
from ragexam.stages.session import Session, session_for
from ragexam.stages.setup import settings_for

if TYPE_CHECKING:
    import pandas as pd

    from ragexam.config import Settings
    from ragexam.stages.dryrun import Estimate
    from ragexam.stages.exams import Exams
    from ragexam.stages.runner import StageResult

T = TypeVar("T")
Body = Callable[[Given, Session], "Result"]


@dataclass(frozen=True)
class Result:
    """What a command wrote (`paths`, by name), its figures, and `.frame()` to load a CSV."""

    paths: dict[str, Path]
    figures: dict[str, Any] = field(default_factory=dict)
    detail: Any = field(default=None, repr=False, compare=False)  # the typed result behind them

    @property
    def path(self) -> Path:
        """The main file written (the first of `paths`); ValueError when none was (a dry
        run's)."""
        if not self.paths:
            raise ValueError("this command wrote no file (a dry run writes none): see .figures")
        return next(iter(self.paths.values()))

    def frame(self, name: str | None = None) -> pd.DataFrame:
        """A CSV written, as a pandas DataFrame; the main one unless `name` says which."""
        import pandas as pd

        from ragexam.io.csvfile import unescape_cell

        path = self.paths[name] if name else self.path
        if path.suffix != ".csv":
            raise ValueError(f"{path} is no CSV file: open it as it is")
        frame = pd.read_csv(path, encoding="utf-8-sig")
        for column in frame.columns:
            if not pd.api.types.is_numeric_dtype(frame[column]):
                frame[column] = frame[column].map(
                    lambda v: unescape_cell(v) if isinstance(v, str) else v
                )
        return frame


def command(spec: Spec, body: Body) -> Callable[..., Result]:
    """The public function of a command: its options by keyword, resolved, in a session."""

    def public(*args: Any, session: Session | None = None, **options: Any) -> Result:
        if len(args) > len(spec.positional):
            raise TypeError(f"{spec.name}() takes {len(spec.positional)} positional arguments")
        given = spec.resolve({**dict(zip(spec.positional, args, strict=False)), **options})
        with session_for(session) as shared:
            shared.endpoints.recall(given.out)  # rate limits an earlier command learned here
            return _in_own_loop(lambda: body(given, shared))

    public.__name__ = public.__qualname__ = spec.name
    public.__doc__ = body.__doc__
    public.__module__ = __name__
    public.__signature__ = signature(spec)  # type: ignore[attr-defined]
    return public


def signature(spec: Spec) -> inspect.Signature:
    """The API function's signature: the positional options first, then every other by keyword."""
    kinds = {True: inspect.Parameter.POSITIONAL_OR_KEYWORD, False: inspect.Parameter.KEYWORD_ONLY}
    ordered = sorted(spec.fields(), key=lambda pair: pair[1].name not in spec.positional)
    parameters = [
        inspect.Parameter(
            item.name,
            kinds[item.name in spec.positional],
            default=inspect.Parameter.empty if meta(item).required else item.default,
            annotation=option_type(slot, item.name),
        )
        for slot, item in ordered
    ]
    session = inspect.Parameter(
        "session", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Session | None
    )
    return inspect.Signature([*parameters, session], return_annotation=Result)


def option_type(slot: str, name: str) -> Any:
    """An option's type, as the API takes it."""
    return hints(SLOTS[slot])[name]


def _in_own_loop(call: Callable[[], T]) -> T:
    """Run `call` here, or in a worker thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False  # the call is made outside this block: its errors are not "during" it
    else:
        running = True
    if not running:
        return call()
    from ragexam.stages.stopping import Stop, in_worker

    stop, cell = Stop(), asyncio.current_task()  # the cell's task, when a coroutine calls
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ragexam") as pool:
        future = pool.submit(in_worker, stop, call)
        try:
            while True:
                try:
                    return future.result(timeout=0.1)
                except concurrent.futures.TimeoutError:
                    # asyncio.run's Ctrl-C cancels the task, which waits here: stop too
                    if cell is not None and cell.cancelling():
                        raise asyncio.CancelledError from None
        except BaseException:  # Ctrl-C here (a kernel's interrupt): the worker stops too,
            stop.ask()  # keeping what it wrote, before the pool waits for it
            raise


# -- the stages ----------------------------------------------------------------------------------


def _generate(given: Given, session: Session) -> Result:
    """Write qa_dataset.csv: one question and ground-truth answer per chunk."""
    _check_batch(given)
    settings = settings_for(given, "generate")
    if given.calls.dry_run:
        from ragexam.stages.dryrun import estimate_generate

        return _estimated(estimate_generate(settings, given, session), session, given)
    from ragexam.stages.generate import run_generate

    result = run_generate(settings, given, session)
    return _checked(_stage("generate", "qa_dataset", result, settings, session), settings)


def _answer(given: Given, session: Session) -> Result:
    """Write answers.csv; `rag` is "module:callable", or a callable or Runnable object."""
    _check_batch(given)
    settings = settings_for(given, "answer")
    if given.calls.dry_run:
        from ragexam.stages.dryrun import estimate_answer

        return _estimated([estimate_answer(settings, given, session)], session, given)
    from ragexam.stages.answer import run_answer

    result = run_answer(settings, given, session)
    return _checked(_stage("answer", "answers", result, settings, session), settings)


def _judge(given: Given, session: Session, key_points: bool = True) -> Result:
    """Write judgments.csv, and judge_controls.csv unless `controls=0`; an exam graded by key
    points that lacks some gets them written once first (key_points.csv), unless the caller
    wrote them (`key_points` False: `run`, whose control runs share them)."""
    _check_batch(given)
    settings = settings_for(given, "judge")
    if given.calls.dry_run:
        from ragexam.stages.dryrun import estimate_judge

        return _estimated(estimate_judge(settings, given, session), session, given)
    from ragexam.analysis.verdict import read_verdict
    from ragexam.stages.judge import run_controls, run_judge

    if key_points:
        exams, written = _key_points(given, session)
    else:
        from ragexam.stages.exams import load_exams

        exams, written = load_exams(given), None
    if written is None:
        _say_scale(exams, written, session)

    def graded() -> Result:  # each recorded and said as soon as it is done
        result = run_judge(settings, given, session, exams)
        return _stage("judge", "judgments", result, settings, session)

    def known() -> Result:
        result = run_controls(settings, given, session, exams)
        return _stage("judge_controls", "controls", result, settings, session)

    if not given.grading.controls:
        return _checked(graded(), settings)
    grades, checks = _together(given, session, [graded, known])  # beside, not after them
    _waiting(grades, checks)
    verdict = read_verdict(given.out)
    if verdict is not None and not session.in_run:  # in `run`, stats says it beside the scores
        session.observer.verdict(verdict)
    _checked(checks, settings)
    _checked(grades, settings)
    figures = {**grades.figures, "controls": checks.figures}
    return Result({**grades.paths, **checks.paths}, figures, grades.detail)


def _key_points(given: Given, session: Session) -> tuple[Exams, StageResult | None]:
    """The exam to judge, with the key points it lacks written first when it is graded by
    them (key_points.csv, which its control runs share); what writing them did, if it did."""
    from ragexam.stages.exams import load_exams
    from ragexam.stages.keypoints import write_key_points

    settings = settings_for(given, "judge")
    exams, written = write_key_points(settings, given, load_exams(given), session)
    if written is not None:
        _say_scale(exams, written, session)
        _checked(_stage("key_points", "key_points", written, settings, session), settings)
    return exams, written


def _together(given: Given, session: Session, stages: Sequence[Callable[[], T]]) -> list[T]:
    """Run stages that need nothing of each other. With --batch, each first sends its
    batches, then each is run again to wait on them: their batches run at once, where one
    after another each would wait its turn in the queue (up to the Batch API's 24 h). In a
    send phase already (these stages are one of the stages of an outer group), they are only
    sent. With --batch-dir, each writes its requests before the command exits for them all."""
    if given.calls.batch_dir is not None:
        return _written(stages)
    if not given.calls.batch or (len(stages) < 2 and not session.sending):
        return [stage() for stage in stages]
    outer, before = session.sending, set(session.sent)
    try:
        with session.sending_first():
            for stage in stages:
                with suppress(BatchesSent):
                    stage()
        if outer:
            raise BatchesSent
        return _each(stages)
    finally:
        if not outer:  # stopped between: a later command of the session owes them nothing
            for path in set(session.sent) - before:
                del session.sent[path]


def _each(stages: Sequence[Callable[[], T]]) -> list[T]:
    """Each stage waited on, though one ends with more error rows than allowed: the others'
    batches are out, paid for, and their rows are written; the first such error is raised
    once every stage is done."""
    done: list[T] = []
    failed: TooManyErrors | None = None
    for stage in stages:
        try:
            done.append(stage())
        except TooManyErrors as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return done


def _written(stages: Sequence[Callable[[], T]]) -> list[T]:
    """--batch-dir: every stage writes its requests; then, if any wait, one BatchPending."""
    done: list[T] = []
    pending: list[BatchPending] = []
    for stage in stages:
        try:
            done.append(stage())
        except BatchPending as waiting:
            pending.append(waiting)
    if pending:
        raise BatchPending(sum(waiting.waiting for waiting in pending), pending[0].folder)
    return done


def _say_scale(exams: Exams, written: StageResult | None, session: Session) -> None:
    """Say when key points were written for the exam, or when it has none to grade by."""
    if written is not None:
        done = written.outcome.ok + written.outcome.done_before
        session.observer.note(
            f"the exam had no key points for {done} questions: they were written once into "
            f"{written.path} (edit them there); judge grades by them from now on"
        )
    elif exams.scale is Scale.unit and not exams.asked:
        session.observer.note(
            "the exam has no key points: graded on the unit scale; --scale key-points writes "
            "them once (key_points.csv) and grades a verdict per key point"
        )


def _stage(
    name: str, key: str, result: StageResult, settings: Settings, session: Session
) -> Result:
    """Price what the stage billed, record it, and tell the observer."""
    from ragexam.llm.prices import record_cost

    cost, price, billed = record_cost(result.path.parent, name, settings)
    session.observer.stage_done(name, result, cost, price, billed)
    figures = {**result.outcome.record(), "skipped": result.skipped, "cost_usd": cost}
    return Result({key: result.path}, figures, result)


def _checked(result: Result, settings: Settings) -> Result:
    """The result, unless requests wait for their batch results (BatchPending), or its file
    holds more error rows than allowed (TooManyErrors)."""
    from ragexam.stages.runner import StageResult, check_error_rate

    _waiting(result)
    keys = result.detail.keys if isinstance(result.detail, StageResult) else None
    check_error_rate(result.path, settings.max_error_rate, keys)
    return result


def _waiting(*results: Result) -> None:
    """Raise BatchPending when requests of these stages wait for results in a --batch-dir."""
    batches = [result.figures.get("batch") or {} for result in results]
    waiting = sum(int(batch.get("waiting") or 0) for batch in batches)
    if waiting:
        folder = next(str(batch["folder"]) for batch in batches if batch.get("folder"))
        raise BatchPending(waiting, folder)


def _check_batch_dir(folder: Path) -> None:
    """A --batch-dir that is a file, or under one, or holds a file where its requests or
    results go, or whose requests cannot be written, is refused in a line naming it."""
    for place in (folder, *folder.parents):
        if place.exists():
            if not place.is_dir():
                what = "is a file" if place == folder else f"is under {place}, a file"
                raise ConfigError(f"--batch-dir {folder} {what}, not a folder: name a folder")
            break
    requests = folder / "requests"
    for place in (requests, requests / "done", folder / "results"):
        if place.exists() and not place.is_dir():
            raise ConfigError(
                f"--batch-dir {folder}: {place} is a file, where ragexam keeps a folder: "
                "move it, or name another --batch-dir"
            )
    for place in (folder, requests, requests / "done"):  # or the folder it would be made in
        if (reason := unwritable(place)) is not None:
            raise OutputFileError(
                place, f"cannot be written ({reason}); pass a writable --batch-dir"
            )


def _check_batch(given: Given) -> None:
    """Refuse batch options that cannot be honoured, before any call."""
    calls = given.calls
    if calls.batch and calls.batch_dir is not None:
        raise ConfigError(
            "--batch sends the calls to the endpoint's Batch API, --batch-dir writes them to "
            "files: give one of them"
        )
    if calls.batch_dir is not None:
        _check_batch_dir(calls.batch_dir)
    batched = calls.batch or calls.batch_dir is not None
    harder = batched and (given.exam.multi_hop or given.exam.unanswerable)
    if harder and _harder_lacking(given):  # once the exam holds them, the rest can batch
        raise ConfigError(
            "--multi-hop and --unanswerable questions are written and verified in several calls "
            "that wait on each other, until enough are kept: they take the sync road; write "
            "them with a generate without --batch/--batch-dir (the other stages can batch, and "
            "this command once they are kept)"
        )
    if batched and given.answering.rag not in (None, ""):
        raise ConfigError(
            "--rag: your RAG system makes its own calls, which ragexam cannot batch; drop "
            "--batch/--batch-dir to answer with it, or drop --rag to batch the built-in answerer"
        )


def _harder_lacking(given: Given) -> bool:
    """Whether generate has harder questions still to write (the sync road's work)."""
    from ragexam.stages.harder import harder_held

    return bool(harder_held(given)[0])


def _estimated(estimates: list[Estimate], session: Session, given: Given) -> Result:
    """What a dry run found: no file, the estimates per stage, and their calls and cost."""
    from dataclasses import replace

    if given.calls.batch or given.calls.batch_dir is not None:
        estimates = [replace(estimate, batched=True) for estimate in estimates]
    session.observer.estimates(estimates)
    costs = [estimate.priced for estimate in estimates]
    total = None if None in costs else sum(cost or 0.0 for cost in costs)
    figures = {"estimates": [estimate.record() for estimate in estimates], "cost_usd": total}
    return Result({}, {**figures, "calls": sum(estimate.calls for estimate in estimates)})


def _stats(given: Given, session: Session) -> Result:
    """Write the summaries and report.html; figures are the overall row (`document` ALL).

    `fail_under="completeness=0.7,hit_rate=0.8"` raises GateFailed after writing them.
    """
    from ragexam.analysis.gates import check_bounds, parse_bounds
    from ragexam.analysis.stats import StatsOptions, run_stats
    from ragexam.report.html import write_report

    gate = given.summary.fail_under
    bounds = parse_bounds(gate) if gate is not None else None
    if not given.out.is_dir():  # summarises a run folder: makes none, not even for its lock
        raise InputFileError(given.out, "is not a run folder; --out names the run to summarise")
    with session.holding(given.out):
        result = run_stats(
            StatsOptions(
                given.out,
                given.answering.k,
                given.folder.seed,
                given.summary.split,
                given.summary.exclude_flagged,
            )
        )
        write_report(result, result.paths["report"])
    session.observer.stats(result)
    figures = {str(name): _plain(value) for name, value in result.overall.iloc[0].items()}
    if bounds:
        check_bounds(figures, bounds)
    return Result(dict(result.paths), {**figures, "k": result.k}, result)


def _plain(value: Any) -> Any:
    """A figure as a plain Python value (numpy's scalars are not JSON)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _compare(given: Given, session: Session) -> Result:
    """Write comparison.csv: paired differences per metric and document; figures hold warnings."""
    from ragexam.analysis.compare import run_compare
    from ragexam.analysis.gates import check_regressions

    runs = given.comparing
    run_a, run_b = Path(runs.run_a or "."), Path(runs.run_b or ".")  # required: never None
    result = run_compare(run_a, run_b, runs.out or run_b, runs.seed)
    session.observer.compared(result)
    if runs.fail_on_regression and result.different:
        raise ConfigError(
            f"--fail-on-regression: {result.different} paired questions differ between the "
            "runs' exams; a regression can only be measured on one exam (run --qa-dataset)"
        )
    if runs.fail_on_regression:
        check_regressions(result.table)
    paths = {"comparison": result.path}
    if result.changes_path is not None:
        paths["key_point_changes"] = result.changes_path
    return Result(paths, {"warnings": list(result.warnings)}, result)


def _calibrate(given: Given, session: Session) -> Result:
    """Measure the judge against a person's grades (calibration.csv), or write a template."""
    from ragexam.analysis.calibrate import run_calibrate
    from ragexam.analysis.labels import write_template

    asked = given.calibrating
    if (asked.labels is None) == (asked.template is None):
        raise ConfigError("give LABELS.csv to measure the judge, or --template N to write one")
    if asked.labels is None:
        path, count = write_template(given.out, asked.template or 0, given.folder.seed)
        session.observer.template(path, count)
        return Result({"labels_template": path}, {"questions": count})
    scale = Scale(asked.scale.value)  # a person's: unit or ten
    result = run_calibrate(asked.labels, given.out, scale, given.folder.seed)
    session.observer.calibrated(result)
    return Result({"calibration": result.path}, {"reading": result.reading}, result)


def _run(given: Given, session: Session) -> Result:
    """Every stage in order, as `ragexam run`: generate (unless `qa_dataset` names an exam),
    answer, judge, the control runs if asked, and stats. Figures are by stage, and `cost_usd`
    is the whole run's."""
    _check_run(given)
    if given.calls.dry_run:
        from ragexam.stages.dryrun import estimate_run

        settings = settings_for(given, "generate", "answer", "judge")
        return _estimated(estimate_run(settings, given, session), session, given)
    session.in_run = True  # the judge's verdict is said once, by stats
    try:
        with session.holding(given.out):  # one writer from the first stage to the last
            return _whole(given, _stages(given, session), session)
    finally:
        session.in_run = False


def _stages(given: Given, session: Session) -> dict[str, Result]:
    """run's stages before stats: generate (unless given an exam), answer, judge, control runs."""
    results: dict[str, Result] = {}
    if given.inputs.qa_dataset is None:
        from ragexam.stages.answer import check_inputs

        check_inputs(settings_for(given, "answer"), given, session)  # before generate pays
        results["generate"] = _generate(given, session)
    folder = RunFolder(given.out)
    exam = given.inputs.qa_dataset or folder.qa_dataset
    runs = {"": given}  # the run, then its control runs: each answers, then is judged
    for name in CONTROL_RUNS if given.grading.control_runs else ():
        where = folder.control_run(name).path
        runs[f"_{name}"] = given.but(
            out=where, qa_dataset=exam, rag=None, context=CONTROL_RUNS[name]
        )
    # a control run is graded like the exam, less the context: the other reading
    judges = {
        name: run if not name else run.but(controls=0, with_context=False)
        for name, run in runs.items()
    }
    if not (given.calls.batch or given.calls.batch_dir is not None):
        for name, run in runs.items():  # the exam's grades first: a judge that fails, before
            results[f"answer{name}"] = _answer(run, session)  # the control runs pay
            results[f"judge{name}"] = _judge(judges[name], session)
        return results
    # Batched, each group's batches go out at once: the answers need only the exam, the
    # judges only their answers and the key points (written first, once: the runs share them).
    answers = _together(given, session, [partial(_answer, run, session) for run in runs.values()])
    _key_points(given, session)  # once, whatever rows of it fail: each judge pays no more for it
    grading = [partial(_judge, run, session, key_points=False) for run in judges.values()]
    graded = _together(given, session, grading)
    for name, answered, judged in zip(runs, answers, graded, strict=True):
        results[f"answer{name}"], results[f"judge{name}"] = answered, judged
    return results


def _check_run(given: Given) -> None:
    """Refuse options that cannot go together, and a malformed gate, before any call."""
    _check_batch(given)
    if given.grading.control_runs and given.answering.rag not in (None, ""):
        raise ConfigError(
            "--control-runs answer with the built-in answerer, which is not your --rag system: "
            "their completeness would compare two answerers; run them without --rag"
        )
    if given.inputs.qa_dataset is not None:
        writing = _writing_options(given)
        if writing:
            raise ConfigError(
                f"{', '.join(writing)} write(s) the exam, and --qa-dataset names one written "
                "already: run generate with them into a folder of its own, or leave them out"
            )
    if given.summary.fail_under is not None:
        from ragexam.analysis.gates import parse_bounds

        parse_bounds(given.summary.fail_under)


def _writing_options(given: Given) -> list[str]:
    """The options given that only the writing of an exam reads (generate's)."""
    exam, default = given.exam, type(given.exam)()
    return [
        "--" + name.replace("_", "-")
        for name in ("doc_key", "sample", "per_document", "validation", "check", "multi_hop",
                     "unanswerable", "exam_temperature")
        if getattr(exam, name) != getattr(default, name)
    ]  # fmt: skip


def _whole(given: Given, results: dict[str, Result], session: Session) -> Result:
    """run's Result: the summary first, then every file (a control run's as `gold/answers`)."""
    from ragexam.llm.prices import record_total

    cost = record_total(given.out)
    session.observer.run_cost(cost)
    results["stats"] = _stats(given, session)
    paths = dict(results["stats"].paths)
    for stage, result in results.items():
        prefix = next((f"{name}/" for name in CONTROL_RUNS if stage.endswith(f"_{name}")), "")
        paths |= {prefix + name: path for name, path in result.paths.items()}
    figures: dict[str, Any] = {stage: result.figures for stage, result in results.items()}
    return Result(paths, {**figures, "cost_usd": cost.total}, results["stats"].detail)


generate = command(GENERATE, _generate)
answer = command(ANSWER, _answer)
judge = command(JUDGE, _judge)
stats = command(STATS, _stats)
compare = command(COMPARE, _compare)
calibrate = command(CALIBRATE, _calibrate)
run = command(RUN, _run)
