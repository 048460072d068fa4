"""Resampling many groups (documents) at once: bootstrap CIs, sign-flip tests, comparisons.

One pass over all groups instead of a Python loop over them, as `stats` and `compare` need for
thousands of documents; each function matches its one-sample counterpart in resampling.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ragexam.analysis.resampling import (
    EXACT_FLIPS,
    RESAMPLES,
    FloatArray,
    IntArray,
    one_blas_thread,
)

LEVELS = 101  # at most this many distinct values per group in the per-document bootstrap
BLOCK = 64  # pairs per matrix product: 1 MB of draws at 2000 resamples, so it stays in cache
FLIP_RESAMPLES = 10000  # as randomization_test
ROWS_PER_SORT = 256  # groups counted per sort in the exact test: a few MB at 20 differences


def grouped_compare(
    groups: IntArray, a: FloatArray, b: FloatArray, n_groups: int, *, seed: int = 0
) -> dict[str, npt.NDArray[np.float64] | IntArray]:
    """compare_paired's figures for every group at once, as arrays named like its fields.

    The CI is grouped_bootstrap_ci of b - a (a Poisson bootstrap) and the p-value is
    grouped_sign_flip_test's; a group without pairs has NaN means and CI, and p = 1.
    """
    differences = b - a
    n = np.bincount(groups, minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = [np.bincount(groups, x, minlength=n_groups) / n for x in (a, b, differences)]
    low, high = grouped_bootstrap_ci(groups, differences, n_groups, seed=seed)
    signs = [differences > 0, differences < 0, differences == 0]
    improved, worse, same = (np.bincount(groups, s, minlength=n_groups).astype(int) for s in signs)
    return {
        "mean_a": means[0],
        "mean_b": means[1],
        "diff": means[2],
        "ci_low": low,
        "ci_high": high,
        "p_value": grouped_sign_flip_test(groups, differences, n_groups, seed=seed),
        "improved": improved,
        "worse": worse,
        "same": same,
        "n": n,
    }


@one_blas_thread
def grouped_sign_flip_test(
    groups: IntArray, differences: FloatArray, n_groups: int, *, seed: int = 0
) -> FloatArray:
    """randomization_test's two-sided sign-flip p-value of every group's paired differences.

    Exact over all sign patterns for a group with at most EXACT_FLIPS nonzero differences, else
    (1 + #{|T*| >= |T|}) / (FLIP_RESAMPLES + 1); p = 1 for a group without a nonzero difference.
    Ties within a rounding tolerance count, as in randomization_test.
    """
    n = np.bincount(groups, minlength=n_groups)
    nonzero = differences != 0
    flips = np.bincount(groups[nonzero], minlength=n_groups)
    largest = np.zeros(n_groups)
    np.maximum.at(largest, groups, np.abs(differences))
    tolerance = 1e-12 * np.maximum(1.0, largest) * n
    threshold = np.abs(np.bincount(groups, differences, minlength=n_groups)) - tolerance
    p = np.ones(n_groups)
    order = np.argsort(groups[nonzero], kind="stable")
    group, magnitude = groups[nonzero][order], np.abs(differences[nonzero][order])
    for size in range(1, EXACT_FLIPS + 1):
        chosen = np.flatnonzero((flips == size) & (threshold > 0))
        rows = (flips[group] == size) & (threshold[group] > 0)
        matrix = magnitude[rows].reshape(chosen.size, size)
        p[chosen] = _exact_share(matrix, threshold[chosen])
    sampled = (flips > EXACT_FLIPS) & (threshold > 0)
    if sampled.any():
        rows = sampled[group]
        p[sampled] = _sampled_p(group[rows], magnitude[rows], threshold[sampled], seed)
    return p


def _sign_sums(matrix: FloatArray) -> FloatArray:
    """Each row's sums of +-m over all 2^columns sign patterns."""
    columns = matrix.shape[1]
    patterns = (np.arange(2**columns)[:, None] >> np.arange(columns)) & 1
    return matrix @ (1.0 - 2.0 * patterns.T)


def _exact_share(matrix: FloatArray, threshold: FloatArray) -> FloatArray:
    """Per row, the share of sign patterns whose |sum| reaches the row's threshold (> 0).

    Meet in the middle: the sums of each half of the columns, and for every left sum l the
    number of right sums r >= threshold - l, found by one sort per row; |sum| >= t counts twice
    the patterns with sum >= t, since flipping every sign negates the sum.
    """
    half = matrix.shape[1] // 2
    shares = []
    for first in range(0, matrix.shape[0], ROWS_PER_SORT):
        rows = slice(first, first + ROWS_PER_SORT)
        left, right = _sign_sums(matrix[rows, :half]), _sign_sums(matrix[rows, half:])
        needed = threshold[rows, None] - left
        # Thresholds first, so that a stable sort puts each before the right sums equal to it.
        order = np.argsort(np.concatenate([needed, right], axis=1), axis=1, kind="stable")
        is_right = order >= needed.shape[1]
        right_before = np.cumsum(is_right, axis=1) - is_right
        reached = np.where(is_right, 0, right.shape[1] - right_before).sum(axis=1)
        shares.append(2 * reached / (left.shape[1] * right.shape[1]))
    return np.concatenate(shares) if shares else np.zeros(0)


def _sampled_p(
    group: IntArray, magnitude: FloatArray, threshold: FloatArray, seed: int
) -> FloatArray:
    """(1 + #{|T*| >= threshold}) / (resamples + 1) per group, under random signs.

    Per distinct (group, |d|) pair u of count c the resampled sum gains u * (2 Bin(c, 1/2) - c);
    above LEVELS distinct magnitudes they are binned as in grouped_bootstrap_ci.
    """
    pair_group, pair_value, count = value_pairs(group, magnitude)
    rng = np.random.default_rng(seed)

    def draw(counts: IntArray) -> IntArray:
        return rng.binomial(counts[:, None], 0.5, (counts.size, FLIP_RESAMPLES))

    centre = np.bincount(pair_group, pair_value * count)[np.unique(pair_group)]
    reached, first = np.zeros(threshold.size), 0
    for _, weighted in block_sums(pair_group, pair_value, count, draw):
        last = first + weighted.shape[0]
        statistic = np.abs(2 * weighted - centre[first:last, None])
        reached[first:last] = np.count_nonzero(statistic >= threshold[first:last, None], axis=1)
        first = last
    return (1 + reached) / (FLIP_RESAMPLES + 1)


# -- the per-group bootstrap ---------------------------------------------


def value_pairs(groups: IntArray, values: FloatArray) -> tuple[IntArray, FloatArray, IntArray]:
    """Distinct (group, value) pairs sorted by group, with their mean value and their count.

    Above LEVELS distinct values, values are binned first (equal width); a pair keeps the mean
    of its own rows, so every group's mean is unchanged and a value moves by less than a bin.
    """
    support, level = np.unique(values, return_inverse=True)
    levels = support.size
    if levels > LEVELS:
        scaled = (values - support[0]) / (support[-1] - support[0]) * LEVELS
        level, levels = np.minimum(scaled.astype(np.int64), LEVELS - 1), LEVELS
    keys, inverse, counts = np.unique(
        groups * levels + level, return_inverse=True, return_counts=True
    )
    return keys // levels, np.bincount(inverse, values) / counts, counts


@one_blas_thread
def grouped_bootstrap_ci(
    groups: IntArray,
    values: FloatArray,
    n_groups: int,
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = 0.95,
) -> tuple[FloatArray, FloatArray]:
    """Percentile bootstrap CI of the mean of every group at once; (nan, nan) when empty.

    A Poisson bootstrap (Hanley & MacGibbon 2006): a resample gives each distinct
    (group, value) pair a count drawn from Poisson(its count), and the group's resampled mean
    is sum(value * count) / sum(count); resamples that draw nothing are left out. The cost is
    O(pairs x resamples), never O(rows x resamples). Pairs of different groups with the same
    count and the same position in their group share draws: each group's own resamples stay
    independent, and only a few thousand rows of Poisson draws are made.
    """
    low, high = np.full(n_groups, np.nan), np.full(n_groups, np.nan)
    if values.size == 0:
        return low, high
    pair_group, pair_value, count = value_pairs(groups, values)
    sizes = np.bincount(pair_group, minlength=n_groups)
    single = sizes[pair_group] == 1  # one distinct value: every resample has that mean
    low[pair_group[single]] = high[pair_group[single]] = pair_value[single]
    many = ~single
    if many.any():
        tail = (1 - level) / 2
        resampled, bounds = _resample(
            pair_group[many], pair_value[many], count[many], seed, resamples, (tail, 1 - tail)
        )
        low[resampled], high[resampled] = bounds
    return low, high


def _resample(
    pair_group: IntArray,
    pair_value: FloatArray,
    count: IntArray,
    seed: int,
    resamples: int,
    quantiles: tuple[float, float],
) -> tuple[IntArray, tuple[FloatArray, FloatArray]]:
    """The groups of these pairs and the quantiles of their Poisson-resampled means."""
    rng = np.random.default_rng(seed)
    low, high = [], []
    for totals, sums in block_sums(
        pair_group,
        pair_value,
        count,
        lambda keys: rng.poisson(keys[:, None], (keys.size, resamples)),
    ):
        with np.errstate(invalid="ignore", divide="ignore"):
            block_low, block_high = _row_quantiles(sums / totals, quantiles)
        low.append(block_low)
        high.append(block_high)
    starts = np.flatnonzero(np.r_[True, pair_group[1:] != pair_group[:-1]])
    return pair_group[starts], (np.concatenate(low), np.concatenate(high))


def block_sums(
    pair_group: IntArray,
    pair_value: FloatArray,
    count: IntArray,
    draw: Callable[[IntArray], npt.NDArray[Any]],
) -> Iterator[tuple[FloatArray, FloatArray]]:
    """Per run of whole groups (sorted by group): each group's draw totals and value-weighted sums.

    `draw(counts)` returns one row of resampled counts per entry of `counts`. Pairs of different
    groups with the same count and the same position in their group share a row of draws: each
    group's own resamples stay independent, and only a few thousand rows are drawn.
    """
    starts = np.flatnonzero(np.r_[True, pair_group[1:] != pair_group[:-1]])
    bounds = np.r_[starts, pair_group.size]
    slot = np.arange(pair_group.size) - np.repeat(starts, np.diff(bounds))
    width = int(slot.max()) + 1
    keys, pool_row = np.unique(count * width + slot, return_inverse=True)
    pool = draw(keys // width).astype(np.float64)
    group_of = np.repeat(np.arange(starts.size), np.diff(bounds))  # 0, 0, 1, 1, 1, 2, ...
    for first, last in _blocks(bounds, BLOCK):
        rows, groups = slice(bounds[first], bounds[last]), last - first
        # One matrix product gives each group's draw totals and weighted sums: BLAS is faster
        # than summing runs of rows, even with the zeros of the block's other groups.
        weights = np.zeros((2 * groups, bounds[last] - bounds[first]))
        columns = np.arange(weights.shape[1])
        weights[group_of[rows] - first, columns] = 1.0
        weights[groups + group_of[rows] - first, columns] = pair_value[rows]
        sums = weights @ pool[pool_row[rows]]
        yield sums[:groups], sums[groups:]


def _blocks(bounds: IntArray, size: int) -> Iterator[tuple[int, int]]:
    """Runs of whole groups, first..last-1, of at most `size` pairs (or a single group)."""
    first, groups = 0, bounds.size - 1
    while first < groups:
        fits = int(np.searchsorted(bounds, bounds[first] + size, side="right")) - 1
        last = min(max(first + 1, fits), groups)
        yield first, last
        first = last


def _row_quantiles(
    means: FloatArray, quantiles: tuple[float, float]
) -> tuple[FloatArray, FloatArray]:
    """Each row's quantiles, leaving out NaN, by numpy's default linear interpolation."""
    ordered = np.sort(means, axis=1)  # NaN sorts last
    top = np.maximum((~np.isnan(ordered)).sum(axis=1) - 1, 0)
    rows = np.arange(ordered.shape[0])
    found = []
    for quantile in quantiles:
        position = top * quantile
        below = np.floor(position).astype(np.int64)
        lower, upper = ordered[rows, below], ordered[rows, np.minimum(below + 1, top)]
        found.append(lower + (position - below) * (upper - lower))
    return found[0], found[1]
