"""The stats stage: join the three CSVs on qa_id and summarise per document and overall."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.calibrate import read_calibration
from ragexam.analysis.controlruns import control_means, measured_diagnosis
from ragexam.analysis.cutoffs import cutoff_columns
from ragexam.analysis.grouped import grouped_bootstrap_ci
from ragexam.analysis.keypoints import exam_key_points, graded_by_key_points
from ragexam.analysis.keypointstats import kappa_bounds, key_point_columns
from ragexam.analysis.kinds import BoolArray, by_kind, kind_codes, kind_columns, retrieved
from ragexam.analysis.missed import most_missed
from ragexam.analysis.questions import (
    deepest_rank,
    error_reasons,
    load_questions,
    resolve_k,
    run_context,
)
from ragexam.analysis.ranking import RankStates, question_states
from ragexam.analysis.resampling import RESAMPLES, bootstrap_ci
from ragexam.analysis.selection import select
from ragexam.analysis.staleness import drop_stale, stale_answers, stale_grades
from ragexam.analysis.summary import (
    COUNTS,
    LOW_COMPLETENESS,
    LOW_CONCISENESS,
    LOW_HIT_RATE,
    RETRIEVAL,
    TEXTS,
    WORST_QUESTIONS,
    StatsResult,
)
from ragexam.analysis.verdict import read_verdict
from ragexam.io.atomic import atomic_file
from ragexam.io.cells import KINDS, UNANSWERABLE
from ragexam.io.csvfile import escape_cell, unescape_cell
from ragexam.io.runfolder import RunFolder

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
CI = Callable[[IntArray, FloatArray, int], tuple[FloatArray, FloatArray]]

logger = logging.getLogger("ragexam")


@dataclass(frozen=True)
class StatsOptions:
    """What `ragexam stats` was asked to do."""

    out: Path
    k: int | None = None
    seed: int = 0
    split: str | None = None
    exclude_flagged: bool = False


def run_stats(options: StatsOptions) -> StatsResult:
    """Compute the summary and write summary_by_document.csv and summary.csv (the API then
    draws report.html from the result); no LLM call is made."""
    return _summarise_run(options)


def _summarise_run(options: StatsOptions) -> StatsResult:
    out = options.out
    questions = load_questions(out, texts=True)
    folder = RunFolder(out)
    points = exam_key_points(folder) if graded_by_key_points(folder) else {}
    stale, moved = stale_grades(folder, questions, points), stale_answers(folder, questions)
    # grades whose answer is gone, or made for another version of its question: answer redoes
    unanswered = int(((stale & ~questions["answered"].to_numpy(dtype=bool)) | moved).sum())
    questions = drop_stale(questions, stale, moved)
    stale |= moved
    exam = folder.exam()  # answer records where its exam came from
    questions = select(questions, exam, options.split, options.exclude_flagged)
    k = resolve_k(out, options.k)
    states = question_states(questions, k, _depth(out, questions, options.k))
    by_document, overall = summarise(questions, states, options.seed)
    kinds = summarise_kinds(questions, states, overall, options.seed)
    names = ("summary_by_document", "summary") + ("summary_by_kind",) * (not kinds.empty)
    paths = {name: out / f"{name}.csv" for name in names}
    paths["report"] = out / "report.html"
    worst, context = worst_questions(questions, k), run_context(out, k)
    verdict = read_verdict(out)
    if verdict is not None:
        overall = overall.assign(**verdict.columns())
    result = StatsResult(by_document, overall, k, paths, worst, context, options.seed)
    calibration = read_calibration(out)
    result = replace(result, controls=verdict, calibration=calibration, stale=int(stale.sum()))
    result = replace(result, unanswered=unanswered)
    result = replace(result, questions=questions, out=out, by_kind=kinds)
    result = replace(result, missed=most_missed(folder.judgments, questions, points))
    if int(overall["errors"].iloc[0]):  # why, beside how many
        result = replace(result, errors=error_reasons(out))
    _write_csv(by_document, paths["summary_by_document"])
    _write_csv(overall, paths["summary"])
    if kinds.empty:  # an earlier exam's would now be stale
        (out / "summary_by_kind.csv").unlink(missing_ok=True)
    else:
        with atomic_file(paths["summary_by_kind"]) as handle:
            kinds.to_csv(handle, index=False, float_format="%.12g")
    return result


# The retrieval columns in the order design.md lists them (NDCG before MAP)
WRITTEN = ("hit_rate", "mrr", "ndcg", "map", "precision", "recall", "f1", "all_found")


def _depth(out: Path, questions: pd.DataFrame, asked: int | None) -> int:
    """How far the rank distribution goes: to k, but for a --k past every answer's retrieved
    chunks (`stats --k 10000`), which stops it at the deepest (or at the k answer used).
    Precision and F1 are at the k asked all the same, as trec_eval's: the places past an
    answer's last chunk hold nothing relevant."""
    deepest = deepest_rank(out, questions) if asked is not None else None
    if asked is None or deepest is None or asked <= deepest:
        return 0
    depth = max(deepest, resolve_k(out, None))
    if asked > depth:  # asked for: never silently cut
        logger.warning(
            f"stats: --k {asked} is past every answer's retrieved chunks ({deepest} at most): "
            f"precision and F1 count the places past an answer's last chunk as not relevant, "
            f"and the rank distribution stops at {depth}"
        )
    return min(asked, depth)


# -- summarising ---------------------------------------------------------------------------------


def summarise(
    questions: pd.DataFrame, states: RankStates, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-document summary (worst completeness first) and the overall one (document ALL)."""
    documents = questions["document"].cat
    codes = documents.codes.to_numpy().astype(np.int64)
    n = len(documents.categories)
    by_document = _columns(questions, codes, n, states, partial(grouped_bootstrap_ci, seed=seed))
    by_document = by_document.assign(**kind_columns(questions, codes, n, states))
    by_document.insert(0, "document", documents.categories.astype(str))
    by_document = by_document.sort_values(
        ["completeness_mean", "hit_rate", "document"], na_position="last", kind="stable"
    ).reset_index(drop=True)
    whole = np.zeros(len(questions), np.int64)
    overall = _columns(questions, whole, 1, states, partial(_overall_ci, seed=seed))
    overall = overall.assign(**kind_columns(questions, whole, 1, states))
    overall.insert(0, "document", "ALL")
    return by_document, overall.assign(**kappa_bounds(questions, seed))


def summarise_kinds(
    questions: pd.DataFrame, states: RankStates, overall: pd.DataFrame, seed: int = 0
) -> pd.DataFrame:
    """One row per kind of question the exam holds, then ALL (the overall row); no rows when
    every question is single."""
    codes = kind_codes(questions)
    if not codes.any():
        return pd.DataFrame()
    ci = partial(grouped_bootstrap_ci, seed=seed)
    rows = _columns(questions, codes, len(KINDS), states, ci, every_kind=True)
    return by_kind(rows, questions, overall)


def _columns(
    questions: pd.DataFrame,
    groups: IntArray,
    n: int,
    states: RankStates,
    ci: CI,
    every_kind: bool = False,
) -> pd.DataFrame:
    """Every summary column but `document`, one row per group. Conciseness is read over the
    answerable questions (unless `every_kind`: a row per kind, each its own): a right
    answer to an unanswerable question declines, and a decline states nothing, so its
    conciseness is 0 and would call a document of right declines wordy."""
    columns: dict[str, Any] = {"questions": np.bincount(groups, minlength=n)}
    for name, flag in COUNTS.items():
        columns[name] = np.bincount(groups[questions[flag].to_numpy()], minlength=n)
    if "flagged" in questions:
        columns["flagged"] = np.bincount(groups[questions["flagged"].to_numpy()], minlength=n)
    judged = questions["judged"].to_numpy()
    answerable = kind_codes(questions) != KINDS.index(UNANSWERABLE)
    for name in ("completeness", "conciseness"):
        over = judged if name == "completeness" or every_kind else judged & answerable
        values = questions[name].to_numpy()[over]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.bincount(groups[over], values, n) / np.bincount(groups[over], minlength=n)
        columns[f"{name}_mean"] = means
        columns[f"{name}_ci_low"], columns[f"{name}_ci_high"] = ci(groups[over], values, n)
    columns.update(key_point_columns(questions, groups, n, judged))
    scored = retrieved(questions)
    columns["n_ranked"] = np.bincount(groups[scored], minlength=n)  # the retrieval means' n
    columns.update(_retrieval(groups[scored], states.index[scored], states, n, ci))
    columns.update(cutoff_columns(groups[scored], states.index[scored], states, n))
    alone = np.bincount(groups[answerable], minlength=n) == 0  # unanswerable questions alone
    read = judged & answerable
    completeness, conciseness, counted = _read_from(questions, groups, n, read, alone, columns)
    if not answerable.all():  # what the diagnosis reads, beside the mean of every question
        columns["completeness_answerable"] = np.where(alone, np.nan, completeness)
    graded = np.where(alone, columns["n_judged"], counted)  # what the diagnosis is read from
    columns.update(control_means(questions, groups[answerable], answerable, n))
    # the hit rate of the questions the grades are read from: with judge errors among them,
    # the grades of a few would else be read beside the retrieval of all
    both = scored & read
    hit_rate = states.means(groups[both], states.index[both], n)[1][:, RETRIEVAL.index("hit_rate")]
    diagnosis = diagnose(completeness, conciseness, hit_rate, graded)
    low_conciseness = np.round(conciseness, 9) < LOW_CONCISENESS  # as written: 0.6 is not low
    columns["diagnosis"] = measured_diagnosis(columns, diagnosis, low_conciseness)
    return pd.DataFrame(columns)


def _read_from(
    questions: pd.DataFrame,
    groups: IntArray,
    n: int,
    answerable: BoolArray,
    alone: BoolArray,
    columns: Any,
) -> tuple[FloatArray, FloatArray, IntArray]:
    """The completeness and conciseness a group's diagnosis is read from, and how many graded
    questions they are of: its `answerable` ones (a right answer to an unanswerable question
    declines, and a decline states nothing: its conciseness is 0, and its closed-book answer is
    right). A group with only unanswerable questions is read by whether they were declined
    (completeness), and by no conciseness."""
    means = []
    counted = np.bincount(groups[answerable], minlength=n)
    for name in ("completeness", "conciseness"):
        values = questions[name].to_numpy()[answerable]
        with np.errstate(invalid="ignore", divide="ignore"):
            means.append(np.bincount(groups[answerable], values, n) / counted)
    # a group of unanswerable questions alone is read by its declines; one whose answerable
    # questions are not graded yet has nothing to read (not judged), whatever its declines
    completeness = np.where(alone, columns["completeness_mean"], means[0])
    return completeness, np.where(alone, np.nan, means[1]), counted


def _retrieval(
    groups: IntArray, index: IntArray, states: RankStates, n: int, ci: CI
) -> dict[str, Any]:
    """Retrieval means (misses included), hit rate and MRR CIs, and the best-rank histogram."""
    counts, means = states.means(groups, index, n)
    table = states.table()
    columns: dict[str, Any] = {}
    for name in WRITTEN:
        position = RETRIEVAL.index(name)
        columns[name] = means[:, position]
        if name in ("hit_rate", "mrr"):
            bounds = ci(groups, table[index, position], n)
            columns[f"{name}_ci_low"], columns[f"{name}_ci_high"] = bounds
    columns["missed"] = counts @ (table[:, 0] == 0).astype(np.int64)
    best = states.best()
    for rank in range(1, states.ranks + 1):
        columns[f"rank_{rank}"] = counts @ (best == rank).astype(np.int64)
    return columns


def diagnose(
    completeness: FloatArray, conciseness: FloatArray, hit_rate: FloatArray, n_judged: IntArray
) -> npt.NDArray[np.str_]:
    """The procedure's reading of each document: one of the keys of DIAGNOSES. The means are
    compared as written (rounded): a mean of 0.6 is not below 0.6 for a float's last bit."""
    completeness, conciseness, hit_rate = (
        np.round(values, 9) for values in (completeness, conciseness, hit_rate)
    )
    low = completeness < LOW_COMPLETENESS
    cases = [n_judged == 0, low & (hit_rate < LOW_HIT_RATE), low, conciseness < LOW_CONCISENESS]
    return np.select(cases, ["not judged", "retrieval", "generation", "too much context"], "ok")


def _overall_ci(
    groups: IntArray, values: FloatArray, n: int, *, seed: int
) -> tuple[FloatArray, FloatArray]:
    """One group: metrics.bootstrap_ci, the exact multinomial bootstrap."""
    low, high = bootstrap_ci(values, seed=seed, resamples=RESAMPLES)
    return np.array([low]), np.array([high])


def worst_questions(questions: pd.DataFrame, k: int, limit: int = WORST_QUESTIONS) -> pd.DataFrame:
    """The questions with the lowest completeness, then conciseness, then the worst rank;
    none that is perfect (a small run's 20 worst were filled with perfect answers)."""
    judged, answered = questions["judged"].to_numpy(), questions["answered"].to_numpy()
    completeness = np.where(judged, questions["completeness"].to_numpy(), np.inf)
    candidates = np.flatnonzero((judged | answered) & ~_perfect(questions))
    if candidates.size > limit:  # only the rows that can make the cut are sorted
        cut = np.partition(completeness[candidates], limit - 1)[limit - 1]
        candidates = candidates[completeness[candidates] <= cut]
    conciseness = np.where(judged, questions["conciseness"].to_numpy(), np.inf)
    states = question_states(questions, k)
    rr = np.where(retrieved(questions), states.table()[states.index, 1], np.inf)
    keys = (rr[candidates], conciseness[candidates], completeness[candidates])
    chosen = candidates[np.lexsort(keys)[:limit]]
    columns = ["qa_id", "document", *TEXTS, "answer", "rank", "completeness", "conciseness"]
    worst = questions.iloc[chosen][[*columns, "kind"]].reset_index(drop=True)
    worst["kind"] = worst["kind"].astype(str)
    for name in ("qa_id", "question", "ground_truth_answer", "answer"):
        worst[name] = worst[name].map(unescape_cell).astype(object)
    worst["document"] = worst["document"].astype(str)
    return worst


def _perfect(questions: pd.DataFrame) -> BoolArray:
    """Graded in full, concise, its chunk first; for an unanswerable question, declined and
    nothing made up."""
    judged = questions["judged"].to_numpy()
    complete = judged & (questions["completeness"].to_numpy() >= 1)
    answerable = kind_codes(questions) != KINDS.index(UNANSWERABLE)
    first = questions["rank"].to_numpy() == 1
    concise = questions["conciseness"].to_numpy() >= 1
    honest = questions["made_up"].to_numpy() == 0 if "made_up" in questions else ~answerable
    return np.asarray(complete & np.where(answerable, concise & first, honest), bool)


# -- writing -------------------------------------------------------------------------------------


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Write atomically, with the document names escaped as every ragexam CSV is."""
    escaped = frame.assign(document=frame["document"].map(escape_cell))
    with atomic_file(path) as handle:
        escaped.to_csv(handle, index=False, float_format="%.12g")  # 0.8, not 0.79999999999
