"""Retrieval metrics at several cutoffs from one answer run: hit rate, MRR, nDCG and recall at C.

A run that retrieved k chunks per question also tells what a smaller k would have scored:
the ranks at which a question found its relevant chunks, cut at C, give every metric at C
(trec_eval's conventions, as in ranking.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ragexam.analysis.ranking import COLUMNS, RankStates

CUTOFFS = (1, 3, 5, 10)
METRICS = {"hit_rate": "hit", "mrr": "rr", "ndcg": "ndcg", "recall": "recall"}
POSITIONS = [COLUMNS.index(field) for field in METRICS.values()]


def cutoffs_for(k: int) -> list[int]:
    """The cutoffs a run with k retrieved chunks can report: those of CUTOFFS up to k."""
    return [cutoff for cutoff in CUTOFFS if cutoff <= k]


def cutoff_columns(
    groups: npt.NDArray[np.int64], index: npt.NDArray[np.int64], states: RankStates, n: int
) -> dict[str, Any]:
    """Per group, `<metric>_at_<C>` means over the questions scored (misses included).

    `index` is each scored question's state (ranking.RankStates), in `groups` order.
    """
    size = len(states.states)
    counts = np.bincount(groups * size + index, minlength=n * size).reshape(n, size)
    totals = counts.sum(axis=1, keepdims=True)
    columns: dict[str, Any] = {}
    for cutoff in cutoffs_for(states.k):
        with np.errstate(invalid="ignore", divide="ignore"):
            means = counts @ states.table(cutoff)[:, POSITIONS] / totals
        for position, name in enumerate(METRICS):
            columns[f"{name}_at_{cutoff}"] = means[:, position]
    return columns
