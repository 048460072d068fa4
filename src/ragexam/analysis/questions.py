"""The run folder read as one row per question: its exam, answer and grade, joined on qa_id."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.controlruns import COLUMNS
from ragexam.analysis.keypoints import graded_by_key_points
from ragexam.analysis.keypointstats import key_point_figures
from ragexam.analysis.kinds import UNKNOWN, VERDICTS, declines, exam_kinds, found_ranks
from ragexam.analysis.summary import DEFAULT_K, TEXTS
from ragexam.errors import InputFileError
from ragexam.io.cells import UNANSWERABLE
from ragexam.io.csvfile import read_rows, unescape_cell
from ragexam.io.manifest import read_manifest
from ragexam.io.runfolder import RunFolder

IntArray = npt.NDArray[np.int64]
# Columns of a handful of distinct values, read as categories: a million rows of them then
# take a few MB, and each distinct value is parsed once.
FEW_VALUES = frozenset({"kind", "target_ranks"})


def _stage(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    stages = manifest.get("stages")
    stage = stages.get(name) if isinstance(stages, dict) else None
    return stage if isinstance(stage, dict) else {}


def deepest_rank(out: Path, questions: pd.DataFrame) -> int | None:
    """The largest number of chunks any answer retrieved (or rank it names): k's useful cap.

    None when no answer lists what it retrieved (a hand-made answers file): then no cap.
    """
    retrieved = 0
    with suppress(InputFileError):  # hand-made answers may have no retrieved_ids
        ids = _read(RunFolder(out).answers_read(), ("retrieved_ids",))["retrieved_ids"]
        retrieved = max((_count(cell) for cell in ids), default=0)
    if not retrieved:
        return None
    ranks = questions["rank"].to_numpy()
    ranked = int(np.nanmax(ranks)) if np.isfinite(ranks).any() else 0
    return max(retrieved, ranked)


def _count(cell: str) -> int:
    try:
        value = json.loads(cell) if cell else []
    except ValueError:
        return 0
    return len(value) if isinstance(value, list) else 0


def error_reasons(out: Path, limit: int = 3) -> list[tuple[str, int, list[tuple[int, str]]]]:
    """Per stage whose file has error rows: (stage, rows in error, its commonest reasons with
    their counts), for the report to say why, not only how many. Two columns read by pandas'
    parser, an ok row's empty reason a shared NaN: at a million rows, 0.6 s and little memory
    (a cell-by-cell read took 7 s and 320 MB)."""
    folder = RunFolder(out)
    found = []
    for stage, path in (("generate", folder.exam()), ("answer", folder.answers_read()),
                        ("judge", folder.judgments)):  # fmt: skip
        try:
            header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
            if "status" not in header or "error" not in header:
                continue
            kinds: dict[str, Any] = {"status": "category", "error": object}
            cells = pd.read_csv(
                path, usecols=["status", "error"], dtype=kinds, encoding="utf-8-sig"
            )
        except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError):
            continue  # unreadable: what reading its rows says (load_questions read it whole)
        errors = cells.loc[cells["status"] == "error", "error"]
        if len(errors):
            texts = errors.map(lambda cell: " ".join(unescape_cell(str(cell)).split())[:200])
            texts = texts.mask(errors.isna(), "no reason given")
            common = Counter(texts).most_common(limit)
            found.append((stage, len(errors), [(count, text) for text, count in common]))
    return found


def resolve_k(out: Path, k: int | None) -> int:
    """The metrics cutoff: --k, else the k `answer` recorded in the manifest, else DEFAULT_K."""
    if k is not None:
        return k
    recorded = _stage(read_manifest(out), "answer").get("k")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        return recorded
    return DEFAULT_K


def run_context(out: Path, k: int) -> dict[str, str]:
    """What the run depends on, from its manifest when it has one, for the report's header."""
    manifest = read_manifest(out)
    context = {"run folder": str(out), "cutoff k": str(k)}
    for stage in ("generate", "answer", "judge"):
        model = _stage(manifest, stage).get("model")
        if model:
            context[f"{stage} model"] = str(model)
    collection = _stage(manifest, "generate").get("collection")
    if collection:
        context["collection"] = str(collection)
    return context


def _read(path: Path, columns: tuple[str, ...], numbers: tuple[str, ...] = ()) -> pd.DataFrame:
    """The `columns` of an input CSV: text verbatim (an id "NA" stays "NA"), `numbers` as floats."""
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
        missing = [name for name in columns if name not in header]
        if missing:
            raise InputFileError(path, f"lacks the column(s) {', '.join(missing)}")
        dtypes: dict[str, Any] = {name: "float64" if name in numbers else str for name in columns}
        dtypes |= {name: "category" for name in columns if name in FEW_VALUES}
        frame = pd.read_csv(
            path,
            usecols=list(columns),
            dtype=dtypes,
            keep_default_na=False,
            na_values={name: [""] for name in numbers},
            encoding="utf-8-sig",
        )
        if _cut_short(path, frame, numbers):
            read_rows(path, columns)  # names the line cut short, as the stages do
        return frame
    except FileNotFoundError:
        raise InputFileError(path, "not found; run the stage that writes it first") from None
    except IsADirectoryError:
        raise InputFileError(path, "is a folder, not a CSV file; move it away") from None
    except pd.errors.EmptyDataError:
        raise InputFileError(path, "is empty; it needs at least a header row") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as exc:
        read_rows(path, columns)  # names the line that breaks it, as the stages do
        raise InputFileError(path, f"is not a readable UTF-8 CSV ({exc})") from None
    except ValueError as exc:  # a number column holds text
        _not_a_number(path, numbers)  # names the cell
        raise InputFileError(path, f"{', '.join(numbers)} must be numbers ({exc})") from None


def _cut_short(path: Path, frame: pd.DataFrame, numbers: tuple[str, ...]) -> bool:
    """Whether a row may have fewer cells than the header: pandas fills those missing with
    nothing (a text cell, with NaN), and a last line cut short (a crash mid-write) has no end."""
    if any(frame[name].isna().any() for name in frame.columns if name not in numbers):
        return True
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def _not_a_number(path: Path, numbers: tuple[str, ...]) -> None:
    """Raise InputFileError naming the first cell of `numbers` that is neither empty nor a
    number as CSVs write them ("nan" and "inf" are not: a grade is a number or no grade)."""
    for line, row in enumerate(read_rows(path, numbers), start=2):
        for name in numbers:
            value = row[name]
            try:
                number = float(value) if value else 0.0
            except ValueError:
                number = math.nan
            if not math.isfinite(number):
                raise InputFileError(path, f"{name} is {value!r}, not a number", line)


@dataclass(frozen=True)
class _Aligned:
    """A later stage's columns in question order; a question without a row is pending."""

    values: dict[str, npt.NDArray[Any]]
    present: npt.NDArray[np.bool_]
    ok: npt.NDArray[np.bool_]


def _aligned(
    path: Path, index: pd.Index, numbers: tuple[str, ...], texts: tuple[str, ...]
) -> _Aligned:
    """Read a later stage (absent: not run yet) and align its rows to the questions by qa_id."""
    columns = ("qa_id", "status", *numbers, *texts)
    if path.exists():
        frame = _checked(_read(path, columns, numbers), path)
    else:
        frame = pd.DataFrame(
            {name: pd.Series(dtype=float if name in numbers else str) for name in columns}
        )
    rows = _rows_for(index, frame["qa_id"])
    ok = _take(frame["status"] == "ok", rows, False).astype(bool)
    values = {name: np.where(ok, _take(frame[name], rows, np.nan), np.nan) for name in numbers}
    values.update({name: _take(frame[name], rows, "") for name in texts})
    return _Aligned(values, rows >= 0, ok)


def _rows_for(index: pd.Index, ids: pd.Series) -> IntArray:
    """For each question, the row of a later stage with its qa_id, else -1 (pending)."""
    where = index.get_indexer(pd.Index(ids))
    rows = np.full(len(index), -1, dtype=np.int64)
    found = where >= 0
    rows[where[found]] = np.flatnonzero(found)  # a repeated qa_id: the later row wins
    return rows


def _take(column: pd.Series, rows: IntArray, fill: Any) -> npt.NDArray[Any]:
    """column[rows], with `fill` where rows is -1 (the padding makes -1 point at it)."""
    return np.append(column.to_numpy(), fill)[rows]


def _documents(raw: pd.Series) -> pd.Categorical:
    """Document names unescaped once per distinct name, not once per row."""
    codes, uniques = pd.factorize(raw)
    remap, names = pd.factorize(pd.Index([unescape_cell(str(name)) for name in uniques]))
    return pd.Categorical.from_codes(remap[codes], categories=names.astype(str))


def _check(path: Path, ids: pd.Series, bad: npt.NDArray[np.bool_], problem: str) -> None:
    if bad.any():
        qa_id = unescape_cell(str(ids.iloc[int(np.argmax(bad))]))
        raise InputFileError(path, f"the row of qa_id {qa_id!r} has status ok but {problem}")


def _checked(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Refuse ok rows with impossible values: a failure is never a score."""
    ok = (frame["status"] == "ok").to_numpy()
    if "target_rank" in frame:
        rank = frame["target_rank"].to_numpy()
        bad = ok & ~np.isnan(rank) & ((rank < 1) | (rank != np.floor(rank)))
        _check(path, frame["qa_id"], bad, "a target_rank that is not a whole number from 1")
    for name in ("completeness", "conciseness"):
        if name in frame:
            score = frame[name].to_numpy()
            bad = ok & ~((score >= 0) & (score <= 1))
            _check(path, frame["qa_id"], bad, f"no {name} in [0, 1]")
    return frame


def _present(path: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of the optional `names` that the CSV's header has (none when it is unreadable)."""
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
    except (OSError, ValueError):
        return ()  # _read says what is wrong with the file
    return tuple(name for name in names if name in header)


def load_questions(out: Path, *, texts: bool = False) -> pd.DataFrame:
    """One row per question of qa_dataset.csv, joined on qa_id with its answer and judgment.

    Each question has its `kind`, its count of `relevant` chunks (R), and, when R > 1, the
    ranks at which the answer `found` them.
    """
    folder = RunFolder(out)
    qa_path = folder.exam()  # answer records where its exam came from
    # With kinds, a multi-hop question's count of chunks is that of its target_ranks: a
    # million ids need not be read.
    optional = _present(qa_path, ("kind",)) or _present(qa_path, ("chunk_ids",))
    optional += _present(qa_path, ("status",))
    qa = _read(qa_path, ("qa_id", "document", *optional, *(TEXTS if texts else ())))
    # A hand-made exam may have no status, or leave it empty: its rows are questions, as
    # answer and judge take them.
    status = qa["status"] if "status" in qa else pd.Series("", index=qa.index)
    qa["status"] = status.mask(status == "", "ok")
    index = pd.Index(qa["qa_id"])
    if not index.is_unique:
        repeated = unescape_cell(str(qa["qa_id"][index.duplicated()].iloc[0]))
        raise InputFileError(qa_path, f"repeats qa_id {repeated!r}; each needs its own")
    kinds, relevant = exam_kinds(qa, qa_path)
    several = (relevant > 1) | (relevant == UNKNOWN)  # one chunk's rank is target_rank
    wanted = ("answer",) * texts + ("target_ranks",) * bool(several.any())
    answers_path = folder.answers_read()
    answers = _aligned(answers_path, index, ("target_rank",), wanted)
    cells = answers.values.get("target_ranks")
    found = found_ranks(cells, answers.ok & several, relevant, qa["qa_id"], answers_path)
    unanswerable = kinds == UNANSWERABLE
    verdicts = _present(folder.judgments, VERDICTS) if unanswerable.any() else ()
    judgments = _aligned(folder.judgments, index, ("completeness", "conciseness"), verdicts)
    frame = _frame(qa, answers, judgments, kinds, relevant)
    if several.any():  # kept only when some question has several chunks: a million are many
        frame["found"] = found
    if unanswerable.any():
        frame["declined"], frame["made_up"] = declines(judgments.values, unanswerable)
    if graded_by_key_points(folder):
        frame = frame.assign(**key_point_figures(folder.judgments, index, judgments.ok))
        if unanswerable.any() and "kp_retrieval" in frame:  # as held_for_losses reads them,
            lost = frame["kp_retrieval"].where(unanswerable, 0.0)  # rows graded before too
            frame["kp_generation"] += lost
            frame["kp_retrieval"] -= lost
    if texts:
        frame = frame.assign(**{name: qa[name] for name in TEXTS}, answer=answers.values["answer"])
    for name, control_run in folder.control_runs().items():  # `run --control-runs` made them
        control = _aligned(control_run.judgments, index, ("completeness",), ())
        frame[COLUMNS[name]] = control.values["completeness"]
    return frame


def _frame(
    qa: pd.DataFrame,
    answers: _Aligned,
    judgments: _Aligned,
    kinds: pd.Categorical[str],
    relevant: IntArray,
) -> pd.DataFrame:
    """The columns every question has: its document, state in each stage, rank and grades."""
    failed = (answers.present & ~answers.ok) | (judgments.present & ~judgments.ok)
    error = (qa["status"] != "ok").to_numpy() | failed
    return pd.DataFrame(
        {
            "qa_id": qa["qa_id"],
            "document": _documents(qa["document"]),
            "error": error,
            "pending": ~error & ~(answers.present & judgments.present),
            "answered": answers.ok,
            "judged": judgments.ok,
            "rank": answers.values["target_rank"],
            "kind": kinds,
            "relevant": relevant.astype(np.int8),  # a byte a question: a million are many
            "completeness": judgments.values["completeness"],
            "conciseness": judgments.values["conciseness"],
        }
    )
