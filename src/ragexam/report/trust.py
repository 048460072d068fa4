"""Can the grades be trusted? The judge's controls and calibration, for report and terminal."""

from __future__ import annotations

from html import escape

import pandas as pd

from ragexam.analysis.calibrate import reading
from ragexam.analysis.controls import KINDS
from ragexam.analysis.summary import StatsResult
from ragexam.analysis.verdict import Verdict
from ragexam.report import page

TITLE = "Can this judge be trusted?"
WARNING_STYLE = "border:2px solid #d1242f"
HOW = (
    "Beside the exam, the judge grades, for sampled questions, four answers whose right grades "
    "are known and four wrong answers that ask for a high grade (injections), with the same "
    "prompt, model, scale and samples. They enter no mean. A judge is not to be trusted when "
    "fewer than 90% of the known answers pass, or more than 10% of the injections fool it."
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
        return page.section(TITLE, NO_CONTROLS, after)
    rows = [
        [
            page.cell(escape(name), "d"),
            page.cell(escape(kind.answer), "text"),
            page.cell(escape(kind.bounds.text()), "text"),
            page.cell(f"{verdict.passed[name]}/{verdict.graded[name]}{_errored(verdict, name)}"),
        ]
        for name, kind in KINDS.items()
    ]
    content = _rates(verdict) + page.table(["control", "the answer", "passes when", "passed"], rows)
    if verdict.failures:
        content += '<h2 style="margin-top:16px">The worst failures</h2>' + _failures(verdict)
    line = escape(verdict.message())
    if verdict.trusted:  # one line; the controls behind it on a click
        return (
            f'<section><details class="judge"><summary><b>{escape(TITLE)}</b> Yes: '
            f"{escape(verdict.short())}"
            f'</summary><p class="note">{escape(HOW)}</p>{content}{after}</details></section>'
        )
    return (
        f'<section class="warning" style="{WARNING_STYLE}"><h2>{escape(TITLE)}</h2>'
        f'<p style="color:#d1242f"><b>{line}</b></p><p class="note">{escape(HOW)}</p>'
        f"{content}{after}</section>"
    )


def _errored(verdict: Verdict, kind: str) -> str:
    """ ", 10 errors" after a kind's passes, when some of its controls ended in error."""
    errored = verdict.errored.get(kind, 0)
    return f", {errored} error{'s' if errored != 1 else ''}" if errored else ""


def _rates(verdict: Verdict) -> str:
    """The known-answer pass rate beside the attack success rate, large."""
    (passed, graded), rate = verdict.known, verdict.attack_success_rate
    cards = [
        (f"{passed / graded:.0%}" if graded else "-", "known-answer pass rate"),
        ("-" if rate is None else f"{rate:.0%}", "attack success rate (injections)"),
    ]
    html = "".join(
        f'<div class="card"><b>{value}</b><span>{escape(label)}</span></div>'
        for value, label in cards
    )
    return f'<div class="cards" style="grid-template-columns:1fr 1fr;margin:0 0 14px">{html}</div>'


def _failures(verdict: Verdict) -> str:
    """The failed controls furthest outside their bounds, with their texts and grades."""
    rows = [
        [
            page.cell(escape(failure.control), "d"),
            *(
                page.cell(escape(text), "text")
                for text in (failure.question, failure.ground_truth, failure.answer)
            ),
            page.cell(page.number(failure.completeness)),
            page.cell(page.number(failure.conciseness)),
            page.cell(escape(failure.why), "text"),
        ]
        for failure in verdict.failures
    ]
    headers = ["control", "question", "ground truth", "answer graded"]
    return page.table([*headers, "completeness", "conciseness", "broke"], rows)


def calibration_panel(table: pd.DataFrame) -> str:
    """calibration.csv: the judge against a person, with the one-line reading."""
    rows = []
    for record in table.to_dict("records"):
        cells = [page.cell(escape(str(record["metric"])), "d"), page.cell(str(record["n"]))]
        low, high = record["spearman_ci_low"], record["spearman_ci_high"]
        ci = "" if pd.isna(low) else f"<small>95% CI {low:.2f} to {high:.2f}</small>"
        cells.append(page.cell(page.number(record["spearman"]) + ci))
        cells += [page.cell(page.number(record[name])) for name, *_ in FIGURES[2:]]
        rows.append(cells)
    content = page.table(["metric", *(label for _, label, _ in FIGURES)], rows)
    note = f"{reading(table)}. Figures from calibration.csv (ragexam calibrate)."
    return page.section("Does the judge agree with a person?", note[0].upper() + note[1:], content)
