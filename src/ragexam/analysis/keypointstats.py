"""Key points in the summary: recall, where missed points were lost, and how samples agree.

Read from judgments.csv per question, then summed per document and overall:
- `key_points`: key points graded; `key_point_recall`: (present + 0.5 x partial) / key points,
  pooled over the group's key points (completeness is the mean of the questions' shares);
- with --with-context, `lost_in_generation` and `lost_in_retrieval`: the share of the key
  points lost (a partial one half) although the retrieved chunks held them, and because they
  did not; recall and the two losses add up to 1;
- with --samples N (N >= 2), `key_point_agreement` and `key_point_kappa` (agreement.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.agreement import grouped_agreement, kappa_interval
from ragexam.analysis.keypoints import CREDIT, KEY_POINT_VERDICTS

IntArray = npt.NDArray[np.int64]
SOURCE = ("key_point_verdicts", "lost_in_generation", "lost_in_retrieval", "key_point_samples")
# The questions frame's columns: each question's sums (0 when not graded by key points).
PER_QUESTION = ("kp_total", "kp_credit", "kp_read", "kp_generation", "kp_retrieval")


def key_point_figures(path: Path, index: pd.Index, ok: npt.NDArray[np.bool_]) -> dict[str, Any]:
    """Each question's key-point sums and its samples' verdicts, aligned to `index` by qa_id;
    nothing when no answer was graded by key points."""
    frame = _read(path)
    if frame is None:
        return {}
    where = index.get_indexer(pd.Index(frame["qa_id"]))
    rows = np.full(len(index), -1, dtype=np.int64)
    rows[where[where >= 0]] = np.flatnonzero(where >= 0)  # a repeated qa_id: the later row wins
    verdicts = frame["key_point_verdicts"]
    counts = {v: verdicts.str.count(f'"{v}"').to_numpy(dtype=float) for v in KEY_POINT_VERDICTS}
    read = frame["lost_in_generation"] != ""
    sums = {
        "kp_total": sum(counts.values()),
        "kp_credit": sum(CREDIT[v] * counts[v] for v in KEY_POINT_VERDICTS),
        "kp_read": np.where(read, sum(counts.values()), 0.0),
        "kp_generation": pd.to_numeric(frame["lost_in_generation"]).fillna(0).to_numpy(),
        "kp_retrieval": pd.to_numeric(frame["lost_in_retrieval"]).fillna(0).to_numpy(),
    }
    columns: dict[str, Any] = {
        name: np.where(ok, np.append(values, 0.0)[rows], 0.0) for name, values in sums.items()
    }
    samples = np.append(frame["key_point_samples"].to_numpy(dtype=object), "")[rows]
    columns["kp_samples"] = np.where(ok, samples, "")
    return columns


def _read(path: Path) -> pd.DataFrame | None:
    """The key-point columns of judgments.csv, ok rows graded by key points only."""
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
    except (OSError, ValueError):
        return None
    if "key_point_verdicts" not in header:
        return None
    present = [name for name in SOURCE if name in header]
    frame = pd.read_csv(
        path,
        usecols=["qa_id", "status", *present],
        dtype=str,
        keep_default_na=False,
        encoding="utf-8-sig",
    )
    frame = frame[(frame["status"] == "ok") & (frame["key_point_verdicts"] != "")]
    if frame.empty:
        return None
    return frame.assign(**{name: "" for name in SOURCE if name not in present})


def key_point_columns(
    questions: pd.DataFrame, groups: IntArray, n: int, judged: npt.NDArray[np.bool_]
) -> dict[str, Any]:
    """Per group: key points, recall, the two losses (with context) and the samples'
    agreement (with several); nothing when no question was graded by key points."""
    if "kp_total" not in questions:
        return {}
    sums = {
        name: np.bincount(groups[judged], questions[name].to_numpy()[judged], n)
        for name in PER_QUESTION
    }
    columns: dict[str, Any] = {"key_points": sums["kp_total"].astype(np.int64)}
    with np.errstate(invalid="ignore", divide="ignore"):
        columns["key_point_recall"] = sums["kp_credit"] / sums["kp_total"]
        if sums["kp_read"].any():
            columns["lost_in_generation"] = sums["kp_generation"] / sums["kp_read"]
            columns["lost_in_retrieval"] = sums["kp_retrieval"] / sums["kp_read"]
    samples = questions["kp_samples"].to_numpy()[judged]
    if any(samples):
        percent, kappa = grouped_agreement(*_ratings(groups[judged], samples), n)
        columns["key_point_agreement"], columns["key_point_kappa"] = percent, kappa
    return columns


def _ratings(groups: IntArray, cells: npt.NDArray[Any]) -> tuple[IntArray, IntArray]:
    """Each key point's group and its ratings by category, from the samples' verdict lists."""
    owners: list[int] = []
    counts: list[list[int]] = []
    for group, cell in zip(groups, cells, strict=True):
        if not cell:
            continue
        for point in zip(*json.loads(cell), strict=True):  # one key point, every sample
            owners.append(int(group))
            counts.append([point.count(verdict) for verdict in KEY_POINT_VERDICTS])
    shape = (len(counts), len(KEY_POINT_VERDICTS))
    return np.array(owners, dtype=np.int64), np.array(counts, dtype=np.int64).reshape(shape)


def kappa_bounds(questions: pd.DataFrame, seed: int) -> dict[str, float]:
    """The overall kappa's bootstrap interval; nothing without several samples."""
    if "kp_samples" not in questions:
        return {}
    judged = questions["judged"].to_numpy(dtype=bool)
    cells = questions["kp_samples"].to_numpy()[judged]
    if not any(cells):
        return {}
    _, counts = _ratings(np.zeros(len(cells), np.int64), cells)
    low, high = kappa_interval(counts, seed)
    return {"key_point_kappa_ci_low": low, "key_point_kappa_ci_high": high}
