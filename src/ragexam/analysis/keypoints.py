"""Key points: the exam's marking scheme, the judge's verdicts on them, and the counts.

A key point is one atomic fact of the ground truth. `qa_dataset.csv` holds them as a JSON array
of 1 to 8 strings in `key_points`, written by `generate` in the call that writes the question;
an exam without them gets them written once, by `judge`, into `key_points.csv` beside it. The
judge gives each key point a verdict (present, partial, absent) and each statement of the
answer one (supported, unsupported, contradicted). The grades are counted from the verdicts,
never asked for as numbers:

    completeness = (present + 0.5 x partial) / key points
    conciseness  = supported / statements (0 when the answer states nothing)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

from ragexam.io.cells import UNANSWERABLE
from ragexam.io.csvfile import read_columns, read_rows
from ragexam.io.fingerprint import input_hash
from ragexam.io.manifest import read_manifest
from ragexam.io.runfolder import RunFolder

KEY_POINT_VERDICTS = ("present", "partial", "absent")
STATEMENT_VERDICTS = ("supported", "unsupported", "contradicted")
CREDIT = {"present": 1.0, "partial": 0.5, "absent": 0.0}
FEWEST, MOST = 1, 8  # key points per question


class BadKeyPoints(ValueError):
    """A key_points cell that is not a JSON array of 1 to 8 non-blank strings."""


def completeness(verdicts: Sequence[str]) -> float:
    """(present + 0.5 x partial) / key points: the share of the ground truth in the answer."""
    if not verdicts:
        raise ValueError("no verdicts to count")
    return sum(CREDIT[verdict] for verdict in verdicts) / len(verdicts)


def conciseness(verdicts: Sequence[str]) -> float:
    """supported / statements: the share of the answer that is part of the ground truth.

    An answer that states nothing ("I don't know.") has none of it: 0, as the design says.
    """
    if not verdicts:
        return 0.0
    return sum(verdict == "supported" for verdict in verdicts) / len(verdicts)


def parse_key_points(cell: str | None) -> list[str] | None:
    """The key points of a cell; None when it is empty; BadKeyPoints when it is malformed."""
    if cell is None or not cell.strip():
        return None
    try:
        value = json.loads(cell)
    except ValueError:
        raise BadKeyPoints("key_points is not JSON; write a JSON array of strings") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise BadKeyPoints("key_points must be a JSON array of strings")
    points = [item.strip() for item in value]
    if not FEWEST <= len(points) <= MOST or not all(points):
        raise BadKeyPoints(f"key_points must hold {FEWEST} to {MOST} non-blank strings")
    return points


def stripped(points: Sequence[str]) -> list[str]:
    """Key points as a model wrote them, stripped; ValueError (a validation error, and so a
    re-ask) when one is blank."""
    if not all(point.strip() for point in points):
        raise ValueError("a key point must not be blank")
    return [point.strip() for point in points]


def dump(points: Sequence[str]) -> str:
    """Key points as the CSV cell holds them: a JSON array, non-ASCII kept as it is."""
    return json.dumps(list(points), ensure_ascii=False)


def marked_hash(
    question: str | None,
    ground_truth: str | None,
    answer: str,
    key_points: str | None,
    context: str | None = None,
) -> str:
    """What a grade by key points is made from: the texts, the key points (a person's edit
    redoes the row), and with --with-context the retrieved chunks."""
    points = key_points or ""
    with suppress(BadKeyPoints):  # else hashed as written: an error row until it is mended
        points = dump(parse_key_points(key_points) or [])
    parts = [question, ground_truth, answer, points]
    return input_hash(*parts) if context is None else input_hash(*parts, context)


def written_key_points(path: Path) -> dict[str, str]:
    """key_points.csv: the key points written once for an exam without them, by qa_id, each
    kept only while its question and ground truth are the ones they were written from."""
    if not path.exists():
        return {}
    rows = read_rows(path, ["qa_id", "key_points", "status", "input_hash"])
    return {
        row["qa_id"]: f"{row['input_hash']}\x1f{row['key_points']}"
        for row in rows
        if row["status"] == "ok" and row["key_points"]
    }


def source_hash(question: str | None, ground_truth: str | None) -> str:
    """What written key points are made from: the question and its ground truth."""
    return input_hash(question, ground_truth)


def merged_key_points(
    exam: Mapping[str, Sequence[str]], written: Mapping[str, str]
) -> list[str | None]:
    """Each exam row's key points: its own cell, else those written for it (while its question
    and ground truth are unchanged), else None."""
    ids, questions, truths = exam["qa_id"], exam["question"], exam["ground_truth_answer"]
    own = exam.get("key_points") or [""] * len(ids)
    merged: list[str | None] = []
    for qa_id, question, truth, cell in zip(ids, questions, truths, own, strict=True):
        if cell and cell.strip():
            merged.append(cell)
            continue
        recorded, _, points = written.get(qa_id, "").partition("\x1f")
        fresh = points and recorded == source_hash(question, truth)
        merged.append(points if fresh else None)
    return merged


def exam_key_points(folder: RunFolder) -> dict[str, str | None]:
    """Each question's key points (the JSON cell) by qa_id: the exam's, else those judge
    wrote for it; None for a question without any."""
    exam = read_columns(folder.exam(), ("qa_id", "question", "ground_truth_answer"))
    merged = merged_key_points(exam, written_key_points(folder.key_points))
    return dict(zip(exam["qa_id"], merged, strict=True))


def graded_by_key_points(folder: RunFolder) -> bool:
    """Whether the folder's judge graded by key points: as its manifest records, else as the
    judgments' `scale` column says (a run folder made by hand). Spares reading the key-point
    columns of a run graded on another scale."""
    stages = read_manifest(folder.path).get("stages")
    judge = stages.get("judge") if isinstance(stages, dict) else None
    if isinstance(judge, dict) and isinstance(judge.get("scale"), str):
        return bool(judge["scale"] == "key-points")
    if not folder.judgments.exists():
        return False
    with folder.judgments.open(encoding="utf-8-sig") as handle:
        header = handle.readline()
    return "key_point_verdicts" in header


Held = TypeVar("Held", bool, bool | None)  # a reading of the chunks: known, or not


def held_for_losses(held: Sequence[Held], kind: str) -> list[Held | bool]:
    """Whether the retrieved chunks held each key point, as the losses read it: the judge's
    reading, but for an unanswerable question, whose answer no chunk holds or can be
    retrieved: a miss of its point (that the documentation does not say) is the answer's
    making one up, lost in generation."""
    return [True for _ in held] if kind == UNANSWERABLE else list(held)
