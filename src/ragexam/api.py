"""The Python API: each command as a function that takes the CLI's options as keyword arguments.

    import ragexam
    exam = ragexam.generate(chroma="examples/chroma", limit=20)
    answers = ragexam.answer(chroma="examples/chroma", rag=my_chain)  # a callable or Runnable
    ragexam.judge()
    report = ragexam.stats()
    report.frame()  # summary_by_document.csv as a DataFrame

Each returns a `Result`: the files written, the figures, and `.frame()`. They run no progress bar
and print nothing. Inside a running event loop (Jupyter), a stage runs in a worker thread with
its own loop, so the call still simply returns its result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ragexam.commands import answer_setup, generate_setup, judge_setup
from ragexam.config import AnswerContext, Scale, Settings, StructuredMethod

if TYPE_CHECKING:
    import pandas as pd

    from ragexam.stages.dryrun import Estimate
    from ragexam.stages.runner import StageResult

T = TypeVar("T")
PathLike = str | Path


@dataclass(frozen=True)
class Result:
    """What a command wrote (`paths`, by name), its figures, and `.frame()` to load a CSV."""

    paths: dict[str, Path]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        """The main file written (the first of `paths`)."""
        return next(iter(self.paths.values()))

    def frame(self, name: str | None = None) -> pd.DataFrame:
        """A CSV written, as a pandas DataFrame; the main one unless `name` says which."""
        import pandas as pd

        path = self.paths[name] if name else self.path
        frame = pd.read_csv(path, encoding="utf-8-sig")
        for column in frame.columns:
            if not pd.api.types.is_numeric_dtype(frame[column]):
                frame[column] = frame[column].map(_unescape)
        return frame


def _unescape(value: Any) -> Any:
    from ragexam.io.csvfile import unescape_cell

    return unescape_cell(value) if isinstance(value, str) else value


def _in_own_loop(call: Callable[[], T]) -> T:
    """Run `call` here, or in a worker thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ragexam") as pool:
        return pool.submit(call).result()


def _stage(result: StageResult, name: str, settings: Settings, stage: str | None = None) -> Result:
    """The stage's Result, its cost recorded as the CLI records it; raises on too many errors."""
    from ragexam.llm.prices import record_cost
    from ragexam.stages.runner import check_error_rate

    cost, _ = record_cost(result.path.parent, stage or name, settings)
    check_error_rate(result.path, settings.max_error_rate)
    figures = {**result.outcome.record(), "skipped": result.skipped, "cost_usd": cost}
    return Result({name: result.path}, figures)


def dry_run_result(estimates: list[Estimate]) -> Result:
    """What a dry run found: no file, the estimates per stage, and their calls and cost."""
    costs = [estimate.cost_usd for estimate in estimates]
    total = None if None in costs else sum(cost or 0.0 for cost in costs)
    figures = {"estimates": [estimate.record() for estimate in estimates], "cost_usd": total}
    return Result({}, {**figures, "calls": sum(estimate.calls for estimate in estimates)})


def generate(
    chroma: PathLike | None = None,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    out: PathLike = "outputs",
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    doc_key: str | None = None,
    max_error_rate: float | None = None,
    structured_output: StructuredMethod | str | None = None,
    force: bool = False,
    max_chunk_chars: int = 8000,
    chroma_tenant: str | None = None,
    chroma_database: str | None = None,
    sample: int | None = None,
    per_document: int | None = None,
    seed: int = 0,
    split: float | None = None,
    check: bool = False,
    rpm: int | None = None,
    tpm: int | None = None,
    dry_run: bool = False,
) -> Result:
    """Write qa_dataset.csv: one question and ground-truth answer per chunk."""
    settings, options = generate_setup(locals())
    if dry_run:
        from ragexam.stages.dryrun import estimate_generate

        return dry_run_result([estimate_generate(settings, options)])
    from ragexam.stages.generate import run_generate

    result = _in_own_loop(lambda: run_generate(settings, options))
    return _stage(result, "qa_dataset", settings, "generate")


def answer(
    chroma: PathLike | None = None,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    out: PathLike = "outputs",
    qa_dataset: PathLike | None = None,
    k: int = 5,
    embedding: str | None = None,
    rag: Any = None,
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    max_error_rate: float | None = None,
    force: bool = False,
    context: AnswerContext | str = AnswerContext.retrieved,
    trust_store_endpoint: bool = False,
    rag_timeout: float | None = None,
    texts: bool = True,
    max_chunk_chars: int = 8000,
    chroma_tenant: str | None = None,
    chroma_database: str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    dry_run: bool = False,
) -> Result:
    """Write answers.csv; `rag` is "module:callable", or a callable or Runnable object."""
    settings, options = answer_setup(locals())
    if dry_run:
        from ragexam.stages.dryrun import estimate_answer

        return dry_run_result([estimate_answer(settings, options)])
    from ragexam.stages.answer import run_answer

    result = _in_own_loop(lambda: run_answer(settings, options))
    return _stage(result, "answers", settings, "answer")


def judge(
    *,
    out: PathLike = "outputs",
    qa_dataset: PathLike | None = None,
    answers: PathLike | None = None,
    samples: int = 1,
    temperature: float | None = None,
    scale: Scale | str = Scale.unit,
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    max_error_rate: float | None = None,
    structured_output: StructuredMethod | str | None = None,
    force: bool = False,
    controls: int = 10,
    seed: int = 0,
    rpm: int | None = None,
    tpm: int | None = None,
    dry_run: bool = False,
) -> Result:
    """Write judgments.csv, and judge_controls.csv unless `controls=0`."""
    settings, options = judge_setup(locals())
    if dry_run:
        from ragexam.stages.dryrun import estimate_judge

        return dry_run_result(estimate_judge(settings, options))
    from ragexam.stages.judge import run_controls, run_judge

    result = _in_own_loop(lambda: run_judge(settings, options))
    if not controls:
        return _stage(result, "judgments", settings, "judge")
    known = _in_own_loop(lambda: run_controls(settings, options))
    checks = _stage(known, "controls", settings, "judge_controls")
    graded = _stage(result, "judgments", settings, "judge")
    return Result({**graded.paths, **checks.paths}, {**graded.figures, "controls": checks.figures})


def stats(
    *,
    out: PathLike = "outputs",
    k: int | None = None,
    seed: int = 0,
    split: str | None = None,
    exclude_flagged: bool = False,
    fail_under: str | None = None,
) -> Result:
    """Write the summaries and report.html; figures are the overall row (`document` ALL).

    `fail_under="completeness=0.7,hit_rate=0.8"` raises GateFailed after writing them.
    """
    from ragexam.analysis.gates import check_bounds, parse_bounds
    from ragexam.analysis.stats import StatsOptions, run_stats

    bounds = parse_bounds(fail_under) if fail_under is not None else None
    from ragexam.report.html import write_report

    result = run_stats(StatsOptions(Path(out), k, seed, split, exclude_flagged))
    write_report(result, result.paths["report"])
    figures = {str(name): value for name, value in result.overall.iloc[0].items()}
    if bounds:
        check_bounds(figures, bounds)
    return Result(dict(result.paths), {**figures, "k": result.k})


def compare(
    run_a: PathLike,
    run_b: PathLike,
    *,
    out: PathLike | None = None,
    seed: int = 0,
    fail_on_regression: bool = False,
) -> Result:
    """Write comparison.csv: paired differences per metric and document; figures hold warnings."""
    from ragexam.analysis.compare import run_compare
    from ragexam.analysis.gates import check_regressions

    result = run_compare(Path(run_a), Path(run_b), Path(out or run_b), seed)
    if fail_on_regression:
        check_regressions(result.table)
    return Result({"comparison": result.path}, {"warnings": list(result.warnings)})
