"""`ragexam calibrate`: how closely the judge's grades follow a person's on the same answers.

The figures are those of the design: Spearman's rho (scipy) with a seeded percentile bootstrap
95% CI, Pearson's r (scipy), mean absolute error, bias (judge minus person), and Cohen's kappa
with quadratic weights on five equal bins of [0, 1] (scipy has no kappa; it is a few lines here).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from ragexam.analysis.keypoints import exam_key_points, graded_by_key_points
from ragexam.analysis.labels import METRICS, read_labels
from ragexam.analysis.questions import load_questions
from ragexam.analysis.resampling import RESAMPLES
from ragexam.analysis.staleness import stale_answers, stale_grades
from ragexam.config import Scale
from ragexam.errors import InputFileError
from ragexam.io.atomic import atomic_file
from ragexam.io.csvfile import read_rows, unescape_cell
from ragexam.io.runfolder import RunFolder

FloatArray = npt.NDArray[np.float64]
CALIBRATION_FILE = "calibration.csv"
COLUMNS = (
    "metric",
    "n",
    "spearman",
    "spearman_ci_low",
    "spearman_ci_high",
    "pearson",
    "mae",
    "bias",
    "kappa",
)
MIN_LABELS = 5  # below this a rank correlation means little
BINS = 5
NOTABLE_BIAS = 0.1  # the reading mentions a bias at least this large
STRENGTH = ((0.7, "agrees well with you"), (0.4, "agrees only moderately with you"))


@dataclass(frozen=True)
class Agreement:
    """The calibration figures of one metric: one row of calibration.csv."""

    metric: str
    n: int
    spearman: float
    spearman_ci_low: float
    spearman_ci_high: float
    pearson: float
    mae: float
    bias: float
    kappa: float


def agreement(metric: str, judge: FloatArray, person: FloatArray, seed: int = 0) -> Agreement:
    """Every figure for one metric; NaN where too few or constant grades leave it undefined."""
    n = len(judge)
    low, high = spearman_ci(judge, person, seed)
    return Agreement(
        metric,
        n,
        correlation(judge, person, "spearman"),
        low,
        high,
        correlation(judge, person, "pearson"),
        float(np.mean(np.abs(judge - person))) if n else math.nan,
        float(np.mean(judge - person)) if n else math.nan,
        quadratic_kappa(judge, person),
    )


def correlation(judge: FloatArray, person: FloatArray, kind: str) -> float:
    """scipy's Spearman rho or Pearson r; NaN below two pairs or for constant grades."""
    from scipy import stats  # loaded only here: `ragexam stats` never needs it

    if len(judge) < 2 or np.ptp(judge) == 0 or np.ptp(person) == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # n = 2 warns that the figure is uninformative
        if kind == "spearman":
            return float(stats.spearmanr(judge, person).statistic)
        return float(stats.pearsonr(judge, person).statistic)


def spearman_ci(
    judge: FloatArray, person: FloatArray, seed: int = 0, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """Percentile bootstrap 95% CI of rho over resampled pairs; constant resamples are dropped."""
    from scipy.stats import rankdata

    n = len(judge)
    if n < 2:
        return math.nan, math.nan
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    x, y = rankdata(judge[picks], axis=1), rankdata(person[picks], axis=1)
    x -= x.mean(axis=1, keepdims=True)
    y -= y.mean(axis=1, keepdims=True)
    spread = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    defined = spread > 0
    rho = np.clip((x * y).sum(axis=1)[defined] / spread[defined], -1.0, 1.0)
    if rho.size == 0:
        return math.nan, math.nan
    low, high = np.percentile(rho, [2.5, 97.5])
    return float(low), float(high)


def bins(values: FloatArray) -> npt.NDArray[np.int64]:
    """Five equal bins of [0, 1]: [0, 0.2) is 0, ..., [0.8, 1] is 4 (the top edge is in 4)."""
    return np.minimum(np.floor(values * BINS + 1e-9), BINS - 1).astype(np.int64)


def quadratic_kappa(judge: FloatArray, person: FloatArray) -> float:
    """Cohen's kappa, quadratic weights (i - j)^2, on five bins; NaN when chance explains all."""
    if len(judge) == 0:
        return math.nan
    cells = bins(judge) * BINS + bins(person)
    observed = np.bincount(cells, minlength=BINS * BINS).reshape(BINS, BINS).astype(float)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / len(judge)
    weights = np.subtract.outer(np.arange(BINS), np.arange(BINS)) ** 2
    chance = float((weights * expected).sum())
    return math.nan if chance == 0 else 1 - float((weights * observed).sum()) / chance


# -- the command ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` found: the figures, where they went, warnings, and the reading."""

    table: pd.DataFrame
    path: Path
    notes: list[str]
    reading: str


def run_calibrate(labels: Path, out: Path, scale: Scale, seed: int = 0) -> Calibration:
    """Join a person's labels with judgments.csv on qa_id and write calibration.csv."""
    required = ("qa_id", "status", *METRICS)
    judgments = RunFolder(out).judgments
    judged = {row["qa_id"]: row for row in read_rows(judgments, required)}
    stale = stale_ids(out)
    for qa_id in stale & judged.keys():  # graded from inputs that changed since: no grade
        judged[qa_id] = {**judged[qa_id], "status": "stale"}
    pairs, notes = read_labels(labels, scale, judged, judgments)
    for metric, (judge, _) in pairs.items():
        if len(judge) < MIN_LABELS:
            notes.append(
                f"{labels}: only {len(judge)} row{' has' if len(judge) == 1 else 's have'} a "
                f"{metric} label; a rank correlation "
                f"means little below {MIN_LABELS}, so label more rows"
            )
    figures = [agreement(metric, *pairs[metric], seed) for metric in pairs]
    table = pd.DataFrame([vars(figure) for figure in figures], columns=list(COLUMNS))
    path = out / CALIBRATION_FILE
    with atomic_file(path) as handle:
        table.to_csv(handle, index=False, float_format="%.12g")
    table = pd.read_csv(path)  # the figures as written, so terminal and report read the same
    return Calibration(table, path, notes, reading(table))


def stale_ids(out: Path) -> set[str]:
    """The qa_ids whose grade was made from a question, answer or key points changed since
    (stats counts them pending): a person's label of the answer now is not of that grade."""
    folder = RunFolder(out)
    try:
        questions = load_questions(out, texts=True)
    except InputFileError:  # an exam that cannot be read: its grades are taken as they are
        return set()
    points = exam_key_points(folder) if graded_by_key_points(folder) else {}
    stale = stale_grades(folder, questions, points) | stale_answers(folder, questions)
    return {unescape_cell(str(qa_id)) for qa_id in questions["qa_id"][stale]}


def read_calibration(out: Path) -> pd.DataFrame | None:
    """OUT/calibration.csv, for the report; None when there is none."""
    path = out / CALIBRATION_FILE
    if not path.exists():
        return None
    table = pd.read_csv(path)
    missing = [name for name in COLUMNS if name not in table.columns]
    if missing:
        raise InputFileError(path, f"lacks the column(s) {', '.join(missing)}; rerun calibrate")
    return table


def reading(table: pd.DataFrame) -> str:
    """One line: how well the judge ranks like the person, and any notable bias."""
    groups: dict[str, list[str]] = {}
    biases = []
    for record in table.to_dict("records"):
        metric, n = str(record["metric"]), int(record["n"])
        rho, low, high, bias = (
            float(record[name])
            for name in ("spearman", "spearman_ci_low", "spearman_ci_high", "bias")
        )
        word, detail = _strength(rho), f"n {n}"
        if not math.isnan(rho):
            ci = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
            detail = f"rho {rho:.2f}{ci}, {detail}"
        groups.setdefault(word, []).append(f"{metric} ({detail})")
        if abs(bias) >= NOTABLE_BIAS:
            side = "higher" if bias > 0 else "lower"
            biases.append(f"{metric} {abs(bias):.2f} {side}")
    said = " and ".join(f"{word} on {' and '.join(items)}" for word, items in groups.items())
    if not biases:
        return f"the judge {said}"
    joint = " but " if set(groups) == {STRENGTH[0][1]} else ", and "
    return f"the judge {said}{joint}grades {' and '.join(biases)} than you do"


def _strength(rho: float) -> str:
    if math.isnan(rho):
        return "cannot be ranked against you (too few or constant grades)"
    if rho < 0:
        return "disagrees with you"
    return next((text for floor, text in STRENGTH if rho >= floor), "barely agrees with you")
