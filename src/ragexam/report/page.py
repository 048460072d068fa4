"""The report's shared pieces: numbers, intervals, cells, tables, sections, chips.

Every text that reaches these is escaped by the caller or here; cells are HTML already.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from html import escape
from typing import Any

import pandas as pd

from ragexam.report.charts import diagnosis_colour

# (CI column prefix, mean column, label)
MEANS = [
    ("completeness", "completeness_mean", "completeness"),
    ("conciseness", "conciseness_mean", "conciseness"),
    ("hit_rate", "hit_rate", "hit rate"),
    ("mrr", "mrr", "MRR"),
]
DASH = "\u2013"  # between the bounds of an interval
TOOLTIP = re.compile(r"<title>.*?</title>", re.DOTALL)


def number(value: Any) -> str:
    """A figure to two decimals, or a dash when there is none."""
    return "-" if pd.isna(value) else f"{float(value):.2f}"


def ci(row: pd.Series, name: str) -> str:
    """The 95% interval of a figure, low to high; empty when there is none."""
    low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    digits = 3 if 0 < high - low < 0.02 else 2  # a narrow interval still shows its width
    return "" if pd.isna(low) else f"{low:.{digits}f}{DASH}{high:.{digits}f}"


def table(headers: list[str], rows: Iterable[list[str]]) -> str:
    """A table; cells are HTML already: the callers escape every text. Each cell carries its
    header (`data-label`), which a phone shows beside it when the rows stack."""
    head = "".join(f"<th>{escape(header)}</th>" for header in headers)
    labels = [f'<td data-label="{escape(header)}"' for header in headers]
    body = "".join(
        "<tr>"
        + "".join(
            cell.replace("<td", labels[i], 1) if i < len(labels) else cell
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def responsive(wide: str, narrow: str) -> str:
    """A chart drawn twice: for a screen, and narrower for a phone (CSS shows one). The
    phone's has no tooltips: nothing hovers there, and each figure stays once in the page."""
    narrow = TOOLTIP.sub("", narrow)
    return f'<div class="wide">{wide}</div><div class="narrow">{narrow}</div>'


def cell(html: str, kind: str = "n") -> str:
    """One table cell of HTML; `kind` is its CSS class."""
    return f'<td class="{kind}">{html}</td>'


def section(title: str, note: str, content: str, anchor: str = "") -> str:
    """A titled section with an optional note under its title, and an id to link it by."""
    note_html = f'<p class="note">{escape(note)}</p>' if note else ""
    named = f' id="{escape(anchor)}"' if anchor else ""
    return f"<section{named}><h2>{escape(title)}</h2>{note_html}{content}</section>"


def chip(diagnosis: str) -> str:
    """A diagnosis as a coloured pill."""
    background = diagnosis_colour(diagnosis)
    return f'<span class="chip" style="background:{background}">{escape(diagnosis)}</span>'
