"""The Python API's `run`: every stage in order, as `ragexam run` runs them."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragexam import api
from ragexam.api import PathLike, Result, answer, dry_run_result, generate, judge, stats
from ragexam.commands import CONTROL_RUNS, check_run, run_setup

if TYPE_CHECKING:
    from ragexam.stages.dryrun import Estimate

STAGES = ("generate", "answer", "judge", "stats")


def run(
    chroma: PathLike | None = None,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    out: PathLike = "outputs",
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    max_error_rate: float | None = None,
    force: bool = False,
    controls: bool = False,
    judge_controls: int = 10,
    dry_run: bool = False,
    fail_under: str | None = None,
    **options: Any,
) -> Result:
    """Every stage in order, as `ragexam run`; options go to the stages that take them.

    `controls=True` adds the gold and closed-book control runs; `judge_controls` is judge's
    `controls`. Figures hold each stage's, and `cost_usd`, the whole run's.
    """
    common: dict[str, Any] = {"out": out, "limit": limit, "concurrency": concurrency}
    common |= {"model": model, "max_error_rate": max_error_rate, "force": force}
    store: dict[str, Any] = {"chroma": chroma, "chroma_url": chroma_url, "collection": collection}
    own = {name: _only(options, name) for name in STAGES}
    own["stats"].pop("split", None)  # as on the command line, run's split is generate's fraction
    unknown = set(options) - set().union(*own.values())
    if unknown:
        raise TypeError(f"run() got unexpected options: {', '.join(sorted(unknown))}")
    given = {**_defaults(), **options, **store, **common, "controls": controls}
    given |= {"judge_controls": judge_controls, "fail_under": fail_under}
    check_run(given)
    if dry_run:
        return dry_run_result(_estimate_run(given))
    from ragexam.stages.generate import QA_FILE

    own["judge"]["controls"] = judge_controls
    results = {
        "generate": generate(**store, **common, **own["generate"]),
        "answer": answer(**store, **common, **own["answer"]),
        "judge": judge(**common, **own["judge"]),
    }
    for folder, context in CONTROL_RUNS.items() if controls else ():
        where = {**common, "out": Path(out) / folder, "qa_dataset": Path(out) / QA_FILE}
        answering = {**store, **own["answer"], **where, "rag": None, "context": context}
        results[f"answer_{folder}"] = answer(**answering)
        results[f"judge_{folder}"] = judge(**{**own["judge"], **where, "controls": 0})
    results["stats"] = stats(out=out, fail_under=fail_under, **own["stats"])
    return _whole(Path(out), results)


def _whole(out: Path, results: dict[str, Result]) -> Result:
    """run's Result: every file (a control run's as `gold/answers`), figures by stage."""
    from ragexam.llm.prices import record_total

    paths: dict[str, Path] = {}
    for stage, result in results.items():
        prefix = next((f"{f}/" for f in CONTROL_RUNS if stage.endswith(f"_{f}")), "")
        paths |= {prefix + name: path for name, path in result.paths.items()}
    figures: dict[str, Any] = {stage: result.figures for stage, result in results.items()}
    return Result(paths, {**figures, "cost_usd": record_total(out).total})


def _estimate_run(given: dict[str, Any]) -> list[Estimate]:
    from ragexam.stages.dryrun import estimate_run

    settings, first, second, third = run_setup(given)
    return estimate_run(settings, first, second, third, given["controls"])


def _defaults() -> dict[str, Any]:
    """Every stage function's options at their defaults: what run() was not given."""
    defaults: dict[str, Any] = {}
    for stage in STAGES:
        for name, parameter in inspect.signature(getattr(api, stage)).parameters.items():
            defaults.setdefault(name, parameter.default)
    return defaults


def _only(options: dict[str, Any], stage: str) -> dict[str, Any]:
    """The options that the stage's function takes by keyword."""
    function = getattr(api, stage)
    accepted = inspect.signature(function).parameters
    return {name: value for name, value in options.items() if name in accepted}
