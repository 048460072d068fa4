"""Control runs in the summary: gold and closed-book completeness, and the measured diagnosis.

`run --controls` answers the same exam with the source chunk handed over (`OUT/gold/`) and with
no context (`OUT/closed_book/`). Retrieval loss is the gold completeness minus the RAG run's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.io.runfolder import CONTROL_RUNS

# each control run's completeness column in the summaries, by the run's folder
COLUMNS = {name: f"completeness_{name}" for name in CONTROL_RUNS}
PRIOR_KNOWLEDGE = 0.6  # closed-book completeness at or above: the questions don't test retrieval
LOW_GOLD = 0.6  # gold completeness below: even the right chunk gives poor answers
RETRIEVAL_LOSS = 0.2  # at or above: retrieval costs this much completeness
MEASURED = {
    "prior_knowledge": "answered closed-book: the questions do not test retrieval",
}


def control_means(
    questions: pd.DataFrame,
    groups: npt.NDArray[np.int64],
    answerable: npt.NDArray[np.bool_],
    n: int,
) -> dict[str, Any]:
    """Per group, the mean completeness of each control run present over its answerable
    questions (`groups`: theirs; gold's over those the run graded too), and the retrieval loss:
    the mean of gold's completeness less the run's, over the questions graded in both (with
    judge errors in either, the means of two sets of questions would be compared; gold less
    the loss, which the report shows as the run's figure, is the run's over the same).
    Unanswerable questions stay out: "I don't know" is their right answer, closed-book too."""
    columns: dict[str, Any] = {}
    graded = questions["judged"].to_numpy()[answerable]  # in the run itself
    for name in COLUMNS.values():
        if name in questions:
            values = questions[name].to_numpy(dtype=float)[answerable]
            judged = ~np.isnan(values)
            if name == "completeness_gold":  # paired with the run's grades, as the loss is:
                judged &= graded  # gold less the loss is then the run's over those questions
            with np.errstate(invalid="ignore", divide="ignore"):
                columns[name] = np.bincount(groups[judged], values[judged], n) / np.bincount(
                    groups[judged], minlength=n
                )
    if "completeness_gold" in columns:  # paired: the questions graded in both runs
        gold = questions["completeness_gold"].to_numpy(dtype=float)[answerable]
        rag = questions["completeness"].to_numpy(dtype=float)[answerable]
        both = questions["judged"].to_numpy()[answerable] & ~np.isnan(gold)
        with np.errstate(invalid="ignore", divide="ignore"):
            columns["retrieval_loss"] = np.bincount(
                groups[both], gold[both] - rag[both], n
            ) / np.bincount(groups[both], minlength=n)
    return columns


def measured_diagnosis(
    columns: dict[str, Any], fallback: npt.NDArray[np.str_], low_conciseness: Any
) -> npt.NDArray[np.str_]:
    """First match wins: prior_knowledge, generation, retrieval, too much context, ok.

    A group without both control figures keeps the threshold diagnosis (`fallback`), and
    one with no judged question stays "not judged".
    """
    if not all(name in columns for name in COLUMNS.values()):
        return fallback
    # Rounded so that a mean meant as 0.2 (1.0 - 0.8 = 0.19999999999999996) meets its threshold.
    gold, closed, loss = (
        np.round(columns[name], 9)
        for name in ("completeness_gold", "completeness_closed_book", "retrieval_loss")
    )
    cases = [closed >= PRIOR_KNOWLEDGE, gold < LOW_GOLD, loss >= RETRIEVAL_LOSS, low_conciseness]
    measured = np.select(
        cases, ["prior_knowledge", "generation", "retrieval", "too much context"], "ok"
    )
    usable = ~np.isnan(gold) & ~np.isnan(closed) & ~np.isnan(loss)
    return np.where(usable & (fallback != "not judged"), measured, fallback)
