"""The stats stage: join the three CSVs on qa_id and summarise per document and overall."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import suppress
from dataclasses import astuple, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.calibrate import read_calibration
from ragexam.analysis.controlruns import CONTROL_RUNS, MEASURED, control_means, measured_diagnosis
from ragexam.analysis.cutoffs import cutoff_columns
from ragexam.analysis.grouped import grouped_bootstrap_ci
from ragexam.analysis.metrics import score_rank
from ragexam.analysis.resampling import RESAMPLES, bootstrap_ci
from ragexam.analysis.selection import select
from ragexam.analysis.staleness import drop_stale, stale_grades
from ragexam.analysis.verdict import Verdict, read_verdict
from ragexam.errors import InputFileError
from ragexam.io.csvfile import atomic_file, escape_cell, unescape_cell
from ragexam.io.lock import run_folder_lock
from ragexam.io.manifest import input_file, read_manifest

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
CI = Callable[[IntArray, FloatArray, int], tuple[FloatArray, FloatArray]]

QA_FILE, ANSWERS_FILE, JUDGMENTS_FILE = "qa_dataset.csv", "answers.csv", "judgments.csv"
TEXTS = ("question", "ground_truth_answer")  # read only for the report's worst questions
DEFAULT_K = 5
WORST_QUESTIONS = 20
# The procedure's own reading of a document; the report states these thresholds.
LOW_COMPLETENESS = 0.6  # below: answers leave out facts of the ground truth
LOW_HIT_RATE = 0.7  # below: the source chunk is often not among the k retrieved
LOW_CONCISENESS = 0.6  # below: answers carry much that was not asked
DIAGNOSES = {
    "retrieval": "low completeness and low hit rate: the source chunk is often not retrieved",
    "generation": "low completeness although the source chunk is retrieved: the answer misses it",
    "too much context": "complete but not concise: retrieve fewer chunks, or rerank them",
    "ok": "complete and concise",
    "not judged": "no judged question yet, so no judge-based diagnosis",
    **MEASURED,
}
COUNTS = {"errors": "error", "pending": "pending", "n_answered": "answered", "n_judged": "judged"}
RETRIEVAL = ("hit_rate", "mrr", "map", "ndcg", "precision", "recall", "f1")  # RetrievalScores order


@dataclass(frozen=True)
class StatsOptions:
    """What `ragexam stats` was asked to do."""

    out: Path
    k: int | None = None
    seed: int = 0
    split: str | None = None
    exclude_flagged: bool = False


@dataclass(frozen=True)
class StatsResult:
    """The summary, computed once: per document, overall, and where it was written."""

    by_document: pd.DataFrame
    overall: pd.DataFrame
    k: int
    paths: dict[str, Path]
    worst: pd.DataFrame = field(default_factory=pd.DataFrame)
    context: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    controls: Verdict | None = None  # the judge's known-answer controls, when it graded some
    calibration: pd.DataFrame | None = None  # calibration.csv, when a person labelled answers
    stale: int = 0  # grades made from a question or answer that has changed: counted pending
    questions: pd.DataFrame = field(default_factory=pd.DataFrame)  # every one, for the drill-down
    out: Path | None = None


def run_stats(options: StatsOptions) -> StatsResult:
    """Write summary_by_document.csv, summary.csv and report.html; no LLM call is made."""
    with run_folder_lock(options.out):
        return _summarise_run(options)


def _summarise_run(options: StatsOptions) -> StatsResult:
    from ragexam.report.html import write_report  # report imports this module for StatsResult

    out = options.out
    questions = load_questions(out, texts=True)
    stale = stale_grades(out / JUDGMENTS_FILE, questions)
    questions = drop_stale(questions, stale)
    exam = input_file(out, QA_FILE, "qa_dataset")  # answer records where its exam came from
    questions = select(questions, exam, options.split, options.exclude_flagged)
    k = resolve_k(out, options.k)
    k = min(k, deepest_rank(out, questions) or k)  # a k past every retrieved chunk adds nothing
    by_document, overall = summarise(questions, k, options.seed)
    paths = {name: out / f"{name}.csv" for name in ("summary_by_document", "summary")}
    paths["report"] = out / "report.html"
    worst, context = worst_questions(questions, k), run_context(out, k)
    verdict = read_verdict(out)
    if verdict is not None:
        overall = overall.assign(**verdict.columns())
    result = StatsResult(by_document, overall, k, paths, worst, context, options.seed)
    calibration = read_calibration(out)
    result = replace(result, controls=verdict, calibration=calibration, stale=int(stale.sum()))
    result = replace(result, questions=questions, out=out)
    _write_csv(by_document, paths["summary_by_document"])
    _write_csv(overall, paths["summary"])
    write_report(result, paths["report"])
    return result


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
        ids = _read(input_file(out, ANSWERS_FILE, "answers"), ("retrieved_ids",))["retrieved_ids"]
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


# -- reading -------------------------------------------------------------------------------------


def _read(path: Path, columns: tuple[str, ...], numbers: tuple[str, ...] = ()) -> pd.DataFrame:
    """The `columns` of an input CSV: text verbatim (an id "NA" stays "NA"), `numbers` as floats."""
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
        missing = [name for name in columns if name not in header]
        if missing:
            raise InputFileError(path, f"lacks the column(s) {', '.join(missing)}")
        dtypes = {name: "float64" if name in numbers else str for name in columns}
        return pd.read_csv(
            path,
            usecols=list(columns),
            dtype=dtypes,
            keep_default_na=False,
            na_values={name: [""] for name in numbers},
            encoding="utf-8-sig",
        )
    except FileNotFoundError:
        raise InputFileError(path, "not found; run the stage that writes it first") from None
    except pd.errors.EmptyDataError:
        raise InputFileError(path, "is empty; it needs at least a header row") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise InputFileError(path, f"is not a readable UTF-8 CSV ({exc})") from None
    except ValueError as exc:  # a number column holds text
        raise InputFileError(path, f"{', '.join(numbers)} must be numbers ({exc})") from None


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


def load_questions(out: Path, *, texts: bool = False) -> pd.DataFrame:
    """One row per question of qa_dataset.csv, joined on qa_id with its answer and judgment."""
    qa_path = input_file(out, QA_FILE, "qa_dataset")  # answer records where its exam came from
    qa = _read(qa_path, ("qa_id", "document", "status", *(TEXTS if texts else ())))
    index = pd.Index(qa["qa_id"])
    if not index.is_unique:
        repeated = unescape_cell(str(qa["qa_id"][index.duplicated()].iloc[0]))
        raise InputFileError(qa_path, f"repeats qa_id {repeated!r}; each needs its own")
    answers_path = input_file(out, ANSWERS_FILE, "answers")
    answers = _aligned(answers_path, index, ("target_rank",), ("answer",) if texts else ())
    judgments = _aligned(out / JUDGMENTS_FILE, index, ("completeness", "conciseness"), ())
    failed = (answers.present & ~answers.ok) | (judgments.present & ~judgments.ok)
    error = (qa["status"] != "ok").to_numpy() | failed
    frame = pd.DataFrame(
        {
            "qa_id": qa["qa_id"],
            "document": _documents(qa["document"]),
            "error": error,
            "pending": ~error & ~(answers.present & judgments.present),
            "answered": answers.ok,
            "judged": judgments.ok,
            "rank": answers.values["target_rank"],
            **judgments.values,
        }
    )
    if texts:
        frame = frame.assign(**{name: qa[name] for name in TEXTS}, answer=answers.values["answer"])
    for folder, column in CONTROL_RUNS.items():  # control runs, when `run --controls` made them
        if (out / folder / JUDGMENTS_FILE).exists():
            control = _aligned(out / folder / JUDGMENTS_FILE, index, ("completeness",), ())
            frame[column] = control.values["completeness"]
    return frame


# -- summarising ---------------------------------------------------------------------------------


def score_table(k: int) -> FloatArray:
    """Row 0 scores a miss, row r the source chunk at rank r: metrics.score_rank (trec_eval)."""
    return np.array([astuple(score_rank(rank, k)) for rank in [None, *range(1, k + 1)]])


def rank_index(questions: pd.DataFrame, k: int) -> IntArray:
    """0 for a miss (no rank, or a rank beyond k), else the rank; for answered questions."""
    rank = questions["rank"].to_numpy()
    return np.where(rank <= k, rank, 0).astype(np.int64)


def summarise(questions: pd.DataFrame, k: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-document summary (worst completeness first) and the overall one (document ALL)."""
    documents = questions["document"].cat
    codes = documents.codes.to_numpy().astype(np.int64)
    by_document = _columns(
        questions, codes, len(documents.categories), k, partial(grouped_bootstrap_ci, seed=seed)
    )
    by_document.insert(0, "document", documents.categories.astype(str))
    by_document = by_document.sort_values(
        ["completeness_mean", "hit_rate", "document"], na_position="last", kind="stable"
    ).reset_index(drop=True)
    overall = _columns(
        questions, np.zeros(len(questions), np.int64), 1, k, partial(_overall_ci, seed=seed)
    )
    overall.insert(0, "document", "ALL")
    return by_document, overall


def _columns(questions: pd.DataFrame, groups: IntArray, n: int, k: int, ci: CI) -> pd.DataFrame:
    """Every summary column but `document`, one row per group."""
    columns: dict[str, Any] = {"questions": np.bincount(groups, minlength=n)}
    for name, flag in COUNTS.items():
        columns[name] = np.bincount(groups[questions[flag].to_numpy()], minlength=n)
    if "flagged" in questions:
        columns["flagged"] = np.bincount(groups[questions["flagged"].to_numpy()], minlength=n)
    judged, answered = questions["judged"].to_numpy(), questions["answered"].to_numpy()
    for name in ("completeness", "conciseness"):
        values = questions[name].to_numpy()[judged]
        with np.errstate(invalid="ignore", divide="ignore"):
            columns[f"{name}_mean"] = np.bincount(groups[judged], values, n) / columns["n_judged"]
        columns[f"{name}_ci_low"], columns[f"{name}_ci_high"] = ci(groups[judged], values, n)
    ranks = rank_index(questions, k)[answered]
    columns.update(_retrieval(groups[answered], ranks, n, k, ci))
    columns.update(cutoff_columns(groups[answered], ranks, n, k))
    completeness, conciseness = columns["completeness_mean"], columns["conciseness_mean"]
    columns.update(control_means(questions, groups, n, completeness))
    diagnosis = diagnose(completeness, conciseness, columns["hit_rate"], columns["n_judged"])
    low_conciseness = conciseness < LOW_CONCISENESS
    columns["diagnosis"] = measured_diagnosis(columns, diagnosis, low_conciseness)
    return pd.DataFrame(columns)


def _retrieval(groups: IntArray, ranks: IntArray, n: int, k: int, ci: CI) -> dict[str, Any]:
    """Retrieval means (misses included), hit rate and MRR CIs, and the rank distribution."""
    table = score_table(k)
    counts = np.bincount(groups * (k + 1) + ranks, minlength=n * (k + 1)).reshape(n, k + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = counts @ table / counts.sum(axis=1, keepdims=True)
    columns: dict[str, Any] = {}
    for position, name in enumerate(RETRIEVAL):
        columns[name] = means[:, position]
        if name in ("hit_rate", "mrr"):
            bounds = ci(groups, table[ranks, position], n)
            columns[f"{name}_ci_low"], columns[f"{name}_ci_high"] = bounds
    columns["missed"] = counts[:, 0]
    columns.update({f"rank_{rank}": counts[:, rank] for rank in range(1, k + 1)})
    return columns


def diagnose(
    completeness: FloatArray, conciseness: FloatArray, hit_rate: FloatArray, n_judged: IntArray
) -> npt.NDArray[np.str_]:
    """The procedure's reading of each document: one of the keys of DIAGNOSES."""
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
    """The questions with the lowest completeness, then conciseness, then the worst rank."""
    judged, answered = questions["judged"].to_numpy(), questions["answered"].to_numpy()
    completeness = np.where(judged, questions["completeness"].to_numpy(), np.inf)
    candidates = np.flatnonzero(judged | answered)
    if candidates.size > limit:  # only the rows that can make the cut are sorted
        cut = np.partition(completeness[candidates], limit - 1)[limit - 1]
        candidates = candidates[completeness[candidates] <= cut]
    conciseness = np.where(judged, questions["conciseness"].to_numpy(), np.inf)
    rr = np.where(answered, score_table(k)[rank_index(questions, k), 1], np.inf)
    keys = (rr[candidates], conciseness[candidates], completeness[candidates])
    chosen = candidates[np.lexsort(keys)[:limit]]
    columns = ["qa_id", "document", *TEXTS, "answer", "rank", "completeness", "conciseness"]
    worst = questions.iloc[chosen][columns].reset_index(drop=True)
    for name in ("qa_id", "question", "ground_truth_answer", "answer"):
        worst[name] = worst[name].map(unescape_cell).astype(object)
    worst["document"] = worst["document"].astype(str)
    return worst


# -- writing -------------------------------------------------------------------------------------


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Write atomically, with the document names escaped as every ragexam CSV is."""
    escaped = frame.assign(document=frame["document"].map(escape_cell))
    with atomic_file(path) as handle:
        escaped.to_csv(handle, index=False, float_format="%.12g")  # 0.8, not 0.79999999999
