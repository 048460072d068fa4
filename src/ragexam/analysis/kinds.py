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
from ragexam.io.cells import (
    KINDS,
    MULTI_HOP,
    NOT_A_KIND,
    SINGLE,
    UNANSWERABLE,
    id_list,
    rank_list,
)
from ragexam.io.csvfile import unescape_cell

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
# The judge's verdicts (judgments.csv), when it grades by key points.
VERDICTS = ("key_point_verdicts", "answer_statements")
UNKNOWN = -1  # relevant chunks not known from the exam: its answer's target_ranks say
MADE_UP = ("unsupported", "contradicted")  # an answer statement the ground truth does not bear
# Without verdicts, the judge's scores stand in: the ground truth of an unanswerable question
# is the decline itself, so completeness says whether the answer declined, and conciseness
# how much of it is that decline rather than something else.
DECLINED_AT, MADE_UP_BELOW = 0.5, 0.5


def exam_kinds(qa: pd.DataFrame, path: Path) -> tuple[pd.Categorical[str], IntArray]:
    """Each question's kind and its count of relevant chunks, R: 1 for a single question, 0 for
    an unanswerable one, len(chunk_ids) for a multi-hop one, or UNKNOWN when the exam has no
    chunk_ids read: its answer's target_ranks then say (found_ranks).

    Without a `kind` column the kind follows from `chunk_ids` (none: unanswerable, several:
    multi-hop); without either, every question is single, with one relevant chunk.
    """
    n = len(qa)
    codes = np.zeros(n, dtype=np.int64)
    if "kind" in qa:  # a categorical column: each distinct value is checked once
        column = qa["kind"].astype("category")
        named = [KINDS.index(name) if name in KINDS else -1 for name in column.cat.categories]
        codes = np.array([*named, 0], dtype=np.int64)[column.cat.codes.to_numpy()]
        empty = (column == "").to_numpy()
        codes[empty] = KINDS.index(SINGLE)
        _refuse(path, qa["qa_id"], codes < 0, NOT_A_KIND)
    relevant = np.select(
        [codes == KINDS.index(UNANSWERABLE), codes == KINDS.index(MULTI_HOP)], [0, UNKNOWN], 1
    ).astype(np.int64)
    if "chunk_ids" in qa:  # a hand-made exam without kinds: the chunks say
        lengths = [_length(cell) for cell in qa["chunk_ids"].tolist()]
        bad = (qa["status"] == "ok").to_numpy() & np.array([n is None for n in lengths], bool)
        _refuse(path, qa["qa_id"], bad, "chunk_ids that are no JSON array of ids")
        relevant = np.array([1 if length is None else length for length in lengths], np.int64)
        codes = np.select([relevant == 0, relevant > 1], [2, 1], 0).astype(np.int64)
    categories = pd.Categorical.from_codes(codes, categories=pd.Index(KINDS))
    return categories, relevant


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
    """For each `wanted` question (answered, several or UNKNOWN relevant chunks), the ranks it
    found them at, from its `target_ranks` cell (None for the others); an UNKNOWN R becomes
    the count of target_ranks, in place. Each distinct cell is parsed once."""
    found = np.full(len(wanted), None, dtype=object)
    rows = np.flatnonzero(wanted) if cells is not None else np.zeros(0, np.int64)
    texts = [str(cell) for cell in cells[rows]] if cells is not None else []
    parsed: dict[str, tuple[int | None, ...] | None] = {}
    for row, cell in zip(rows.tolist(), texts, strict=True):
        ranks = parsed[cell] if cell in parsed else parsed.setdefault(cell, rank_list(cell))
        if relevant[row] == UNKNOWN and ranks is not None and len(ranks) >= 2:
            relevant[row] = len(ranks)  # a multi-hop question has two chunks or more
        if ranks is None or len(ranks) != relevant[row]:
            _wrong_ranks(path, unescape_cell(str(ids.iloc[row])), int(relevant[row]))
        found[row] = tuple(rank for rank in ranks or () if rank is not None)
    relevant[relevant == UNKNOWN] = 2  # a multi-hop question not answered: two, as written
    return found


def _wrong_ranks(path: Path, qa_id: str, relevant: int) -> None:
    chunks = f"{relevant} ranks or nulls, one per chunk of its chunk_ids"
    if relevant == UNKNOWN:
        chunks = "a rank or null for each of its chunk_ids (a multi-hop question has two or more)"
    raise InputFileError(
        path, f"the row of qa_id {qa_id!r} needs target_ranks: a JSON array of {chunks}"
    )


def declines(
    values: Mapping[str, npt.NDArray[Any]], unanswerable: BoolArray
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """For each graded unanswerable question, 1.0 or 0.0: did the answer decline, did it make
    facts up (NaN for the others). From the judge's verdicts, else its scores."""
    completeness, conciseness = values["completeness"], values["conciseness"]
    # float32: a flag in a column of a million questions (NaN for the other kinds)
    declined = np.full(len(unanswerable), np.nan, dtype=np.float32)
    made_up = np.full(len(unanswerable), np.nan, dtype=np.float32)
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
        columns[f"n_judged_{end}"] = np.bincount(groups[graded], minlength=n)  # their means' n
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
