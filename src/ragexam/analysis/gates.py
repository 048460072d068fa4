"""Quality gates for CI: an overall figure under its bound, or a metric that surely got worse."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from ragexam.errors import ConfigError, GateFailed


def parse_bounds(text: str) -> dict[str, float]:
    """`completeness=0.7,hit_rate=0.8` as {metric: lowest acceptable value}."""
    bounds = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            bounds[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if sep and not math.isfinite(bounds[name.strip()]):  # nan: a bound nothing fails
            raise ConfigError(f"--fail-under: {part!r} needs a number as its bound")
        if not sep or not name.strip():
            raise ConfigError(f"--fail-under: {part!r} is not METRIC=VALUE, e.g. completeness=0.7")
    if not bounds:
        raise ConfigError("--fail-under needs METRIC=VALUE[,METRIC=VALUE...]")
    return bounds


def check_bounds(overall: Mapping[str, object], bounds: Mapping[str, float]) -> None:
    """Raise GateFailed naming every overall figure below its bound (or without a value).

    A metric may be named as in summary.csv (`completeness_mean`) or without `_mean`.
    """
    columns = {name: _column(name, overall) for name in bounds}
    unknown = sorted(name for name, column in columns.items() if column not in overall)
    if unknown:
        numeric = [name for name, value in overall.items() if isinstance(value, float | int)]
        raise ConfigError(
            f"--fail-under: no overall figure named {', '.join(unknown)}; "
            f"summary.csv has {', '.join(sorted(numeric))}"
        )
    failed = []
    for name, bound in bounds.items():
        value = _number(overall[columns[name]])
        if value is None:
            failed.append(f"{name} has no value (bound {bound:g})")
        elif value < bound:
            failed.append(f"{name} {value:.3f} < {bound:g}")
    if failed:
        raise GateFailed(f"quality gate failed: {'; '.join(failed)}")


SIGNIFICANT = 0.05  # a regression's randomisation p-value must be below this too


def check_regressions(table: pd.DataFrame) -> None:
    """Raise GateFailed when a metric over all questions surely got worse: its paired 95% CI
    wholly below 0, and its randomisation p-value below 0.05 (every kind together: a kind's
    own rows are shown, not gated). Both, because a difference that is mostly zeros gives a
    percentile bootstrap too narrow a CI: a gate that fired at p = 0.12 contradicted the p
    printed beside it."""
    overall = table[(table["document"] == "ALL") & (table.get("kind", "all") == "all")]
    unmeasured = sorted(overall.loc[overall["n"] == 0, "metric"])
    if unmeasured:  # a gate that measured nothing must not pass: it says so, and why
        raise ConfigError(
            f"--fail-on-regression: {', '.join(unmeasured)} have no question with a value in "
            "both runs (graded, or answered, in each): a regression cannot be measured; finish "
            "both runs' stages first"
        )
    worse = overall[(overall["ci_high"] < 0) & (overall["p_value"] < SIGNIFICANT)]
    if not worse.empty:
        named = [
            f"{row.metric} {row.diff:+.3f} (95% CI {row.ci_low:+.3f} to {row.ci_high:+.3f}, "
            f"p = {row.p_value:.3g})"
            for row in worse.itertuples()
        ]
        raise GateFailed(f"regression from run A to run B: {'; '.join(named)}")


def _column(name: str, overall: Mapping[str, object]) -> str:
    return f"{name}_mean" if name not in overall and f"{name}_mean" in overall else name


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
