"""Retrieval metrics at several cutoffs from one answer run: hit rate, MRR, nDCG and recall at C.

A run that retrieved k chunks per question also tells what a smaller k would have scored:
the source chunk's rank, cut at C, gives every metric at C (trec_eval's conventions, as in
metrics.score_rank).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ragexam.analysis.metrics import score_rank

CUTOFFS = (1, 3, 5, 10)
METRICS = {"hit_rate": "hit", "mrr": "rr", "ndcg": "ndcg", "recall": "recall"}


def cutoffs_for(k: int) -> list[int]:
    """The cutoffs a run with k retrieved chunks can report: those of CUTOFFS up to k."""
    return [cutoff for cutoff in CUTOFFS if cutoff <= k]


def cutoff_table(cutoff: int, k: int) -> npt.NDArray[np.float64]:
    """Row 0 scores a miss, row r the source chunk at rank r <= k, each metric cut at `cutoff`."""
    scores = [score_rank(rank, cutoff) for rank in [None, *range(1, k + 1)]]
    return np.array([[getattr(score, field) for field in METRICS.values()] for score in scores])


def cutoff_columns(
    groups: npt.NDArray[np.int64], ranks: npt.NDArray[np.int64], n: int, k: int
) -> dict[str, Any]:
    """Per group, `<metric>_at_<C>` means over answered questions (misses included).

    `ranks` is 0 for a miss, else the 1-based rank up to k, one per answered question.
    """
    counts = np.bincount(groups * (k + 1) + ranks, minlength=n * (k + 1)).reshape(n, k + 1)
    totals = counts.sum(axis=1, keepdims=True)
    columns: dict[str, Any] = {}
    for cutoff in cutoffs_for(k):
        with np.errstate(invalid="ignore", divide="ignore"):
            means = counts @ cutoff_table(cutoff, k) / totals
        for position, name in enumerate(METRICS):
            columns[f"{name}_at_{cutoff}"] = means[:, position]
    return columns
