"""Paired comparisons of many groups at once: means, bootstrap CIs and sign-flip p-values."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ragexam.resampling import (
    EXACT_FLIPS,
    FloatArray,
    IntArray,
    block_sums,
    grouped_bootstrap_ci,
    one_blas_thread,
    value_pairs,
)

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
