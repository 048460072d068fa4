"""Compare two runs on the same exam key point by key point.

Each key point of a question graded by key points in both runs is one pair: its credit in run A
and in run B (present 1, partial 0.5, absent 0; averaged over the samples). A key point whose
text differs between the runs' exams is left out and counted. The pairs give the `key_points`
metric of comparison.csv (the mean credit is key-point recall; the interval and p-value treat
key points as independent, though they come in questions), and key_point_changes.csv lists
every key point gained or lost.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ragexam.analysis.grouped import grouped_compare
from ragexam.analysis.keypoints import (
    CREDIT,
    BadKeyPoints,
    exam_key_points,
    graded_by_key_points,
    parse_key_points,
)
from ragexam.analysis.resampling import compare_paired
from ragexam.io.csvfile import read_rows
from ragexam.io.runfolder import RunFolder

METRIC = "key_points"
CHANGES = ["qa_id", "document", "key_point", "verdict_a", "verdict_b", "credit_a", "credit_b"]


def credits(run: Path) -> pd.DataFrame:
    """One row per key point graded in the run: qa_id, its place, text, verdict and credit."""
    folder = RunFolder(run)
    if not folder.judgments.exists() or not graded_by_key_points(folder):
        return pd.DataFrame(columns=["qa_id", "place", "key_point", "verdict", "credit"])
    texts = exam_key_points(folder)
    rows = []
    wanted = ["qa_id", "status", "key_point_verdicts", "key_point_samples"]
    for row in read_rows(folder.judgments, wanted[:2]):
        verdicts = _list(row.get("key_point_verdicts"))
        points = _points(texts.get(row["qa_id"]))
        if row["status"] != "ok" or not verdicts or points is None or len(points) != len(verdicts):
            continue
        samples = _list(row.get("key_point_samples")) or [verdicts]
        for place, (point, verdict, rated) in enumerate(
            zip(points, verdicts, zip(*samples, strict=True), strict=True)
        ):
            credit = float(np.mean([CREDIT[v] for v in rated]))
            rows.append((row["qa_id"], place, point, verdict, credit))
    return pd.DataFrame(rows, columns=["qa_id", "place", "key_point", "verdict", "credit"])


def pair(run_a: Path, run_b: Path, documents: pd.Series) -> tuple[pd.DataFrame, int]:
    """The key points graded in both runs, paired on qa_id and place, with run A's document;
    and how many were left out because their text differs between the runs' exams."""
    both = credits(run_a).merge(credits(run_b), on=["qa_id", "place"], suffixes=("_a", "_b"))
    same = both["key_point_a"] == both["key_point_b"]
    paired = both[same].rename(columns={"key_point_a": "key_point"}).drop(columns="key_point_b")
    paired = paired.assign(document=paired["qa_id"].map(documents).fillna("").astype(str))
    return paired.reset_index(drop=True), int((~same).sum())


def rows(paired: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The key_points metric over every pair (ALL) and per document, as comparison.csv rows."""
    a, b = paired["credit_a"].to_numpy(), paired["credit_b"].to_numpy()
    # every kind of question together, as compare's other metrics' kind `all` rows
    overall = {"document": "ALL", "kind": "all", "metric": METRIC}
    overall |= asdict(compare_paired(a, b, seed=seed))
    codes, documents = pd.factorize(paired["document"], sort=True)
    figures = grouped_compare(codes.astype(np.int64), a, b, len(documents), seed=seed)
    named = {"document": documents.astype(str), "kind": "all", "metric": METRIC}
    by_document = pd.DataFrame(named | figures)
    return pd.concat([pd.DataFrame([overall]), by_document], ignore_index=True)


def changes(paired: pd.DataFrame) -> pd.DataFrame:
    """The key points whose credit changed, lost ones first."""
    changed = paired[paired["credit_a"] != paired["credit_b"]]
    order = (changed["credit_b"] - changed["credit_a"]).argsort(kind="stable")
    return changed.iloc[order][CHANGES].reset_index(drop=True)


def _list(cell: str | None) -> list[object] | None:
    try:
        value = json.loads(cell) if cell else None
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def _points(cell: str | None) -> list[str] | None:
    try:
        return parse_key_points(cell)
    except BadKeyPoints:
        return None
