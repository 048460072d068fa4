"""Metrics against hand-derived values, trec_eval (via ir-measures) and exact null distributions."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import astuple

import ir_measures
import numpy as np
import pytest
from ir_measures import AP, RR, R, Success, nDCG

from ragexam.analysis.metrics import (
    RetrievalScores,
    average_precision,
    f1,
    hit,
    ndcg,
    precision,
    recall,
    reciprocal_rank,
    score_rank,
    score_ranking,
)
from ragexam.analysis.resampling import (
    bootstrap_ci,
    compare_paired,
    paired_bootstrap_ci,
    randomization_test,
)

ZERO = RetrievalScores(hit=0.0, rr=0.0, ap=0.0, ndcg=0.0, precision=0.0, recall=0.0, f1=0.0)
# 1 / log2(rank + 1) for ranks 1..5, worked out once: log2 3 = 1.5849625007, log2 5 = 2.3219280949.
DISCOUNT = {1: 1.0, 2: 0.6309297535714575, 3: 0.5, 4: 0.43067655807339306, 5: 0.38685280723454163}


def approx(scores: RetrievalScores) -> object:
    """Matches a RetrievalScores whose fields all lie within 1e-12 of these."""
    return _Near(scores)


class _Near:
    """Equal to a RetrievalScores whose fields all lie within 1e-12 of the expected ones."""

    def __init__(self, expected: RetrievalScores) -> None:
        self.expected = expected

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetrievalScores) and astuple(other) == pytest.approx(
            astuple(self.expected), abs=1e-12
        )

    def __repr__(self) -> str:
        return f"~{self.expected!r}"


# -- retrieval metrics: hand-derived values -------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "rr", "ndcg_value"),
    [
        (1, 1.0, 1.0),
        (2, 0.5, DISCOUNT[2]),
        (3, 1 / 3, 0.5),
        (4, 0.25, DISCOUNT[4]),
        (5, 0.2, DISCOUNT[5]),
    ],
)
def test_single_relevant_chunk_at_each_rank_of_five(
    rank: int, rr: float, ndcg_value: float
) -> None:
    # One relevant item: AP = precision at its rank = 1/r; P@5 = 1/5; F1 = 2(1/5)(1)/(6/5) = 1/3.
    expected = RetrievalScores(
        hit=1.0, rr=rr, ap=rr, ndcg=ndcg_value, precision=0.2, recall=1.0, f1=0.3333333333333333
    )
    assert score_rank(rank, 5) == approx(expected)
    assert score_ranking([0] * (rank - 1) + [1], 5) == approx(expected)


@pytest.mark.parametrize(("rank", "k"), [(None, 5), (6, 5), (2, 1), (None, 1)])
def test_a_miss_scores_zero_everywhere(rank: int | None, k: int) -> None:
    assert score_rank(rank, k) == ZERO


def test_cutoff_one() -> None:
    ones = RetrievalScores(hit=1.0, rr=1.0, ap=1.0, ndcg=1.0, precision=1.0, recall=1.0, f1=1.0)
    assert score_rank(1, 1) == ones
    assert score_ranking([1, 0, 0], 1) == ones
    assert score_ranking([0, 1], 1) == ZERO


def test_cutoff_longer_than_the_list_still_divides_precision_by_k() -> None:
    # [0, 1] at k = 10: P = 1/10, R = 1, F1 = 2(0.1)(1)/1.1 = 2/11.
    expected = RetrievalScores(
        hit=1.0, rr=0.5, ap=0.5, ndcg=DISCOUNT[2], precision=0.1, recall=1.0, f1=0.18181818181818182
    )
    assert score_ranking([0, 1], 10) == approx(expected)
    assert score_rank(2, 10).f1 == pytest.approx(2 / 11, abs=1e-15)


def test_empty_list_scores_zero() -> None:
    assert score_ranking([], 3, n_relevant=2) == ZERO
    assert score_ranking([], 1) == ZERO


def test_two_relevant_both_retrieved() -> None:
    # [1,0,1,0,0], R = 2: AP = (1/1 + 2/3)/2 = 5/6; DCG = 1 + 1/2; IDCG = 1 + 0.63092975357;
    # P = 2/5, R = 1, F1 = 2(0.4)(1)/1.4 = 4/7.
    expected = RetrievalScores(
        hit=1.0,
        rr=1.0,
        ap=0.8333333333333334,
        ndcg=0.9197207891481876,
        precision=0.4,
        recall=1.0,
        f1=0.5714285714285714,
    )
    assert score_ranking([1, 0, 1, 0, 0], 5, n_relevant=2) == approx(expected)


def test_three_relevant_one_never_retrieved() -> None:
    # [0,1,0,1,0,0], R = 3, k = 5: AP = (1/2 + 2/4)/3 = 1/3; DCG = 0.63092975357 + 0.43067655807
    # = 1.06160631164; IDCG = 1 + 0.63092975357 + 0.5 = 2.13092975357; P = 2/5, R = 2/3,
    # F1 = 2(0.4)(2/3)/(0.4 + 2/3) = 0.5.
    expected = RetrievalScores(
        hit=1.0,
        rr=0.5,
        ap=0.3333333333333333,
        ndcg=0.49818925746641285,
        precision=0.4,
        recall=0.6666666666666666,
        f1=0.5,
    )
    assert score_ranking([0, 1, 0, 1, 0, 0], 5, n_relevant=3) == approx(expected)


def test_more_relevant_than_the_cutoff_uses_an_ideal_of_k_items() -> None:
    # [1,1,1], R = 3, k = 2: ideal DCG holds min(3, 2) items, so NDCG = 1; AP = (1 + 1)/3;
    # P = 1, R = 2/3, F1 = 2(1)(2/3)/(5/3) = 0.8.
    expected = RetrievalScores(
        hit=1.0,
        rr=1.0,
        ap=0.6666666666666666,
        ndcg=1.0,
        precision=1.0,
        recall=0.6666666666666666,
        f1=0.8,
    )
    assert score_ranking([1, 1, 1], 2, n_relevant=3) == approx(expected)


def test_relevant_items_only_below_the_cutoff_count_for_nothing() -> None:
    assert score_ranking([0, 0, 1, 1], 2, n_relevant=2) == ZERO


def test_each_function_alone() -> None:
    # The ranking of test_three_relevant_one_never_retrieved, metric by metric.
    rels, k, n = [0, 1, 0, 1, 0, 0], 5, 3
    assert (hit(rels, k), reciprocal_rank(rels, k), precision(rels, k)) == (1.0, 0.5, 0.4)
    assert average_precision(rels, k, n) == pytest.approx(0.3333333333333333, abs=1e-12)
    assert ndcg(rels, k, n) == pytest.approx(0.49818925746641285, abs=1e-12)
    assert recall(rels, k, n) == pytest.approx(0.6666666666666666, abs=1e-12)
    assert f1(rels, k, n) == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize(
    ("rels", "k", "n_relevant"),
    [([1], 0, 1), ([1], 1, 0), ([2], 3, 1), ([1, 1], 3, 1), ([-1], 1, 1)],
)
def test_invalid_rankings_are_refused(rels: list[int], k: int, n_relevant: int) -> None:
    with pytest.raises(ValueError):
        score_ranking(rels, k, n_relevant)


def test_rank_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="1-based"):
        score_rank(0, 5)


# -- retrieval metrics: cross-check against trec_eval ---------------------------------------------


def random_query(rng: random.Random) -> tuple[list[int], int, int]:
    """A ranked list of 0/1 labels of length 0..12, its R in 1..3 and a cutoff in 1..10."""
    length, n_relevant, k = rng.randint(0, 12), rng.randint(1, 3), rng.randint(1, 10)
    retrieved = rng.randint(0, min(n_relevant, length))
    positions = set(rng.sample(range(length), retrieved))
    return [1 if i in positions else 0 for i in range(length)], n_relevant, k


def trec_inputs(
    qid: str, rels: list[int], n_relevant: int, rng: random.Random
) -> tuple[list[ir_measures.Qrel], list[ir_measures.ScoredDoc]]:
    """Qrels and a run for one query: unretrieved relevant docs fill R, some misses unjudged."""
    # Strictly decreasing scores: trec_eval re-sorts ties by docid, which would reorder the list.
    run = [ir_measures.ScoredDoc(qid, f"d{i}", 100.0 - i) for i in range(len(rels))]
    qrels = [ir_measures.Qrel(qid, f"d{i}", 1) for i, label in enumerate(rels) if label]
    qrels += [ir_measures.Qrel(qid, f"u{i}", 1) for i in range(n_relevant - sum(rels))]
    # trec_eval counts an unjudged retrieved doc as not relevant, so judging it 0 changes nothing.
    qrels += [
        ir_measures.Qrel(qid, f"d{i}", 0)
        for i, lb in enumerate(rels)
        if not lb and rng.random() < 0.5
    ]
    return qrels, run


def test_metrics_match_trec_eval_on_random_runs() -> None:
    rng = random.Random(20240611)
    queries = {f"q{i}": random_query(rng) for i in range(400)}
    by_k: dict[int, list[str]] = defaultdict(list)
    for qid, (_, _, k) in queries.items():
        by_k[k].append(qid)
    checked = 0
    for k, qids in by_k.items():
        qrels, run, cut_run = [], [], []
        for qid in qids:
            rels, n_relevant, _ = queries[qid]
            q, r = trec_inputs(qid, rels, n_relevant, rng)
            qrels += q
            run += r
            cut_run += r[:k]
        measures = [ir_measures.P @ k, R @ k, AP @ k, nDCG @ k, Success @ k]
        ours = {qid: score_ranking(queries[qid][0], k, queries[qid][1]) for qid in qids}
        names = {"P": "precision", "R": "recall", "AP": "ap", "nDCG": "ndcg", "Success": "hit"}
        for metric in ir_measures.pytrec_eval.iter_calc(measures, qrels, run):
            ours_value = getattr(ours[metric.query_id], names[str(metric.measure.NAME)])
            assert ours_value == pytest.approx(metric.value, abs=1e-9), (
                metric,
                queries[metric.query_id],
            )
            checked += 1
        # trec_eval's recip_rank has no cutoff: RR@k is recip_rank over the run cut at k.
        for metric in ir_measures.pytrec_eval.iter_calc([RR], qrels, cut_run):
            assert ours[metric.query_id].rr == pytest.approx(metric.value, abs=1e-9)
            checked += 1
    assert checked == 400 * 6


def test_trec_eval_divides_precision_by_k_and_scores_an_empty_run_zero() -> None:
    qrels = [ir_measures.Qrel("q", "a", 1), ir_measures.Qrel("e", "a", 1)]
    run = [ir_measures.ScoredDoc("q", "a", 1.0)]
    values = {
        (m.query_id, str(m.measure)): m.value
        for m in ir_measures.pytrec_eval.iter_calc([ir_measures.P @ 4, nDCG @ 4], qrels, run)
    }
    assert values == {
        ("q", "P@4"): 0.25,
        ("q", "nDCG@4"): 1.0,
        ("e", "P@4"): 0.0,
        ("e", "nDCG@4"): 0.0,
    }
    assert precision([1], 4) == 0.25 and score_ranking([], 4) == ZERO


# -- bootstrap ------------------------------------------------------------------------------------


def test_bootstrap_of_nothing_one_value_and_equal_values() -> None:
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    assert bootstrap_ci([3.0]) == (3.0, 3.0)
    assert bootstrap_ci([0.7] * 10) == (0.7, 0.7)


def test_bootstrap_of_two_values() -> None:
    # Means of resamples of [0, 1] are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% points are 0 and 1, the 30% and 70% points both fall in the 1/2 block.
    assert bootstrap_ci([0.0, 1.0], resamples=20000) == (0.0, 1.0)
    assert bootstrap_ci([0.0, 1.0], resamples=20000, level=0.4) == (0.5, 0.5)


def test_bootstrap_of_one_success_in_four() -> None:
    # Resample means of [0,0,0,1] are j/4, j ~ Bin(4, 1/4): cumulative 0.316, 0.738, 0.949, 0.996,
    # 1, so the 2.5% point is 0 and the 97.5% point is 3/4.
    assert bootstrap_ci([0, 0, 0, 1], resamples=20000) == (0.0, 0.75)


def test_bootstrap_is_deterministic_per_seed() -> None:
    values = np.random.default_rng(1).random(500)
    assert bootstrap_ci(values, seed=7) == bootstrap_ci(values, seed=7)
    assert bootstrap_ci(values, seed=7) != bootstrap_ci(values, seed=8)


def test_bootstrap_of_bernoulli_covers_p_with_the_normal_width() -> None:
    values = (np.random.default_rng(42).random(2000) < 0.3).astype(float)
    low, high = bootstrap_ci(values)
    assert low < 0.3 < high
    assert high - low == pytest.approx(2 * 1.96 * math.sqrt(0.21 / 2000), rel=0.15)


def test_bootstrap_with_many_distinct_values_matches_a_direct_bootstrap() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(0.0, 1.0, 3000)  # 3000 distinct values: the grouped path
    direct = values[rng.integers(0, values.size, (4000, values.size))].mean(axis=1)
    expected = np.quantile(direct, [0.025, 0.975])
    low, high = bootstrap_ci(values, resamples=4000)
    assert abs(low - expected[0]) < 0.1 * (expected[1] - expected[0])
    assert abs(high - expected[1]) < 0.1 * (expected[1] - expected[0])


def test_bootstrap_handles_a_million_values() -> None:
    values = np.random.default_rng(5).random(1_000_000)
    low, high = bootstrap_ci(values)
    mean, width = values.mean(), 2 * 1.96 * values.std() / 1000
    assert low < mean < high
    assert high - low == pytest.approx(width, rel=0.15)
    assert (low + high) / 2 == pytest.approx(mean, abs=0.1 * width)


@pytest.mark.parametrize(("resamples", "level"), [(0, 0.95), (100, 1.0), (100, 0.0)])
def test_bootstrap_refuses_bad_settings(resamples: int, level: float) -> None:
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], resamples=resamples, level=level)


def test_bootstrap_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([1.0, math.nan])


def test_paired_bootstrap() -> None:
    a = [0.0, 0.25, 0.5]
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0)
    assert paired_bootstrap_ci(a, [0.5, 0.75, 1.0]) == (0.5, 0.5)
    assert paired_bootstrap_ci([0, 0, 0, 0], [0, 0, 0, 1], resamples=20000) == (0.0, 0.75)
    with pytest.raises(ValueError, match="length"):
        paired_bootstrap_ci([1.0], [1.0, 2.0])


# -- randomisation test ---------------------------------------------------------------------------


def test_exact_randomization_p_values() -> None:
    # All 2^5 sign patterns of five +1s: only the two all-same patterns reach |sum| = 5.
    assert randomization_test([0] * 5, [1] * 5) == 0.0625
    assert randomization_test([1] * 5, [0] * 5) == 0.0625
    # Zero differences carry no sign: they change nothing.
    assert randomization_test([0] * 5 + [3] * 10, [1] * 5 + [3] * 10) == 0.0625
    # +-1 +-2 +-3: sums 6, 4, 2, 0, 0, -2, -4, -6; only +-6 reach 6.
    assert randomization_test([0, 0, 0], [1, 2, 3]) == 0.25
    # d = 1, -1, 2 (sum 2): +-1 +-1 +-2 gives 4, 0, 2, -2, 2, -2, 0, -4; six reach |2|.
    assert randomization_test([0, 1, 0], [1, 0, 2]) == 0.75


def test_no_difference_gives_p_one() -> None:
    assert randomization_test([0.3, 0.5, 0.9], [0.3, 0.5, 0.9]) == 1.0
    assert randomization_test([], []) == 1.0
    # 30 nonzero differences summing to 0 (sampled path): every |T*| >= 0.
    assert randomization_test([0] * 30, [1] * 15 + [-1] * 15) == 1.0


def test_sampled_randomization_of_a_maximal_difference() -> None:
    # 2^30 patterns, only 2 reach |sum| = 30: no draw in 10000 does, so p = 1 / 10001.
    assert randomization_test([0] * 30, [1] * 30) == 1 / 10001


def binomial_pmf(n: int, j: int) -> float:
    """P(Bin(n, 1/2) = j)."""
    return math.comb(n, j) / (1 << n)


def test_sampled_randomization_matches_the_exact_null() -> None:
    # d = eight 1s, four -1s, eight 2s, four -2s (sum 12, m = 24 > 20: the sampled path). Under
    # the null S = (2X - 12) + 2(2Y - 12) with X, Y ~ Bin(12, 1/2) independent.
    d = [1.0] * 8 + [-1.0] * 4 + [2.0] * 8 + [-2.0] * 4
    exact = sum(
        binomial_pmf(12, x) * binomial_pmf(12, y)
        for x in range(13)
        for y in range(13)
        if abs((2 * x - 12) + 2 * (2 * y - 12)) >= 12
    )
    p = randomization_test([0.0] * len(d), d, seed=11)
    assert p == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 10000))
    assert p == randomization_test([0.0] * len(d), d, seed=11)


def test_randomization_refuses_unpaired_inputs() -> None:
    with pytest.raises(ValueError, match="length"):
        randomization_test([1.0, 2.0], [1.0])


def test_randomization_handles_a_million_pairs() -> None:
    rng = np.random.default_rng(9)
    a = rng.random(1_000_000)
    assert randomization_test(a, a + rng.normal(0.01, 0.1, a.size)) == 1 / 10001
    assert 0.01 < randomization_test(a, a + rng.normal(0.0, 0.1, a.size)) <= 1.0


# -- paired comparison ----------------------------------------------------------------------------


def test_compare_paired_counts_and_means() -> None:
    # d = 1, 0, -2, 0, 2: sum 1; +-1 +-2 +-2 gives 5, 1, 1, -3, 3, -1, -1, -5, all |s| >= 1.
    result = compare_paired([1, 2, 3, 4, 5], [2, 2, 1, 4, 7])
    assert (result.improved, result.worse, result.same, result.n) == (2, 1, 2, 5)
    assert (result.mean_a, result.mean_b, result.p_value) == (3.0, 3.2, 1.0)
    assert result.diff == pytest.approx(0.2, abs=1e-15)
    assert result.ci_low < 0.2 < result.ci_high


def test_compare_identical_runs() -> None:
    result = compare_paired([0.2, 0.4, 1.0], [0.2, 0.4, 1.0])
    assert result.mean_a == result.mean_b == pytest.approx(0.5333333333333333, abs=1e-12)
    assert (result.diff, result.ci_low, result.ci_high, result.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert (result.improved, result.worse, result.same, result.n) == (0, 0, 3, 3)


def test_compare_nothing() -> None:
    result = compare_paired([], [])
    assert (result.n, result.p_value, result.improved) == (0, 1.0, 0)
    assert all(math.isnan(v) for v in (result.mean_a, result.diff, result.ci_low, result.ci_high))
