"""Where each question's relevant chunks ranked, as a few distinct states, each scored once.

A question with R relevant chunks (its `chunk_ids`), found at ranks r1 < r2 < ... within the
cutoff, scores trec_eval's metrics (metrics.score_ranking): hit = any found, RR = 1/r1,
precision = found/K, recall = found/R, AP = sum(i/ri)/R, NDCG over the ideal of min(R, K)
relevant chunks, and `all_found` = found = R. Questions with the same R and the same found
ranks share a state: states 0..k are one relevant chunk missed (0) or at rank r, and the rest
are what questions with several chunks found. Summaries count states, never score questions
one by one, so a million questions cost a bincount.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, replace
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.metrics import score_ranking

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ObjectArray = npt.NDArray[np.object_]
Ranks = tuple[int, ...]
# The columns of a state table: RetrievalScores' fields in order, then all_found.
COLUMNS = ("hit", "rr", "ap", "ndcg", "precision", "recall", "f1", "all_found")


@dataclass(frozen=True)
class RankStates:
    """Each question's state, and every state's R and found ranks (within k)."""

    index: IntArray  # per question
    states: tuple[tuple[int, Ranks], ...]
    k: int
    depth: int = 0  # the ranks the rank distribution counts, when fewer than k

    @property
    def ranks(self) -> int:
        """How far the rank distribution goes: k, or the depth it was cut to."""
        return self.depth or self.k

    def table(self, cutoff: int | None = None) -> FloatArray:
        """Every metric of every state, cut at `cutoff` (k when None): states x COLUMNS."""
        return _table(self.states, cutoff or self.k)

    def means(self, groups: IntArray, index: IntArray, n: int) -> tuple[IntArray, FloatArray]:
        """Per group, how many questions are in each state, and their mean of every metric
        (misses included): questions at `index` in `groups`."""
        size = len(self.states)
        counts = np.bincount(groups * size + index, minlength=n * size).reshape(n, size)
        with np.errstate(invalid="ignore", divide="ignore"):
            return counts, counts @ self.table() / counts.sum(axis=1, keepdims=True)

    def best(self) -> IntArray:
        """Each state's best rank within k, 0 for none: the rank histogram's bin."""
        return np.array([min(ranks, default=0) for _, ranks in self.states], dtype=np.int64)


def question_states(questions: pd.DataFrame, k: int, depth: int = 0) -> RankStates:
    """The states of load_questions' questions: their best rank, R and found ranks (and the
    rank distribution cut at `depth`, if given)."""
    best, relevant = questions["rank"].to_numpy(), questions["relevant"].to_numpy()
    found = questions["found"].to_numpy() if "found" in questions else ()
    return replace(rank_states(best, relevant, found, k), depth=depth)


def rank_states(
    best: FloatArray, relevant: IntArray, found: Sequence[Ranks | None] | ObjectArray, k: int
) -> RankStates:
    """The states of questions: `best` rank (NaN: none), R, and the found ranks where R > 1
    (None: none found, as for a question not answered)."""
    index = np.where(best <= k, best, 0).astype(np.int64)  # NaN compares False: a miss
    states = [(1, ()), *((1, (rank,)) for rank in range(1, k + 1))]
    several = np.flatnonzero(relevant > 1)
    if several.size:
        keys = [_key(int(relevant[i]), found[i], k) for i in several.tolist()]
        extra = sorted(set(keys))
        position = {key: len(states) + place for place, key in enumerate(extra)}
        index[several] = [position[key] for key in keys]
        states += extra
    return RankStates(index, tuple(states), k)


def _key(relevant: int, ranks: Ranks | None, k: int) -> tuple[int, Ranks]:
    return relevant, tuple(sorted(rank for rank in ranks or () if rank <= k))


@lru_cache(maxsize=64)
def _table(states: tuple[tuple[int, Ranks], ...], cutoff: int) -> FloatArray:
    rows = []
    for relevant, ranks in states:
        rels = [1 if rank in ranks else 0 for rank in range(1, max(ranks, default=0) + 1)]
        all_found = float(sum(rels[:cutoff]) == relevant)
        rows.append((*astuple(score_ranking(rels, cutoff, relevant)), all_found))
    return np.array(rows, dtype=np.float64)
