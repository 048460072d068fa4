"""The exam's kinds of question, and what each is scored on.

A `single` question has one relevant chunk and a `multi-hop` one several (its `chunk_ids`);
retrieval is scored on both. An `unanswerable` one has none: it is out of the retrieval
means, and scored on whether the answer declines and whether it makes facts up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.ranking import RankStates
from ragexam.analysis.summary import RETRIEVAL
from ragexam.errors import InputFileError
from ragexam.io.cells import KINDS, MULTI_HOP, SINGLE, UNANSWERABLE, id_list, rank_list
from ragexam.io.csvfile import unescape_cell

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
# The judge's verdicts (judgments.csv), when it grades by key points.
VERDICTS = ("key_point_verdicts", "answer_statements")
MADE_UP = ("unsupported", "contradicted")  # an answer statement the ground truth does not bear
# Without verdicts, the judge's scores stand in: the ground truth of an unanswerable question
# is the decline itself, so completeness says whether the answer declined, and conciseness
# how much of it is that decline rather than something else.
DECLINED_AT, MADE_UP_BELOW = 0.5, 0.5


def exam_kinds(qa: pd.DataFrame, path: Path) -> tuple[pd.Categorical[str], IntArray]:
    """Each question's kind and its count of relevant chunks (R: 1, len(chunk_ids), or 0).

    Without a `kind` column the kind follows from `chunk_ids` (none: unanswerable, several:
    multi-hop); without either, every question is single, with one relevant chunk.
    """
    n = len(qa)
    if "kind" in qa:
        raw = qa["kind"].to_numpy()
        kinds = pd.Categorical(raw, categories=KINDS)
        bad = kinds.isna() & (raw != "")
        _refuse(path, qa["qa_id"], bad, f"a kind that is none of {', '.join(KINDS)}")
        codes = np.where(kinds.codes < 0, 0, kinds.codes).astype(np.int64)  # empty: single
    else:
        codes = np.zeros(n, dtype=np.int64)
    relevant = np.where(codes == KINDS.index(UNANSWERABLE), 0, 1).astype(np.int64)
    if "chunk_ids" in qa:
        # One chunk's count needs no parsing: only multi-hop rows (all, without kinds) are read.
        counted = codes == KINDS.index(MULTI_HOP) if "kind" in qa else np.ones(n, dtype=bool)
        rows = np.flatnonzero(counted)
        lengths = [_length(cell) for cell in qa["chunk_ids"].to_numpy()[rows].tolist()]
        bad = np.zeros(n, dtype=bool)
        bad[rows] = (qa["status"] == "ok").to_numpy()[rows] & np.array(
            [length is None for length in lengths], dtype=bool
        )
        _refuse(path, qa["qa_id"], bad, "chunk_ids that are no JSON array of ids")
        relevant[rows] = [1 if length is None else length for length in lengths]
        if "kind" not in qa:
            codes = np.select([relevant == 0, relevant > 1], [2, 1], 0).astype(np.int64)
    scored = (codes != KINDS.index(UNANSWERABLE)).astype(np.int64)
    categories = pd.Categorical.from_codes(codes, categories=pd.Index(KINDS))
    return categories, np.maximum(relevant, scored)  # a question that is scored has R >= 1


def _length(cell: str) -> int | None:
    ids = id_list(cell)
    return None if ids is None else len(ids)


def found_ranks(
    cells: npt.NDArray[Any] | None,
    wanted: BoolArray,
    relevant: IntArray,
    ids: pd.Series,
    path: Path,
) -> npt.NDArray[np.object_]:
    """For each `wanted` question (answered, several relevant chunks), the ranks it found them
    at, from its `target_ranks` cell; None for the others."""
    found = np.full(len(wanted), None, dtype=object)
    rows = np.flatnonzero(wanted)
    if cells is None or not rows.size:
        return found
    for row, cell in zip(rows.tolist(), cells[rows].tolist(), strict=True):
        ranks = rank_list(cell)
        if ranks is None or len(ranks) != relevant[row]:
            qa_id = unescape_cell(str(ids.iloc[row]))
            raise InputFileError(
                path,
                f"the row of qa_id {qa_id!r} needs target_ranks: a JSON array of "
                f"{relevant[row]} ranks or nulls, one per chunk of its chunk_ids",
            )
        found[row] = tuple(rank for rank in ranks if rank is not None)
    return found


def declines(
    values: Mapping[str, npt.NDArray[Any]], unanswerable: BoolArray
) -> tuple[FloatArray, FloatArray]:
    """For each graded unanswerable question, 1.0 or 0.0: did the answer decline, did it make
    facts up (NaN for the others). From the judge's verdicts, else its scores."""
    completeness, conciseness = values["completeness"], values["conciseness"]
    declined, made_up = np.full(len(unanswerable), np.nan), np.full(len(unanswerable), np.nan)
    rows = np.flatnonzero(unanswerable & ~np.isnan(completeness))
    empty = np.full(len(unanswerable), "", dtype=object)
    verdicts, statements = (values.get(name, empty) for name in VERDICTS)
    for row in rows.tolist():
        points = _words(verdicts[row], None)
        said = _words(statements[row], "verdict")
        declined[row] = (
            all(word == "present" for word in points)
            if points
            else completeness[row] >= DECLINED_AT
        )
        made_up[row] = (
            any(word in MADE_UP for word in said)
            if said is not None
            else conciseness[row] < MADE_UP_BELOW
        )
    return declined, made_up


def _words(cell: Any, field: str | None) -> list[str] | None:
    """The verdict words of a JSON array cell (of words, or of objects' `field`); None if none."""
    if not isinstance(cell, str) or not cell.strip():
        return None
    try:
        items = json.loads(cell)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    words = [item.get(field) if field and isinstance(item, dict) else item for item in items]
    return [str(word).lower() for word in words]


def _refuse(path: Path, ids: pd.Series, bad: BoolArray, problem: str) -> None:
    if bad.any():
        qa_id = unescape_cell(str(ids.iloc[int(np.argmax(bad))]))
        raise InputFileError(path, f"the row of qa_id {qa_id!r} has status ok but {problem}")


# -- the summary, kind by kind -------------------------------------------------------------------

# What summary*.csv show of each kind apart, as `<figure>_<kind>`, when the exam has several.
SCORED = ("completeness_mean", "conciseness_mean")
FIGURES = {
    SINGLE: (*SCORED, "hit_rate", "mrr", "recall", "all_found"),
    MULTI_HOP: (*SCORED, "hit_rate", "mrr", "recall", "all_found"),
    UNANSWERABLE: (*SCORED, "declined", "made_up"),
}


def suffix(kind: str) -> str:
    """A kind as the end of a column name: multi-hop -> multi_hop."""
    return kind.replace("-", "_")


def kind_codes(questions: pd.DataFrame) -> IntArray:
    """Each question's kind as its position in KINDS (single 0, multi-hop 1, unanswerable 2)."""
    return questions["kind"].cat.codes.to_numpy().astype(np.int64)


def retrieved(questions: pd.DataFrame) -> BoolArray:
    """The questions retrieval is scored on: answered, and with a chunk that answers them."""
    answered = questions["answered"].to_numpy()
    return np.asarray(answered & (kind_codes(questions) != KINDS.index(UNANSWERABLE)), bool)


def kind_columns(
    questions: pd.DataFrame, groups: IntArray, n: int, states: RankStates
) -> dict[str, Any]:
    """Per group, `questions_<kind>` and the FIGURES of each kind apart; none when every
    question is single (the summary's own columns then say it all)."""
    codes = kind_codes(questions)
    if not codes.any():
        return {}
    judged, scored = questions["judged"].to_numpy(), retrieved(questions)
    columns: dict[str, Any] = {}
    for code, kind in enumerate(KINDS):
        mine, end = codes == code, suffix(kind)
        columns[f"questions_{end}"] = np.bincount(groups[mine], minlength=n)
        graded = mine & judged
        for name in (name for name in FIGURES[kind] if name not in RETRIEVAL):
            values = _column(questions, name.removesuffix("_mean"))[graded]
            columns[f"{name}_{end}"] = group_means(groups[graded], values, n)
        if kind != UNANSWERABLE:
            rows = mine & scored
            _, means = states.means(groups[rows], states.index[rows], n)
            for name in (name for name in FIGURES[kind] if name in RETRIEVAL):
                columns[f"{name}_{end}"] = means[:, RETRIEVAL.index(name)]
    return columns


def by_kind(rows: pd.DataFrame, questions: pd.DataFrame, overall: pd.DataFrame) -> pd.DataFrame:
    """The summary's columns for each kind of question present (`rows`, one per KINDS), with how
    often answers declined and made facts up, then ALL: the overall row."""
    codes, judged = kind_codes(questions), questions["judged"].to_numpy()
    for name in ("declined", "made_up"):
        values = _column(questions, name)
        rows[name] = group_means(codes[judged], values[judged], len(KINDS))
    rows.insert(0, "kind", list(KINDS))
    whole = overall.drop(columns="document").assign(kind="ALL")
    for name in ("declined", "made_up"):
        whole[name] = overall.get(f"{name}_{suffix(UNANSWERABLE)}", np.nan)
    present = rows[rows["questions"] > 0]
    return pd.concat([present, whole[present.columns]], ignore_index=True)


def group_means(groups: IntArray, values: FloatArray, n: int) -> FloatArray:
    """Each group's mean of `values` (NaN for a group without one)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(groups, values, n) / np.bincount(groups, minlength=n)


def _column(questions: pd.DataFrame, name: str) -> FloatArray:
    """A score column, or NaN for every question when the exam has none (no unanswerable)."""
    if name in questions:
        return np.asarray(questions[name].to_numpy(), dtype=np.float64)
    return np.full(len(questions), np.nan)
