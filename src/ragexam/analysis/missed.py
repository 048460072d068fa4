"""Each document's most-missed key points: the facts its answers leave out, worst first.

A key point's loss is 1 - its credit (absent 1, partial 0.5), averaged over the samples when
the judge graded several. Within a document, the points lost most come first; among equals,
those of the question with the lowest completeness.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ragexam.analysis.keypoints import CREDIT, BadKeyPoints, parse_key_points
from ragexam.errors import InputFileError
from ragexam.io.csvfile import unescape_cell

PER_DOCUMENT = 5
COLUMNS = ["document", "qa_id", "question", "kind", "key_point", "verdict", "loss", "in_context"]


def most_missed(
    judgments: Path,
    questions: pd.DataFrame,
    key_points: dict[str, str | None],
    per_document: int = PER_DOCUMENT,
) -> pd.DataFrame:
    """Up to `per_document` missed key points per document (COLUMNS), and `missed`: how many
    key points the document's answers missed in all (loss > 0)."""
    graded = _graded(judgments) if key_points else {}
    if not graded:
        return pd.DataFrame(columns=[*COLUMNS, "missed"])
    judged = questions[questions["judged"].to_numpy(dtype=bool)]
    rows = []
    columns = ["qa_id", "document", "question", "completeness", "kind"]
    for record in judged.reindex(columns=columns).itertuples(False):
        found = graded.get(str(record.qa_id))
        points = _points(key_points.get(unescape_cell(str(record.qa_id))))
        if found is None or points is None or len(points) != len(found[0]):
            continue
        kind = str(record.kind)
        for point, verdict, loss, held in zip(points, *found, strict=True):
            if loss > 0:
                rows.append((str(record.document), record.qa_id, record.question, kind, point,
                             verdict, loss, held, record.completeness))  # fmt: skip
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "completeness"])
    frame["missed"] = frame.groupby("document")["loss"].transform("size")
    frame = frame.sort_values(["document", "loss", "completeness"], ascending=[True, False, True])
    top = frame.groupby("document", sort=False).head(per_document)
    top = top.assign(question=top["question"].map(lambda text: unescape_cell(str(text))))
    return top.drop(columns="completeness").reset_index(drop=True)


def _graded(judgments: Path) -> dict[str, tuple[list[str], list[float], list[bool | None]]]:
    """Per qa_id of an ok row graded by key points: verdicts, losses and the context reading."""
    try:
        frame = pd.read_csv(
            judgments, dtype=str, keep_default_na=False, encoding="utf-8-sig",
            usecols=lambda name: name in {"qa_id", "status", "key_point_verdicts",
                                          "key_point_samples", "key_point_context"},
        )  # fmt: skip
    except (OSError, ValueError):
        return {}
    if "key_point_verdicts" not in frame:
        return {}
    frame = frame[(frame["status"] == "ok") & (frame["key_point_verdicts"] != "")]
    graded = {}
    for record in frame.to_dict("records"):
        try:
            verdicts = json.loads(record["key_point_verdicts"])
            samples = json.loads(record.get("key_point_samples") or "[]") or [verdicts]
            points = zip(*samples, strict=True)
            losses = [float(np.mean([1 - CREDIT[v] for v in point])) for point in points]
            held = json.loads(record.get("key_point_context") or "null") or [None] * len(verdicts)
        except (ValueError, KeyError, TypeError):  # an edited cell: no verdicts to count
            cell = " ".join(record["key_point_verdicts"].split())[:80]
            raise InputFileError(
                judgments,
                f"the row of qa_id {record['qa_id']!r} has status ok, but its verdicts are not "
                f"lists of {', '.join(CREDIT)} ({cell!r}); delete the row and rerun ragexam "
                "judge to grade it again",
            ) from None
        graded[record["qa_id"]] = (verdicts, losses, held)
    return graded


def _points(cell: str | None) -> list[str] | None:
    try:
        return parse_key_points(cell)
    except BadKeyPoints:
        return None
