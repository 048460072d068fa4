"""Render the summary: a rich table for the terminal and a self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from ragexam.stats import StatsResult


def terminal_table(result: StatsResult) -> Table:
    """The per-document summary as a rich table."""
    raise NotImplementedError


def write_report(result: StatsResult, path: Path) -> Path:
    """Write report.html: one file that needs no network to view."""
    raise NotImplementedError
