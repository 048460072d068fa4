"""The summary's model: the result `stats` computes once, and the procedure's thresholds.

Compute once, render many: `stats` fills a StatsResult; the CSVs, the terminal table and the
HTML report all draw from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ragexam.analysis.controlruns import MEASURED
from ragexam.analysis.verdict import Verdict

TEXTS = ("question", "ground_truth_answer")  # read only for the report's worst questions
DEFAULT_K = 5
WORST_QUESTIONS = 20
# The procedure's own reading of a document; the report states these thresholds.
LOW_COMPLETENESS = 0.6  # below: answers leave out facts of the ground truth
LOW_HIT_RATE = 0.7  # below: the source chunk is often not among the k retrieved
LOW_CONCISENESS = 0.6  # below: answers carry much that was not asked
DIAGNOSES = {
    "retrieval": "low completeness and low hit rate: the source chunk is often not retrieved",
    "generation": "low completeness although the source chunk is retrieved: the answer misses it",
    "too much context": "complete but not concise: retrieve fewer chunks, or rerank them",
    "ok": "complete and concise",
    "not judged": "no graded question (none judged yet, or every judgment failed), so no "
    "judge-based diagnosis",
    **MEASURED,
}
COUNTS = {"errors": "error", "pending": "pending", "n_answered": "answered", "n_judged": "judged"}
# ranking.COLUMNS' order: RetrievalScores' fields, then all_found
RETRIEVAL = ("hit_rate", "mrr", "map", "ndcg", "precision", "recall", "f1", "all_found")


@dataclass(frozen=True)
class StatsResult:
    """The summary, computed once: per document, overall, and where it was written."""

    by_document: pd.DataFrame
    overall: pd.DataFrame
    k: int
    paths: dict[str, Path]
    worst: pd.DataFrame = field(default_factory=pd.DataFrame)
    context: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    controls: Verdict | None = None  # the judge's known-answer controls, when it graded some
    calibration: pd.DataFrame | None = None  # calibration.csv, when a person labelled answers
    stale: int = 0  # grades made from a question or answer that has changed: counted pending
    unanswered: int = 0  # of those, the grades whose answer is gone or answers another question
    questions: pd.DataFrame = field(default_factory=pd.DataFrame)  # every one, for the drill-down
    out: Path | None = None
    missed: pd.DataFrame = field(default_factory=pd.DataFrame)  # each document's most-missed points
    by_kind: pd.DataFrame = field(default_factory=pd.DataFrame)  # per kind of question, and ALL
    # per stage with error rows: (stage, rows in error, [(rows, commonest reasons)])
    errors: list[tuple[str, int, list[tuple[int, str]]]] = field(default_factory=list)
