"""The exam's kinds of question apart, and together in the ALL row: the report's table."""

from __future__ import annotations

from html import escape

import pandas as pd

from ragexam.report import page

# (column of summary_by_kind.csv, header)
FIGURES = (
    ("completeness_mean", "completeness"),
    ("conciseness_mean", "conciseness"),
    ("hit_rate", "hit rate"),
    ("mrr", "MRR"),
    ("recall", "recall"),
    ("all_found", "all found"),
    ("declined", "declined"),
    ("made_up", "made facts up"),
)
WITH_CI = {"completeness_mean": "completeness", "conciseness_mean": "conciseness"}
WITH_CI |= {"hit_rate": "hit_rate", "mrr": "mrr"}
NOTE = (
    "A multi-hop question needs two chunks: recall is the share of its chunks retrieved, and "
    "all found the share of questions whose every chunk was. An unanswerable question has no "
    "chunk that answers it: it is out of the retrieval means, and its answer should decline. "
    "Declined and made facts up are shares of its graded answers: one that declines, and one "
    "with a statement the judge found unsupported or contradicted. ALL covers every question."
)


def section(by_kind: pd.DataFrame) -> str:
    """The table of summary_by_kind.csv, or nothing when every question is single."""
    if by_kind.empty:
        return ""
    headers = ["kind", "questions", "errors", *(header for _, header in FIGURES)]
    rows = []
    for _, row in by_kind.iterrows():
        cells = [page.cell(f"<b>{escape(str(row['kind']))}</b>", "doc")]
        cells += [page.cell(f"{int(row[name]):,}") for name in ("questions", "errors")]
        cells += [_figure(row, name) for name, _ in FIGURES]
        rows.append(cells)
    return page.section("Questions by kind", NOTE, page.table(headers, rows))


def _figure(row: pd.Series, name: str) -> str:
    """A mean with its 95% interval below it, when it has one."""
    interval = page.ci(row, WITH_CI[name]) if name in WITH_CI else ""
    return page.cell(
        page.number(row.get(name)) + (f"<small>{interval}</small>" if interval else "")
    )
