"""Compare two runs on their shared qa_ids: differences, paired CIs, randomisation p-values."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ragexam.analysis import keypointcompare
from ragexam.analysis.grouped import grouped_compare
from ragexam.analysis.kinds import retrieved
from ragexam.analysis.questions import load_questions, resolve_k
from ragexam.analysis.ranking import question_states
from ragexam.analysis.resampling import compare_paired
from ragexam.errors import InputFileError
from ragexam.io.atomic import atomic_file
from ragexam.io.cells import KINDS, SINGLE
from ragexam.io.csvfile import escape_cell, read_columns
from ragexam.io.manifest import read_manifest
from ragexam.io.runfolder import RunFolder

# metric -> its column in a ranking state table, or None for a judge score
METRICS = {"completeness": None, "conciseness": None, "hit": 0, "rr": 1, "ndcg": 3}
# What must match for the scores of two runs to be comparable: (stage, manifest field).
CHECKED = [("generate", "model"), ("generate", "prompt"), ("generate", "collection")]
CHECKED += [("judge", "model"), ("judge", "prompt")]
COLUMNS = ["document", "kind", "metric", "mean_a", "mean_b", "diff", "ci_low", "ci_high"]
COLUMNS += ["p_value"]
COLUMNS += ["improved", "worse", "same", "n"]
TERMINAL_DOCUMENTS = 20
SIGNIFICANT = 0.05


@dataclass(frozen=True)
class CompareResult:
    """Per metric and per document: the comparison table, warnings, and the CSV written; and,
    when both runs were graded by key points, the key points gained or lost."""

    table: pd.DataFrame
    warnings: list[str]
    path: Path
    changes: pd.DataFrame | None = None
    changes_path: Path | None = None
    different: int = 0  # paired questions whose question or ground truth differ: other exams


def run_compare(run_a: Path, run_b: Path, out: Path, seed: int = 0) -> CompareResult:
    """Pair the runs on qa_id and write comparison.csv into `out`."""
    for run in (run_a, run_b):
        if not run.is_dir():
            what = "is a file" if run.exists() else "does not exist"
            raise InputFileError(run, f"{what}, not a run folder; compare two run folders")
    scores_a, scores_b = _scores(run_a), _scores(run_b)
    paired = scores_a.merge(scores_b, on="qa_id", suffixes=("_a", "_b"))
    if paired.empty:
        raise InputFileError(
            RunFolder(run_b).exam(),
            f"shares no qa_id with {RunFolder(run_a).exam()}; compare runs of one exam",
        )
    warnings = manifest_warnings(run_a, run_b)
    different = differing_questions(run_a, run_b, set(paired["qa_id"]))
    if different:
        warnings.append(
            f"{different} of {len(paired)} paired questions differ in their question or ground "
            "truth: the runs sat different exams, so their scores do not pair; sit one exam "
            f"with `ragexam run --qa-dataset {RunFolder(run_a).exam()}`"
        )
    left_out = len(scores_a) + len(scores_b) - 2 * len(paired)
    if left_out:
        warnings.append(f"questions in only one of the runs are left out: {left_out}")
    warnings += _one_sided(paired)
    table = _rows(paired, seed)
    documents = pd.Series(paired["document_a"].to_numpy(), index=paired["qa_id"].to_numpy())
    points, differing = keypointcompare.pair(run_a, run_b, documents)
    if differing:
        warnings.append(f"key points whose text differs between the runs are left out: {differing}")
    out.mkdir(parents=True, exist_ok=True)
    path, changes, changes_path = out / "comparison.csv", None, None
    if not points.empty:
        table = pd.concat([table, keypointcompare.rows(points, seed)], ignore_index=True)[COLUMNS]
        changes, changes_path = keypointcompare.changes(points), out / "key_point_changes.csv"
        _write(changes, changes_path)
    _write(table, path)
    return CompareResult(table, warnings, path, changes, changes_path, different)


def _write(frame: pd.DataFrame, path: Path) -> None:
    with atomic_file(path) as handle:
        frame.assign(document=frame["document"].map(escape_cell)).to_csv(handle, index=False)


def differing_questions(run_a: Path, run_b: Path, paired: set[str]) -> int:
    """How many of the paired qa_ids ask another question, or expect another answer, in B."""
    columns = ("qa_id", "question", "ground_truth_answer")
    exams = [read_columns(RunFolder(run).exam(), columns) for run in (run_a, run_b)]
    texts = [
        {
            qa_id: (question, truth)
            for qa_id, question, truth in zip(
                exam["qa_id"], exam["question"], exam["ground_truth_answer"], strict=True
            )
        }
        for exam in exams
    ]
    return sum(texts[0].get(qa_id) != texts[1].get(qa_id) for qa_id in paired)


def _scores(run: Path) -> pd.DataFrame:
    """One row per question: document, and each metric where it has a value (else NaN)."""
    questions = load_questions(run)
    states = question_states(questions, resolve_k(run, None))
    table = states.table()[states.index]
    scores = questions[["qa_id", "document", "kind"]].astype({"document": str, "kind": str})
    judged, scored = questions["judged"].to_numpy(), retrieved(questions)
    for metric, column in METRICS.items():
        values = questions[metric].to_numpy() if column is None else table[:, column]
        scores[metric] = np.where(judged if column is None else scored, values, np.nan)
    return scores


def _one_sided(paired: pd.DataFrame) -> list[str]:
    """The paired questions a metric leaves out because only one run has its value (graded or
    answered in one, an error or pending in the other): a regression among them is unseen."""
    said = []
    for metrics, what in (
        (("completeness", "conciseness"), "graded"),
        (("hit", "rr", "ndcg"), "answered"),
    ):
        a, b = (paired[f"{metrics[0]}_{run}"].notna().to_numpy() for run in "ab")
        only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
        if only_a or only_b:
            said.append(
                f"{', '.join(metrics)} are compared on {int((a & b).sum())} of {len(paired)} "
                f"paired questions: {only_a} {what} in A alone and {only_b} in B alone (error "
                "rows or pending) are left out, and a change among them is not seen"
            )
    return said


def _rows(paired: pd.DataFrame, seed: int) -> pd.DataFrame:
    """compare_paired for every metric over all questions (ALL), over each kind of question
    when the exam has several (ALL, kind), and per document of run A (kind `all`).

    The documents are compared all at once (grouped.grouped_compare), not one by one.
    """
    codes, documents = pd.factorize(paired["document_a"], sort=True)
    kinds = [kind for kind in KINDS if (paired["kind_a"] == kind).any()]
    overall, by_document = [], []
    for kind in ["all", *(kinds if kinds != [SINGLE] else [])]:
        mine = (paired["kind_a"] == kind).to_numpy() if kind != "all" else True
        for metric in METRICS:
            a, b = paired[f"{metric}_a"].to_numpy(), paired[f"{metric}_b"].to_numpy()
            both = ~np.isnan(a) & ~np.isnan(b) & mine  # ok in both runs
            if kind == "all":
                figures = grouped_compare(codes[both], a[both], b[both], len(documents), seed=seed)
                named = {"document": documents.astype(str), "kind": kind, "metric": metric}
                by_document.append(pd.DataFrame(named | figures))
            elif not both.any():
                continue  # an unanswerable question has no retrieval metric to compare
            comparison = compare_paired(a[both], b[both], seed=seed)
            overall.append(
                {"document": "ALL", "kind": kind, "metric": metric, **asdict(comparison)}
            )
    ordered = pd.concat(by_document).sort_index(kind="stable")  # each document's metrics together
    return pd.concat([pd.DataFrame(overall), ordered], ignore_index=True)[COLUMNS]


def _field(manifest: dict[str, Any], stage: str, name: str) -> Any:
    stages = manifest.get("stages")
    record = stages.get(stage) if isinstance(stages, dict) else None
    return record.get(name) if isinstance(record, dict) else None


def manifest_warnings(run_a: Path, run_b: Path) -> list[str]:
    """What differs between the runs' manifests in what the scores depend on."""
    manifests = {run_a: read_manifest(run_a), run_b: read_manifest(run_b)}
    lacking = [str(run) for run, manifest in manifests.items() if not manifest]
    if lacking:
        return [f"no manifest.json in {' and '.join(lacking)}: models and prompts are unchecked"]
    warnings = []
    first, second = manifests[run_a], manifests[run_b]
    for stage, name in CHECKED:
        old, new = _field(first, stage, name), _field(second, stage, name)
        if old is not None and new is not None and old != new:
            what = "prompt hash" if name == "prompt" else name
            warnings.append(f"the runs differ in {stage} {what}: {old!r} (A) and {new!r} (B)")
    k_a, k_b = (_field(manifest, "answer", "k") for manifest in (first, second))
    if k_a is not None and k_b is not None and k_a != k_b:  # unrecorded: not known to differ
        warnings.append(f"the runs retrieved different k: {k_a} (A) and {k_b} (B)")
    return warnings
