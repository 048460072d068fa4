"""Every document compared at once: hand-worked values, and a one-group-at-a-time reference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ragexam.analysis.grouped import FLIP_RESAMPLES, grouped_compare, grouped_sign_flip_test
from ragexam.analysis.resampling import EXACT_FLIPS, randomization_test


def enumerated_p(differences: list[float]) -> float:
    """The sign-flip p-value by listing every sign pattern: the straightforward definition."""
    observed = abs(sum(differences))
    patterns = list(itertools.product((1, -1), repeat=len(differences)))
    sums = [abs(sum(s * d for s, d in zip(signs, differences, strict=True))) for signs in patterns]
    return sum(1 for total in sums if total >= observed - 1e-9) / len(patterns)


def grouped(groups: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Group codes and values of a list of groups, shuffled so no order is assumed."""
    codes = np.repeat(np.arange(len(groups)), [len(group) for group in groups])
    values = np.array([value for group in groups for value in group], dtype=np.float64)
    order = np.random.default_rng(0).permutation(values.size)
    return codes[order], values[order]


def test_hand_worked_figures_of_every_group() -> None:
    a = [[0, 0, 0], [0, 0, 0], [1, 0.5], [1, 1], [], [0, 2, 0, 1]]
    b = [[1, 1, 1], [1, 2, 3], [0.5, 1], [1, 1], [], [1, 0, 3, 1]]
    codes, left = grouped(a)
    _, right = grouped(b)
    figures = grouped_compare(codes, left, right, len(a))
    # [1,1,1]: only +++ and --- reach |3|, 2 of 8.  [1,2,3]: the sums are +-6, +-4, +-2, 0, 0,
    # and only +-6 reach 6.  [-0.5,+0.5] sums to 0: every pattern reaches it.  No difference, or
    # no pair: p = 1.  [1,-2,3,0]: |sum| 2 is reached by 6, 2, -4, 4, -2, -6 of the 8 patterns
    # of 1, 2, 3 (the zero flips nothing).
    assert figures["p_value"].tolist() == [2 / 8, 2 / 8, 1, 1, 1, 6 / 8]
    assert figures["mean_a"][5] == 3 / 4 and figures["mean_b"][5] == 5 / 4
    assert figures["diff"].tolist()[:4] == [1, 2, 0, 0] and figures["diff"][5] == 0.5
    assert figures["improved"].tolist() == [3, 3, 1, 0, 0, 2]
    assert figures["worse"].tolist() == [0, 0, 1, 0, 0, 1]
    assert figures["same"].tolist() == [0, 0, 0, 2, 0, 1]
    assert figures["n"].tolist() == [3, 3, 2, 2, 0, 4]
    assert (figures["ci_low"][0], figures["ci_high"][0]) == (1, 1)  # one distinct difference
    assert figures["ci_low"][1] < 2 < figures["ci_high"][1]
    assert all(math.isnan(figures[name][4]) for name in ("mean_a", "diff", "ci_low", "ci_high"))


def test_exact_p_values_match_listing_every_pattern() -> None:
    rng = np.random.default_rng(1)
    # 0.1-grid scores give many ties with the observed sum; sizes up to 12 are listed in Python
    groups = [list(rng.integers(-3, 4, size).round() / 10) for size in range(1, 13) for _ in (0, 1)]
    codes, values = grouped(groups)
    p = grouped_sign_flip_test(codes, values, len(groups))
    assert p.tolist() == pytest.approx([enumerated_p(group) for group in groups], abs=1e-12)


def test_exact_p_values_up_to_the_limit_match_the_one_group_test() -> None:
    rng = np.random.default_rng(2)
    sizes = [13, 16, 17, 19, EXACT_FLIPS, EXACT_FLIPS]
    groups = [list(rng.choice([-0.5, -0.25, 0.25, 0.5, 0.75], size)) for size in sizes]
    codes, values = grouped(groups)
    p = grouped_sign_flip_test(codes, values, len(groups))
    reference = [randomization_test(np.zeros(len(g)), np.array(g)) for g in groups]
    assert p.tolist() == pytest.approx(reference, abs=1e-12)


def test_sampled_p_values_of_many_differences() -> None:
    plus_minus = [1.0] * 26 + [-1.0] * 14  # sum 12 of 40 signs: 2B - 40 with B ~ Bin(40, 1/2)
    tail = sum(math.comb(40, j) for j in range(41) if abs(2 * j - 40) >= 12) / 2**40
    codes, values = grouped([[1.0] * 30, plus_minus])
    p = grouped_sign_flip_test(codes, values, 2, seed=3)
    # 30 equal differences: only the two extreme patterns of 2^30 reach the sum, so no resample
    # does and p is its floor
    assert p[0] == 1 / (FLIP_RESAMPLES + 1)
    error = math.sqrt(tail * (1 - tail) / FLIP_RESAMPLES)
    assert p[1] == pytest.approx(tail, abs=4 * error)
    assert grouped_sign_flip_test(codes, values, 2, seed=3).tolist() == p.tolist()


def test_sampled_p_values_of_continuous_differences_match_the_one_group_test() -> None:
    rng = np.random.default_rng(4)
    groups = [list(rng.normal(shift, 1.0, 60)) for shift in (0.0, 0.2, 0.4)]  # binned magnitudes
    codes, values = grouped(groups)
    p = grouped_sign_flip_test(codes, values, len(groups), seed=5)
    for found, group in zip(p, groups, strict=True):
        expected = randomization_test(np.zeros(len(group)), np.array(group), seed=5)
        assert found == pytest.approx(expected, abs=0.03)


def test_resampling_runs_blas_on_one_thread_and_restores_it() -> None:
    import scipy.linalg  # noqa: F401  (scipy brings a BLAS of its own: both must be pinned)
    from threadpoolctl import threadpool_info

    from ragexam.analysis.resampling import one_blas_thread

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = blas_threads()
    assert before, "numpy loaded no BLAS library"
    assert one_blas_thread(blas_threads)() == [1] * len(before)
    assert blas_threads() == before
