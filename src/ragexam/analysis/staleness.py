"""Stale grades: a judgment made from a question or answer that has changed since is no grade.

`judge` records in `input_hash` what each grade was made from (question, ground truth and
answer; by key points, the key points too, and with --with-context the retrieved chunks). When
`answer` or `generate` is redone, or a key point edited, and `judge` is not, `stats` finds the
grades whose inputs no longer match and counts those questions as pending, never as graded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.keypoints import marked_hash
from ragexam.io.cells import id_list, question_chunks
from ragexam.io.csvfile import unescape_cell
from ragexam.io.fingerprint import answer_hash, input_hash
from ragexam.io.runfolder import RunFolder, answered_as_it_is

HOW = ("input_hash", "scale", "with_context")  # what a judgment says it was made from


def stale_grades(
    folder: RunFolder, questions: pd.DataFrame, key_points: dict[str, str | None]
) -> npt.NDArray[np.bool_]:
    """For each question (with texts loaded), whether its grade was made from other inputs;
    `key_points` holds each question's key points (the exam's, else those written for it)."""
    recorded = _recorded(folder.judgments, questions["qa_id"])
    if recorded is None:
        return np.zeros(len(questions), dtype=bool)
    contexts = _contexts(folder, questions["qa_id"], recorded["with_context"])
    columns = [questions[name] for name in ("qa_id", "question", "ground_truth_answer", "answer")]
    current = [
        _hash(row, scale, key_points, context)
        for row, scale, context in zip(
            zip(*columns, strict=True), recorded["scale"], contexts, strict=True
        )
    ]
    judged = questions["judged"].to_numpy(dtype=bool)
    hashes = recorded["input_hash"]
    changed = (hashes != "") & (hashes != np.array(current, dtype=object))
    return np.asarray(judged & changed, dtype=bool)


def _hash(
    row: tuple[str, ...], scale: str, key_points: dict[str, str | None], context: str | None
) -> str:
    qa_id, *texts = (unescape_cell(str(text)) for text in row)
    if scale != "key-points":
        return input_hash(*texts)
    question, truth, answer = texts
    return marked_hash(question, truth, answer, key_points.get(qa_id), context)


def _contexts(
    folder: RunFolder, ids: pd.Series, wanted: npt.NDArray[np.object_]
) -> list[str | None]:
    """The retrieved texts of the answers graded --with-context; None for the others."""
    if not (wanted == "true").any():
        return [None] * len(ids)
    try:
        frame = pd.read_csv(
            folder.answers_read(), usecols=["qa_id", "retrieved_texts"], dtype=str,
            keep_default_na=False, encoding="utf-8-sig",
        )  # fmt: skip
    except (FileNotFoundError, ValueError, pd.errors.EmptyDataError):
        return [None] * len(ids)
    texts = dict(zip(frame["qa_id"], map(unescape_cell, frame["retrieved_texts"]), strict=True))
    return [
        texts.get(qa_id, "") if flag == "true" else None
        for qa_id, flag in zip(ids, wanted, strict=True)
    ]


def _recorded(judgments: Path, ids: pd.Series) -> dict[str, npt.NDArray[np.object_]] | None:
    """What each question's judgment says it was made from ("" for none), or None without any."""
    try:
        header = pd.read_csv(judgments, nrows=0).columns
        present = [name for name in HOW if name in header]
        frame = pd.read_csv(
            judgments, usecols=["qa_id", *present], dtype=str, keep_default_na=False
        )
    except (FileNotFoundError, ValueError, pd.errors.EmptyDataError):
        return None  # no judgments yet, or made before grades recorded their inputs
    if "input_hash" not in present:
        return None
    frame = frame.drop_duplicates("qa_id", keep="last")  # a repeated qa_id: the later row wins
    rows = pd.Index(frame["qa_id"]).get_indexer(pd.Index(ids))
    empty = np.full(len(frame), "", dtype=object)
    columns = {
        name: frame[name].to_numpy(dtype=object) if name in present else empty for name in HOW
    }
    return {name: np.append(values, "")[rows] for name, values in columns.items()}


def stale_answers(folder: RunFolder, questions: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """For each question (with texts loaded, in the exam's order), whether its answer was
    made for another version of it (question, ground truth or source chunks edited since): no
    answer to it, nor a rank, until `answer` redoes it. Answers that recorded no input are
    taken as they are."""
    none = np.zeros(len(questions), dtype=bool)
    try:
        if answered_as_it_is(folder.exam(), folder.answers_read()):
            return none
        made = _columns(folder.answers_read(), ["qa_id", "input_hash", "status"], "input_hash")
        sources = _columns(folder.exam(), ["chunk_id", "chunk_ids"])
    except (FileNotFoundError, ValueError, pd.errors.EmptyDataError):
        return none
    if made is None or sources is None or "status" not in made or len(sources) != len(none):
        return none  # hand-made or older answers, or an exam read otherwise: as they are
    made = made[(made["status"] == "ok") & (made["input_hash"] != "")]
    made = made.drop_duplicates("qa_id", keep="last")  # a repeated qa_id: the later row wins
    rows = pd.Index(made["qa_id"]).get_indexer(pd.Index(questions["qa_id"]))
    recorded = np.append(made["input_hash"].to_numpy(dtype=object), "")[rows]
    blank = pd.Series("", index=sources.index)
    columns = [questions[name] for name in ("question", "ground_truth_answer")]
    columns += [sources.get(name, blank) for name in ("chunk_id", "chunk_ids")]
    stale = none.copy()
    rows_of = zip(recorded, *columns, strict=True)
    for n, (made_from, question, truth, chunk, chunks) in enumerate(rows_of):
        if made_from and made_from != answer_hash(
            _plain(question), _plain(truth), _sources(chunk, chunks)
        ):
            stale[n] = True
    return stale


def _plain(cell: str) -> str:
    """A text cell as it was written: escape_cell's apostrophe off, when it added one."""
    return unescape_cell(cell) if cell[:1] == "'" else cell


def _columns(path: Path, names: list[str], needed: str | None = None) -> pd.DataFrame | None:
    """These of the CSV's columns that it has, as text; None when it lacks `needed` (or all)."""
    header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
    present = [name for name in names if name in header]
    if not present or (needed is not None and needed not in present):
        return None
    return pd.read_csv(
        path, usecols=present, dtype=str, keep_default_na=False, encoding="utf-8-sig"
    )


def _sources(chunk: str, chunks: str) -> tuple[str, ...]:
    """A question's source chunks, as `answer` reads them, from the cells as written."""
    listed = (id_list(unescape_cell(chunks)) or ()) if chunks else ()
    return question_chunks(unescape_cell(chunk), listed)


def drop_stale(
    questions: pd.DataFrame,
    stale: npt.NDArray[np.bool_],
    answers: npt.NDArray[np.bool_] | None = None,
) -> pd.DataFrame:
    """The questions with stale grades counted as pending: no scores, not judged; those with
    stale `answers` not answered either (no rank: what was retrieved was for another question)."""
    moved = answers if answers is not None else np.zeros(len(questions), dtype=bool)
    if not (stale.any() or moved.any()):
        return questions
    questions = questions.copy()
    either = stale | moved
    questions.loc[either, ["completeness", "conciseness"]] = np.nan
    questions.loc[either, "judged"] = False
    questions.loc[either & ~questions["error"].to_numpy(dtype=bool), "pending"] = True
    if moved.any():
        questions.loc[moved, "answered"] = False
        questions.loc[moved, "rank"] = np.nan
    return questions
