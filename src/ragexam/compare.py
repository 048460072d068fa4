"""Compare two runs on their shared qa_ids: differences, paired CIs, randomisation p-values."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.table import Table


@dataclass(frozen=True)
class CompareResult:
    """Per metric and per document: the comparison table, warnings, and the CSV written."""

    table: pd.DataFrame
    warnings: list[str]
    path: Path


def run_compare(run_a: Path, run_b: Path, out: Path, seed: int = 0) -> CompareResult:
    """Pair the runs on qa_id and write comparison.csv into `out`."""
    raise NotImplementedError


def comparison_table(result: CompareResult) -> Table:
    """The comparison as a rich table."""
    raise NotImplementedError
