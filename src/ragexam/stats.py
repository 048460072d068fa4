"""The stats stage: join the three CSVs on qa_id and summarise per document and overall."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class StatsOptions:
    """What `ragexam stats` was asked to do."""

    out: Path
    k: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class StatsResult:
    """The summary, computed once: per document, overall, and where it was written."""

    by_document: pd.DataFrame
    overall: pd.DataFrame
    k: int
    paths: dict[str, Path]


def run_stats(options: StatsOptions) -> StatsResult:
    """Write summary_by_document.csv, summary.csv and report.html; no LLM call is made."""
    raise NotImplementedError
