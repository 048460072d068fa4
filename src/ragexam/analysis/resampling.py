"""Seeded resampling statistics over scores: bootstrap CIs and paired randomisation tests."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import ParamSpec, TypeVar, cast

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Values = Sequence[float] | FloatArray

RESAMPLES = 2000

Params = ParamSpec("Params")
Result = TypeVar("Result")


@functools.cache
def _threadpoolctl() -> ModuleType:
    """threadpoolctl, imported leaving the environment as it was: its import sets
    KMP_DUPLICATE_LIB_OK=True (OpenMP's check against two runtimes), and the process is the
    API's caller's."""
    before = os.environ.get(KMP)
    import threadpoolctl

    if before is None:
        os.environ.pop(KMP, None)
    else:
        os.environ[KMP] = before
    return cast(ModuleType, threadpoolctl)


KMP = "KMP_DUPLICATE_LIB_OK"


def one_blas_thread(function: Callable[Params, Result]) -> Callable[Params, Result]:
    """Run `function` with BLAS on one thread, then restore the thread count.

    Its matrix products are small, so a second thread gains nothing; and when another process
    keeps the other core busy, BLAS threads wait on each other: 3-5x slower, measured.
    """

    @functools.wraps(function)
    def pinned(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        # Found anew each time (about a millisecond): scipy may have loaded a BLAS of its own since.
        with _threadpoolctl().threadpool_limits(limits=1, user_api="blas"):
            return function(*args, **kwargs)

    return pinned


# -- resampling statistics ------------------------------------------------------------------------
# A mean's bootstrap (and a sign-flip test) depends only on the distinct values and their counts,
# so resampling draws counts per distinct value: O(resamples x distinct), never O(resamples x n).

# Up to this many distinct values the resampling is exact.
MAX_SUPPORT = 256
# Above it, values are merged into groups: a new group starts whenever either the value's
# equal-width bin or its equal-count bin changes (at most 2 * GROUPS - 1 groups), and each value
# is replaced by its group's mean. The sample mean is unchanged, each value moves by at most
# (max - min) / GROUPS, and dense regions and outliers both keep narrow groups.
GROUPS = 128


def _finite(values: Values, name: str = "values") -> FloatArray:
    """The values as a 1-D float array, refusing NaN and infinities."""
    array = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contain NaN or infinite values")
    return array


def _merge(support: FloatArray, counts: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
    """Merge sorted distinct values into at most 2 * GROUPS - 1 groups, kept at their means."""
    span = support[-1] - support[0]
    by_width = np.minimum(((support - support[0]) / span * GROUPS).astype(np.int64), GROUPS - 1)
    before = np.cumsum(counts) - counts
    by_count = before * GROUPS // int(counts.sum())
    starts = np.ones(support.size, dtype=bool)
    starts[1:] = (np.diff(by_width) != 0) | (np.diff(by_count) != 0)
    group = np.cumsum(starts) - 1
    weights = np.bincount(group, weights=counts.astype(np.float64)).astype(np.float64)
    sums = np.bincount(group, weights=support * counts).astype(np.float64)
    return sums / weights, weights


def _support(values: FloatArray) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Distinct values and their counts, merged into groups when there are too many."""
    support, counts = np.unique(values, return_counts=True)
    if support.size <= MAX_SUPPORT:
        return support, counts.astype(np.int64)
    merged, weights = _merge(support, counts.astype(np.int64))
    return merged, np.rint(weights).astype(np.int64)


def _check(resamples: int, level: float = 0.95) -> None:
    """Refuse a resample count below 1 or a confidence level outside (0, 1)."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be strictly between 0 and 1, got {level}")


@one_blas_thread
def bootstrap_ci(
    values: Values, *, seed: int = 0, resamples: int = 2000, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean; (nan, nan) when there are no values.

    Resamples are drawn as multinomial counts over the distinct values (an exact bootstrap of
    the mean); above MAX_SUPPORT distinct values they are first merged into groups (see GROUPS).
    """
    _check(resamples, level)
    array = _finite(values)
    if array.size == 0:
        return math.nan, math.nan
    support, counts = _support(array)
    if support.size == 1:
        return float(support[0]), float(support[0])
    n = int(counts.sum())
    draws = np.random.default_rng(seed).multinomial(n, counts / n, size=resamples)
    means = draws @ support / n
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def _differences(a: Values, b: Values) -> FloatArray:
    """The paired differences b - a, refusing inputs of different lengths."""
    left, right = _finite(a, "a"), _finite(b, "b")
    if left.size != right.size:
        raise ValueError(f"paired inputs differ in length: {left.size} and {right.size}")
    return right - left


def paired_bootstrap_ci(
    a: Values,
    b: Values,
    *,
    seed: int = 0,
    resamples: int = 2000,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of mean(b - a), resampling pairs."""
    return bootstrap_ci(_differences(a, b), seed=seed, resamples=resamples, level=level)


# Up to this many nonzero differences every sign pattern is enumerated (2^20 sums, 8 MB).
EXACT_FLIPS = 20


def _all_sign_sums(magnitudes: FloatArray) -> FloatArray:
    """The sums of +-m over all 2^len(magnitudes) sign patterns."""
    sums = np.zeros(1)
    for magnitude in magnitudes:
        sums = np.concatenate([sums + magnitude, sums - magnitude])
    return sums


def _random_sign_sums(magnitudes: FloatArray, seed: int, resamples: int) -> FloatArray:
    """Sums of +-m under random signs: per distinct |d| = u of count c, u * (2 Bin(c, 1/2) - c)."""
    support, counts = _support(magnitudes)
    # One row per distinct value: numpy reuses a binomial's setup while its count stays the same.
    column = counts[:, np.newaxis]
    positive = np.random.default_rng(seed).binomial(column, 0.5, size=(support.size, resamples))
    return support @ (2 * positive - column)


@one_blas_thread
def randomization_test(
    a: Values,
    b: Values,
    *,
    seed: int = 0,
    resamples: int = 10000,
) -> float:
    """Two-sided paired sign-flip randomisation test of mean(b - a) = 0; returns the p-value.

    Exact over all 2^m sign patterns when m <= EXACT_FLIPS differences are nonzero, else
    p = (1 + #{|T*| >= |T|}) / (resamples + 1). No nonzero difference (including no pairs at
    all) gives p = 1.0: there is no evidence of any difference.
    """
    _check(resamples)
    differences = _differences(a, b)
    magnitudes = np.abs(differences[differences != 0])
    if magnitudes.size == 0:
        return 1.0
    observed = abs(float(differences.sum()))
    # Sums of the same terms in another order differ by rounding; they must still count as ties.
    tolerance = 1e-12 * max(1.0, float(magnitudes.max())) * differences.size
    if magnitudes.size <= EXACT_FLIPS:
        sums = _all_sign_sums(magnitudes)
        return float(np.count_nonzero(np.abs(sums) >= observed - tolerance) / sums.size)
    sums = _random_sign_sums(magnitudes, seed, resamples)
    return float((1 + np.count_nonzero(np.abs(sums) >= observed - tolerance)) / (resamples + 1))


@dataclass(frozen=True)
class Comparison:
    """Paired comparison of run B against run A over the same items."""

    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    improved: int
    worse: int
    same: int
    n: int


def compare_paired(a: Values, b: Values, *, seed: int = 0) -> Comparison:
    """Means, mean(b - a) with its paired bootstrap CI, randomisation p-value and win counts."""
    differences = _differences(a, b)
    low, high = paired_bootstrap_ci(a, b, seed=seed)
    empty = differences.size == 0
    return Comparison(
        mean_a=math.nan if empty else float(np.mean(np.asarray(a, dtype=np.float64))),
        mean_b=math.nan if empty else float(np.mean(np.asarray(b, dtype=np.float64))),
        diff=math.nan if empty else float(differences.mean()),
        ci_low=low,
        ci_high=high,
        p_value=randomization_test(a, b, seed=seed),
        improved=int(np.count_nonzero(differences > 0)),
        worse=int(np.count_nonzero(differences < 0)),
        same=int(np.count_nonzero(differences == 0)),
        n=int(differences.size),
    )
