"""Which questions a summary covers: one split of the exam, and flagged questions left out or not.

`stats --split NAME` keeps the questions of one split. Every summary counts `flagged`
questions; `--exclude-flagged` keeps them counted in `questions` and `flagged` but out of
every mean, every other count and the worst questions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ragexam.controlruns import CONTROL_RUNS
from ragexam.errors import ConfigError

SCORES = ("rank", "completeness", "conciseness", *CONTROL_RUNS.values())


def _qa_column(path: Path, name: str, ids: pd.Series) -> pd.Series | None:
    """One optional column of qa_dataset.csv, aligned to `ids`; None when the file lacks it."""
    header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
    if name not in header:
        return None
    frame = pd.read_csv(
        path, usecols=["qa_id", name], dtype=str, keep_default_na=False, encoding="utf-8-sig"
    )
    values = frame.drop_duplicates("qa_id", keep="last").set_index("qa_id")[name]
    return values.reindex(ids.to_numpy()).fillna("").reset_index(drop=True)


def select(
    questions: pd.DataFrame, qa_path: Path, split: str | None, exclude_flagged: bool
) -> pd.DataFrame:
    """The questions of `split` (all when None), marked `flagged`; those out of means if asked."""
    if split is not None:
        splits = _qa_column(qa_path, "split", questions["qa_id"])
        if splits is None:
            raise ConfigError(f"{qa_path} has no split column: run generate with --split F first")
        if not (splits == split).any():
            found = ", ".join(sorted(set(splits) - {""})) or "none"
            raise ConfigError(f"no question is in split {split!r}; the splits are: {found}")
        keep = (splits == split).to_numpy()
        questions = questions[keep].reset_index(drop=True)
        documents = questions["document"].cat.remove_unused_categories()
        questions = questions.assign(document=documents)
    flags = _qa_column(qa_path, "flags", questions["qa_id"])
    flagged = np.zeros(len(questions), bool) if flags is None else (flags != "").to_numpy()
    questions = questions.assign(flagged=flagged)
    if exclude_flagged:
        questions = _exclude(questions, flagged)
    return questions


def _exclude(questions: pd.DataFrame, out: np.ndarray) -> pd.DataFrame:
    """Rows in `out` count as questions and nothing else: no error, no pending, no score."""
    questions = questions.copy()
    for name in ("error", "pending", "answered", "judged"):
        questions.loc[out, name] = False
    for name in SCORES:
        if name in questions:
            questions.loc[out, name] = np.nan
    return questions
