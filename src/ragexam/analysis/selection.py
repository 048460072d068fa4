"""Which questions a summary covers: one split of the exam, and flagged questions left out or not.

`stats --split NAME` keeps the questions of one split. Every summary counts `flagged`
questions; `--exclude-flagged` keeps them counted in `questions` and `flagged` but out of
every mean, every other count and the worst questions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ragexam.analysis.controlruns import COLUMNS
from ragexam.errors import ConfigError

SCORES = ("rank", "completeness", "conciseness", "declined", "made_up", *COLUMNS.values())


def _qa_columns(path: Path, names: tuple[str, ...]) -> dict[str, pd.Series]:
    """The optional columns of qa_dataset.csv that it has, in its row order, read in one pass.

    load_questions keeps the file's row order and refuses repeated ids, so rows line up.
    """
    header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
    present = [name for name in names if name in header]
    if not present:
        return {}
    frame = pd.read_csv(
        path, usecols=present, dtype=str, keep_default_na=False, encoding="utf-8-sig"
    )
    return {name: frame[name] for name in present}


def select(
    questions: pd.DataFrame, qa_path: Path, split: str | None, exclude_flagged: bool
) -> pd.DataFrame:
    """The questions of `split` (all when None), marked `flagged`; those out of means if asked."""
    columns = _qa_columns(qa_path, ("split", "flags"))
    flags = columns.get("flags", pd.Series("", index=questions.index))
    questions = questions.assign(flagged=(flags != "").to_numpy())
    if split is not None:
        if "split" not in columns:
            raise ConfigError(f"{qa_path} has no split column: run generate with --split F first")
        keep = (columns["split"] == split).to_numpy()
        if not keep.any():
            found = ", ".join(sorted(set(columns["split"]) - {""})) or "none"
            raise ConfigError(f"no question is in split {split!r}; the splits are: {found}")
        questions = questions[keep].reset_index(drop=True)
        questions["document"] = questions["document"].cat.remove_unused_categories()
    if exclude_flagged:
        questions = _exclude(questions, questions["flagged"].to_numpy())
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
