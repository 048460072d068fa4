"""Retrieval metrics for one ranked list, following trec_eval's conventions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RetrievalScores:
    """All retrieval metrics of one ranked list at one cutoff."""

    hit: float
    rr: float
    ap: float
    ndcg: float
    precision: float
    recall: float
    f1: float


def _top(rels: Sequence[int], k: int, n_relevant: int | None = None) -> list[int]:
    """Validate a ranking's arguments (R only when given) and return its first k labels."""
    if k < 1:
        raise ValueError(f"cutoff k must be at least 1, got {k}")
    if any(label not in (0, 1) for label in rels):
        # Graded labels would need the graded qrels for the ideal DCG, which R alone cannot give.
        raise ValueError("relevance labels must be 0 or 1")
    if n_relevant is None:
        return list(rels[:k])
    if n_relevant < 1:
        raise ValueError(f"n_relevant must be at least 1, got {n_relevant}")
    if sum(rels) > n_relevant:
        raise ValueError(f"{sum(rels)} relevant items retrieved but n_relevant is {n_relevant}")
    return list(rels[:k])


def hit(rels: Sequence[int], k: int) -> float:
    """1.0 if any of the top k is relevant, else 0.0 (trec_eval's success@k)."""
    return 1.0 if any(_top(rels, k)) else 0.0


def reciprocal_rank(rels: Sequence[int], k: int) -> float:
    """1 / rank of the first relevant item in the top k, else 0 (trec_eval recip_rank, cut at k)."""
    top = _top(rels, k)
    return 1.0 / (top.index(1) + 1) if 1 in top else 0.0


def average_precision(rels: Sequence[int], k: int, n_relevant: int = 1) -> float:
    """Sum of precision@i over relevant ranks i <= k, divided by R (trec_eval map_cut_k)."""
    found, total = 0, 0.0
    for rank, label in enumerate(_top(rels, k, n_relevant), start=1):
        if label:
            found += 1
            total += found / rank
    return total / n_relevant


def ndcg(rels: Sequence[int], k: int, n_relevant: int = 1) -> float:
    """DCG@k / ideal DCG@k, linear gain, discount 1/log2(rank + 1) (trec_eval ndcg_cut_k).

    The ideal ranking puts min(R, k) relevant items at the top, as trec_eval does.
    """
    top = _top(rels, k, n_relevant)
    dcg = sum(label / math.log2(rank + 1) for rank, label in enumerate(top, start=1))
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(n_relevant, k) + 1))
    return dcg / ideal


def precision(rels: Sequence[int], k: int) -> float:
    """Relevant items in the top k divided by k, even when fewer were retrieved (trec_eval P_k)."""
    return sum(_top(rels, k)) / k


def recall(rels: Sequence[int], k: int, n_relevant: int = 1) -> float:
    """Relevant items in the top k divided by R (trec_eval recall_k)."""
    return sum(_top(rels, k, n_relevant)) / n_relevant


def f1(rels: Sequence[int], k: int, n_relevant: int = 1) -> float:
    """Harmonic mean of P@k and recall@k, 0 when both are 0 (trec_eval set_F on the top k)."""
    p, r = precision(rels, k), recall(rels, k, n_relevant)
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def score_ranking(rels: Sequence[int], k: int, n_relevant: int = 1) -> RetrievalScores:
    """Every retrieval metric of one ranked list of 0/1 labels at cutoff k (trec_eval)."""
    return RetrievalScores(
        hit=hit(rels, k),
        rr=reciprocal_rank(rels, k),
        ap=average_precision(rels, k, n_relevant),
        ndcg=ndcg(rels, k, n_relevant),
        precision=precision(rels, k),
        recall=recall(rels, k, n_relevant),
        f1=f1(rels, k, n_relevant),
    )


def score_rank(rank: int | None, k: int) -> RetrievalScores:
    """Metrics when the single relevant chunk sits at 1-based `rank` (None or > k is a miss)."""
    if rank is not None and rank < 1:
        raise ValueError(f"rank is 1-based, got {rank}")
    if rank is None or rank > k:
        return score_ranking([], k)
    return score_ranking([0] * (rank - 1) + [1], k)
