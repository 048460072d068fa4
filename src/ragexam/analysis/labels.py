"""A person's labels: the template to fill in, and the filled-in file read back and checked."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ragexam.analysis.sampling import allocate
from ragexam.config import Scale
from ragexam.errors import InputFileError, OutputFileError
from ragexam.io.csvfile import read_rows
from ragexam.io.rowlog import RowLog
from ragexam.io.runfolder import RunFolder

FloatArray = npt.NDArray[np.float64]
METRICS = ("completeness", "conciseness")
TEMPLATE_FILE = "labels_template.csv"
TEMPLATE_COLUMNS = (
    "qa_id",
    "document",
    "question",
    "ground_truth_answer",
    "answer",
    "completeness",
    "conciseness",
)


def write_template(out: Path, n: int, seed: int = 0) -> tuple[Path, int]:
    """Write OUT/labels_template.csv: n judged questions, stratified by document, to label."""
    path = out / TEMPLATE_FILE
    if path.exists():
        raise OutputFileError(path, "exists and may hold your labels; move it away first")
    folder = RunFolder(out)
    qa = read_rows(folder.exam(), ("qa_id", "document", "question", "ground_truth_answer"))
    answers = {row["qa_id"]: row for row in read_rows(folder.answers_read(), ("qa_id", "answer"))}
    ok = {
        row["qa_id"]
        for row in read_rows(folder.judgments, ("qa_id", "status"))
        if row["status"] == "ok"
    }
    rows = [
        {**row, "answer": answers[row["qa_id"]]["answer"]}
        for row in qa
        if row["qa_id"] in ok and row["qa_id"] in answers
    ]
    if not rows:
        raise InputFileError(folder.judgments, "holds no ok judgment to label; run judge first")
    chosen = stratified(rows, n, seed)
    RowLog(path, TEMPLATE_COLUMNS).rewrite(chosen)
    return path, len(chosen)


def stratified(rows: list[dict[str, str]], n: int, seed: int) -> list[dict[str, str]]:
    """n rows drawn with the seed, allocated to documents as `generate --sample` allocates."""
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row["document"], []).append(row)
    counts = allocate({name: len(group) for name, group in groups.items()}, n)
    rng = random.Random(seed)
    return [row for name in sorted(groups) for row in rng.sample(groups[name], counts[name])]


def read_labels(
    path: Path, scale: Scale, judged: Mapping[str, Mapping[str, str]], judgments: Path
) -> tuple[dict[str, tuple[FloatArray, FloatArray]], list[str]]:
    """Per labelled metric, the judge's and the person's grades on [0, 1]; and notes."""
    if not path.exists():  # a person writes it, not a stage: say how to begin one
        raise InputFileError(
            path,
            "not found: grade some answers by hand in it first; `ragexam calibrate --template "
            "N` writes labels_template.csv with N judged questions to fill in",
        )
    rows = read_rows(path, ("qa_id",))
    metrics = _label_columns(path, rows)
    pairs: dict[str, list[tuple[float, float]]] = {metric: [] for metric in metrics}
    seen: set[str] = set()
    skipped = stale = 0
    for line, row in enumerate(rows, start=2):
        judgment = _judgment(path, line, row["qa_id"], judged, judgments, seen)
        labels = {m: _label(path, line, row, m, scale) for m in metrics if row[m].strip()}
        if labels and judgment.get("status") != "ok":
            stale += judgment.get("status") == "stale"
            skipped += 1
            continue
        for metric, label in labels.items():
            pairs[metric].append((float(judgment[metric]), label))
    if not any(pairs.values()):
        raise InputFileError(path, f"holds no label: fill in {' or '.join(metrics)} for some rows")
    notes = []
    if skipped - stale:
        notes.append(f"{skipped - stale} labelled rows left out: their judgment is an error row")
    if stale:
        notes.append(
            f"{stale} labelled rows left out: their grade was made from a question, answer or "
            "key points changed since (rerun judge to grade them as they are)"
        )
    arrays = {
        m: (np.array([j for j, _ in p]), np.array([q for _, q in p])) for m, p in pairs.items()
    }
    return arrays, notes


def _label_columns(path: Path, rows: list[dict[str, str]]) -> list[str]:
    """The metrics the labels file has a column for; none is an error."""
    if not rows:
        raise InputFileError(path, "holds no rows: add one per qa_id you graded")
    metrics = [metric for metric in METRICS if metric in rows[0]]
    if not metrics:
        raise InputFileError(
            path,
            "has no label column: add completeness and/or conciseness with your grades "
            "(ragexam calibrate --template N writes a file to fill in)",
        )
    return metrics


def _judgment(
    path: Path,
    line: int,
    qa_id: str,
    judged: Mapping[str, Mapping[str, str]],
    judgments: Path,
    seen: set[str],
) -> Mapping[str, str]:
    """The judgment a label row is for; an unknown or repeated qa_id is an error."""
    where = f"line {line} (qa_id {qa_id!r})"
    if qa_id not in judged:
        raise InputFileError(
            path, f"{where}: no judgment has this qa_id in {judgments}; fix it or delete the row"
        )
    if qa_id in seen:
        raise InputFileError(path, f"{where}: this qa_id is labelled twice; keep one row")
    seen.add(qa_id)
    return judged[qa_id]


def _label(path: Path, line: int, row: Mapping[str, str], metric: str, scale: Scale) -> float:
    """One label on [0, 1]: a number within the scale, divided by 10 on the ten scale."""
    top = 10 if scale is Scale.ten else 1
    text = row[metric].strip()
    where = f"line {line} (qa_id {row['qa_id']!r}): {metric} {text!r}"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputFileError(path, f"{where} is not a number; write 0 to {top} or leave it empty")
    if not 0 <= value <= top:
        hint = "; if your labels are 0-10, pass --scale ten" if top == 1 and value <= 10 else ""
        raise InputFileError(
            path, f"{where} is out of range for --scale {scale.value}: write 0 to {top}{hint}"
        )
    return value / top
