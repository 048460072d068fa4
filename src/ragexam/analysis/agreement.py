"""How often a judge's samples agree on each key point: percent agreement and Fleiss' kappa.

With `--samples N`, each key point is rated N times (present, partial, absent). For one key
point i with n_i ratings, n_ij of them in category j, the share of agreeing pairs of ratings
is P_i = (sum_j n_ij^2 - n_i) / (n_i (n_i - 1)). Percent agreement is the mean of P_i over the
key points; Fleiss' kappa (Fleiss 1971, "Measuring nominal scale agreement among many raters")
corrects it for chance:

    p_j = sum_i n_ij / sum_i n_i        P_e = sum_j p_j^2        kappa = (P - P_e) / (1 - P_e)

Key points with fewer than two valid ratings are left out. Kappa is undefined (None, NaN in a
table) when every rating falls in one category (P_e = 1). Samples whose call failed leave their
key points with fewer ratings; the formulas above take each key point's own n_i.

kappa_interval gives the overall kappa a 95% percentile bootstrap interval, resampling key
points with a seed (they come in questions, so it is somewhat narrow).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Agreement:
    """Key points rated at least twice, the share of agreeing pairs, and Fleiss' kappa."""

    items: int
    percent: float | None
    kappa: float | None


def pair_agreement(counts: IntArray) -> FloatArray:
    """P_i for each row of counts (key points by categories); NaN for fewer than 2 ratings."""
    counts = np.asarray(counts, dtype=np.float64)
    raters = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = ((counts**2).sum(axis=1) - raters) / (raters * (raters - 1))
    return np.where(raters >= 2, shares, np.nan)


def fleiss_kappa(counts: IntArray) -> Agreement:
    """Percent agreement and Fleiss' kappa of key points by categories (rows: key points)."""
    counts = np.asarray(counts, dtype=np.int64).reshape(-1, np.shape(counts)[-1])
    percent, kappa = grouped_agreement(np.zeros(len(counts), np.int64), counts, 1)
    items = int((counts.sum(axis=1) >= 2).sum())
    return Agreement(items, _value(percent[0]), _value(kappa[0]))


def grouped_agreement(groups: IntArray, counts: IntArray, n: int) -> tuple[FloatArray, FloatArray]:
    """Percent agreement and Fleiss' kappa per group of key points (NaN where undefined)."""
    counts = np.asarray(counts, dtype=np.int64)
    rated = counts.sum(axis=1) >= 2
    groups, counts = groups[rated], counts[rated].astype(np.float64)
    items = np.bincount(groups, minlength=n).astype(np.float64)
    agree = np.bincount(groups, pair_agreement(counts), n)
    by_category = np.stack(
        [np.bincount(groups, counts[:, j], n) for j in range(counts.shape[1])], axis=1
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        percent = agree / items
        shares = by_category / by_category.sum(axis=1, keepdims=True)
        chance = (shares**2).sum(axis=1)
        kappa = np.where(chance < 1 - 1e-12, (percent - chance) / (1 - chance), np.nan)
    return percent, kappa


def kappa_interval(counts: IntArray, seed: int = 0, resamples: int = 1000) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of Fleiss' kappa over key points, seeded; NaN
    when kappa is undefined in too many resamples (every verdict alike)."""
    counts = np.asarray(counts, dtype=np.float64)
    counts = counts[counts.sum(axis=1) >= 2]
    if not len(counts):
        return np.nan, np.nan
    agree, rng = pair_agreement(counts), np.random.default_rng(seed)
    kappas = np.empty(resamples)
    for index in range(resamples):  # one resample at a time: memory stays O(key points)
        drawn = rng.integers(0, len(counts), len(counts))
        shares = counts[drawn].sum(axis=0) / counts[drawn].sum()
        chance = float((shares**2).sum())
        percent = float(agree[drawn].mean())
        kappas[index] = (percent - chance) / (1 - chance) if chance < 1 - 1e-12 else np.nan
    if np.isnan(kappas).mean() > 0.025:
        return np.nan, np.nan
    low, high = np.nanpercentile(kappas, [2.5, 97.5])
    return float(low), float(high)


def _value(number: float) -> float | None:
    return None if np.isnan(number) else float(number)
