"""Can the grades be trusted? The judge's controls and calibration, for report and terminal."""

from __future__ import annotations

from html import escape

import pandas as pd
from rich import box
from rich.table import Table

from ragexam.analysis.calibrate import reading
from ragexam.analysis.controls import KINDS
from ragexam.analysis.stats import StatsResult
from ragexam.analysis.verdict import Verdict
from ragexam.report.html import _cell, _number, _section, _table

TITLE = "Can this judge be trusted?"
WARNING_STYLE = "border:2px solid #d1242f"
HOW = (
    "Beside the exam, the judge grades four answers whose right grades are known, for sampled "
    "questions, with the same prompt, model, scale and samples. They enter no mean."
)
NO_CONTROLS = (
    "This run has no judge controls, so nothing shows that its grades are right. "
    "`ragexam judge --controls 10` (the default) grades 40 known answers beside the exam."
)
CALIBRATE = "To check the judge against your own grades: `ragexam calibrate --template 40`."
# (column, label in the report, label in the terminal)
FIGURES = (
    ("n", "n", "n"),
    ("spearman", "Spearman rho", "rho [95% CI]"),
    ("pearson", "Pearson r", "r"),
    ("mae", "mean abs. error", "MAE"),
    ("bias", "bias (judge - you)", "bias"),
    ("kappa", "kappa (quadratic)", "kappa"),
)


def judge_panels(result: StatsResult) -> list[str]:
    """The report's sections on the judge: its controls, then its calibration if there is one."""
    panels = [controls_panel(result.controls, result.calibration is None)]
    if result.calibration is not None:
        panels.append(calibration_panel(result.calibration))
    return panels


def controls_panel(verdict: Verdict | None, hint: bool = True) -> str:
    """Passes per control kind and the worst failures; a warning when under 90% passed."""
    after = f'<p class="note">{escape(CALIBRATE)}</p>' if hint else ""
    if verdict is None:
        return _section(TITLE, NO_CONTROLS, after)
    rows = [
        [
            _cell(escape(name), "d"),
            _cell(escape(kind.answer), "text"),
            _cell(escape(kind.bounds.text()), "text"),
            _cell(f"{verdict.passed[name]}/{verdict.graded[name]}"),
        ]
        for name, kind in KINDS.items()
    ]
    content = _table(["control", "the answer", "passes when", "passed"], rows)
    if verdict.failures:
        content += '<h2 style="margin-top:16px">The worst failures</h2>' + _failures(verdict)
    line = escape(verdict.message())
    if verdict.trusted:
        return _section(TITLE, HOW, f"<p><b>{line}</b></p>{content}{after}")
    return (
        f'<section class="warning" style="{WARNING_STYLE}"><h2>{escape(TITLE)}</h2>'
        f'<p style="color:#d1242f"><b>{line}</b></p><p class="note">{escape(HOW)}</p>'
        f"{content}{after}</section>"
    )


def _failures(verdict: Verdict) -> str:
    """The failed controls furthest outside their bounds, with their texts and grades."""
    rows = [
        [
            _cell(escape(failure.control), "d"),
            *(
                _cell(escape(text), "text")
                for text in (failure.question, failure.ground_truth, failure.answer)
            ),
            _cell(_number(failure.completeness)),
            _cell(_number(failure.conciseness)),
            _cell(escape(failure.why), "text"),
        ]
        for failure in verdict.failures
    ]
    headers = ["control", "question", "ground truth", "answer graded"]
    return _table([*headers, "completeness", "conciseness", "broke"], rows)


def calibration_panel(table: pd.DataFrame) -> str:
    """calibration.csv: the judge against a person, with the one-line reading."""
    rows = []
    for record in table.to_dict("records"):
        cells = [_cell(escape(str(record["metric"])), "d"), _cell(str(record["n"]))]
        low, high = record["spearman_ci_low"], record["spearman_ci_high"]
        ci = "" if pd.isna(low) else f"<small>95% CI {low:.2f} to {high:.2f}</small>"
        cells.append(_cell(_number(record["spearman"]) + ci))
        cells += [_cell(_number(record[name])) for name, *_ in FIGURES[2:]]
        rows.append(cells)
    content = _table(["metric", *(label for _, label, _ in FIGURES)], rows)
    note = f"{reading(table)}. Figures from calibration.csv (ragexam calibrate)."
    return _section("Does the judge agree with a person?", note[0].upper() + note[1:], content)


def calibration_table(table: pd.DataFrame) -> Table:
    """calibration.csv as a compact rich table."""
    shown = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="The judge against your labels")
    shown.add_column("metric", no_wrap=True)
    for *_, label in FIGURES:
        shown.add_column(label, justify="right", no_wrap=True)
    for record in table.to_dict("records"):
        rho = _number(record["spearman"])
        if not pd.isna(record["spearman_ci_low"]):
            rho += f" [{record['spearman_ci_low']:.2f}, {record['spearman_ci_high']:.2f}]"
        figures = [_number(record[name]) for name, *_ in FIGURES[2:]]
        shown.add_row(str(record["metric"]), str(record["n"]), rho, *figures)
    return shown
