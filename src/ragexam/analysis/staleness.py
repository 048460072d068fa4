"""Stale grades: a judgment made from a question or answer that has changed since is no grade.

`judge` records in `input_hash` what each grade was made from (question, ground truth and
answer). When `answer` or `generate` is redone and `judge` is not, `stats` finds the grades
whose inputs no longer match and counts those questions as pending, never as graded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.io.csvfile import unescape_cell
from ragexam.io.fingerprint import input_hash


def stale_grades(judgments: Path, questions: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """For each question (with texts loaded), whether its grade was made from other inputs."""
    recorded = _recorded(judgments, questions["qa_id"])
    if recorded is None:
        return np.zeros(len(questions), dtype=bool)
    columns = [questions[name] for name in ("question", "ground_truth_answer", "answer")]
    current = [
        input_hash(*(unescape_cell(str(text)) for text in row))
        for row in zip(*columns, strict=True)
    ]
    judged = questions["judged"].to_numpy(dtype=bool)
    changed = (recorded != "") & (recorded != np.array(current, dtype=object))
    return np.asarray(judged & changed, dtype=bool)


def _recorded(judgments: Path, ids: pd.Series) -> npt.NDArray[np.object_] | None:
    """The input_hash each question's judgment recorded ("" for none), or None without any."""
    try:
        frame = pd.read_csv(
            judgments, usecols=["qa_id", "input_hash"], dtype=str, keep_default_na=False
        )
    except (FileNotFoundError, ValueError, pd.errors.EmptyDataError):
        return None  # no judgments yet, or made before grades recorded their inputs
    hashes = dict(zip(frame["qa_id"], frame["input_hash"], strict=True))
    return np.array([hashes.get(qa_id, "") for qa_id in ids], dtype=object)


def drop_stale(questions: pd.DataFrame, stale: npt.NDArray[np.bool_]) -> pd.DataFrame:
    """The questions with stale grades counted as pending: no scores, not judged."""
    if not stale.any():
        return questions
    questions = questions.copy()
    questions.loc[stale, ["completeness", "conciseness"]] = np.nan
    questions.loc[stale, "judged"] = False
    questions.loc[stale, "pending"] = True
    return questions
