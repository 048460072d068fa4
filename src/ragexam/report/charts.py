"""Inline SVG charts for the report: per-document bars, the rank histogram, the scatter.

Drawn in Python as plain SVG, so the report needs no script and no network to view.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from html import escape

import pandas as pd

from ragexam.analysis.summary import LOW_COMPLETENESS, LOW_CONCISENESS
from ragexam.report.headline import too_few

SCATTER_DOCUMENTS = 2000  # the largest documents; more dots would only hide each other
# diagnosis -> (colour in the report, colour in the terminal)
COLOURS = {
    "retrieval": ("#d1495b", "red"),
    "generation": ("#e69f00", "yellow"),
    "too much context": ("#7e57c2", "magenta"),
    "ok": ("#2e9e6b", "green"),
    "not judged": ("#9aa0a6", "dim"),
    "prior_knowledge": ("#3b6fb6", "blue"),
}


def diagnosis_colour(diagnosis: str, terminal: bool = False) -> str:
    """The colour of a diagnosis, for the report or for the terminal."""
    return COLOURS.get(diagnosis, ("#57606a", ""))[terminal]


def svg(width: float, height: float, parts: Iterable[str], label: str) -> str:
    return (
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(label)}">{"".join(parts)}</svg>'
    )


def svg_text(x: float, y: float, text: str, attributes: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" {attributes}>{escape(text)}</text>'


def bars(documents: pd.DataFrame, narrow: bool = False) -> str:
    """Per document: completeness and conciseness bars with CI whiskers, and the diagnosis.

    Narrow (a phone): each document's name on a line of its own, above its bars.
    """
    left, scale, height, label = (8, 220, 66, 36) if narrow else (330, 560, 34, 44)
    first = 40 if narrow else 24
    parts = [_axis(left, scale, first - 4 + height * len(documents))]
    for number, (_, row) in enumerate(documents.iterrows()):
        top, name, diagnosis = first + number * height, str(row["document"]), str(row["diagnosis"])
        short = name if len(name) <= label else "…" + name[-(label - 1) :]
        if narrow:
            parts.append(svg_text(0, top + 10, short))
            top += 14
        else:
            parts.append(svg_text(left - 10, top + 15, short, 'text-anchor="end"'))
        parts.append(_bar(row, "completeness", left, scale, top + 2, "#3b6fb6"))
        parts.append(_bar(row, "conciseness", left, scale, top + 15, "#7fb3d5"))
        x = left + scale + (14 if narrow else 30)
        parts.append(
            f'<circle cx="{x}" cy="{top + 13}" r="6" fill="{diagnosis_colour(diagnosis)}"/>'
        )
        parts.append(svg_text(x + 10, top + 17, diagnosis))
        if too_few(int(row["questions"])):
            few = f"{int(row['questions'])} questions: too few to read"
            parts.append(
                svg_text(
                    x + 10 if not narrow else 0,
                    top + 40 if narrow else top + 30,
                    few,
                    'fill="#9a6700"',
                )
            )
    for x, colour, name in (
        (left, "#3b6fb6", "completeness"),
        (left + 120, "#7fb3d5", "conciseness"),
    ):
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{colour}"/>')
        parts.append(svg_text(x + 14, 13, name))
    width = left + scale + (130 if narrow else 260)
    return svg(width, first + 24 + height * len(documents), parts, "bars per document")


def _axis(left: int, scale: int, bottom: int) -> str:
    """Grid lines at 0, 0.2, ... 1 and a dashed line at the low-completeness threshold."""
    lines = []
    for tick in (0, 0.2, 0.4, 0.6, 0.8, 1.0):
        x = left + scale * tick
        lines.append(f'<line x1="{x}" y1="20" x2="{x}" y2="{bottom}" stroke="#eaeef2"/>')
        lines.append(svg_text(x, bottom + 14, f"{tick:.1f}", 'text-anchor="middle"'))
    x = left + scale * LOW_COMPLETENESS
    dashed = 'stroke="#d1495b" stroke-dasharray="4 3"'
    return "".join(lines) + f'<line x1="{x}" y1="20" x2="{x}" y2="{bottom}" {dashed}/>'


def _bar(row: pd.Series, metric: str, left: int, scale: int, y: float, colour: str) -> str:
    """One bar with its CI whisker and a tooltip; a note when nothing is judged."""
    mean, low, high = (row[f"{metric}_{part}"] for part in ("mean", "ci_low", "ci_high"))
    if pd.isna(mean):  # one note for the pair of bars
        note = "no graded question" if metric == "completeness" else ""
        return svg_text(left + 4, y + 14, note, 'fill="#57606a"')
    tip = f"{metric} {mean:.3f}, 95% CI {low:.3f} to {high:.3f}"
    low, high = left + low * scale, left + high * scale
    return (
        f'<rect x="{left}" y="{y}" width="{mean * scale:.1f}" height="11" fill="{colour}" rx="2">'
        f"<title>{escape(tip)}</title></rect>"
        f'<path d="M{low:.1f} {y + 5.5}H{high:.1f}M{low:.1f} {y + 1}v9M{high:.1f} {y + 1}v9" '
        'stroke="#1f2328" stroke-width="1.3" fill="none"/>'
    )


def histogram(overall: pd.Series, width: int = 460) -> str:
    """Answered questions per rank 1..k (or as far as the summary counts them: a `stats --k`
    past every retrieved chunk), then the misses: share above, count below."""
    depth = next(rank for rank in itertools.count(1) if f"rank_{rank}" not in overall) - 1
    labels = [*map(str, range(1, depth + 1)), "miss"]
    counts = [int(overall[f"rank_{rank}"]) for rank in range(1, depth + 1)]
    counts.append(int(overall["missed"]))
    total, tallest, bottom = max(sum(counts), 1), max(*counts, 1), 380
    step = (width - 40) / len(counts)
    parts = [f'<line x1="20" y1="{bottom}" x2="{width - 20}" y2="{bottom}" stroke="#8c959f"/>']
    middle = 'text-anchor="middle"'
    for number, (label, count) in enumerate(zip(labels, counts, strict=True)):
        x, tall = 20 + number * step, 330 * count / tallest
        parts.append(
            f'<rect x="{x + step * 0.15:.1f}" y="{bottom - tall:.1f}" width="{step * 0.7:.1f}" '
            f'height="{tall:.1f}" fill="{"#d1495b" if label == "miss" else "#3b6fb6"}" rx="2">'
            f"<title>{label}: {count:,} questions</title></rect>"
        )
        parts.append(svg_text(x + step / 2, bottom - tall - 6, f"{count / total:.0%}", middle))
        parts.append(svg_text(x + step / 2, bottom + 16, label, middle))
        if step >= 60:  # room for the count under the label
            parts.append(
                svg_text(x + step / 2, bottom + 32, f"{count:,}", f'{middle} fill="#8c959f"')
            )
    return svg(width, 420, parts, "rank histogram")


def scatter(documents: pd.DataFrame, size: int = 400) -> str:
    """Documents by mean completeness (x) and conciseness (y) over the diagnosis regions: of
    their answerable questions, which the diagnosis reads, when the exam has unanswerable ones
    (a right decline states nothing, so its conciseness is 0: a dot read over it would sit in
    a region its diagnosis is not)."""
    pad = 40
    parts = [_regions(size, pad)]
    read = ("completeness_answerable", "conciseness_mean")  # conciseness: answerable ones'
    axes = read if read[0] in documents else ("completeness_mean", "conciseness_mean")
    of = " of the answerable questions" if axes == read else ""
    judged = documents.dropna(subset=list(axes))
    judged = judged.nlargest(SCATTER_DOCUMENTS, "questions")
    biggest = max(int(judged["questions"].max()) if len(judged) else 1, 1)
    for row in judged.to_dict("records"):
        completeness, conciseness, questions = (row[name] for name in (*axes, "questions"))
        x, y = pad + completeness * size, pad / 2 + (1 - conciseness) * size
        tip = (
            f"{row['document']}: completeness {completeness:.2f}, conciseness "
            f"{conciseness:.2f}{of}, {questions} questions, {row['diagnosis']}"
        )
        radius, fill = (
            3 + 9 * math.sqrt(questions / biggest),
            diagnosis_colour(str(row["diagnosis"])),
        )
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius:.1f}" fill="{fill}" '
            f'fill-opacity="0.75" stroke="#fff"><title>{escape(tip)}</title></circle>'
        )
    middle = 'text-anchor="middle"'
    parts.append(svg_text(pad + size / 2, size + pad / 2 + 32, "completeness", middle))
    mid = pad / 2 + size / 2
    parts.append(svg_text(12, mid, "conciseness", f'{middle} transform="rotate(-90 12 {mid})"'))
    for tick in (0, 0.5, 1):
        parts.append(svg_text(pad + tick * size, size + pad / 2 + 16, f"{tick:g}", middle))
        parts.append(
            svg_text(pad - 6, pad / 2 + (1 - tick) * size + 4, f"{tick:g}", 'text-anchor="end"')
        )
    return svg(size + pad + 10, size + pad + 20, parts, "completeness against conciseness")


def _regions(size: int, pad: int) -> str:
    """The diagnosis regions of the completeness-conciseness plane, shaded and named."""
    regions = [
        (0, 0, LOW_COMPLETENESS, 1, "#fbe3e6", "retrieval or generation"),
        (LOW_COMPLETENESS, 0, 1, LOW_CONCISENESS, "#ece5f6", "too much context"),
        (LOW_COMPLETENESS, LOW_CONCISENESS, 1, 1, "#e3f4ec", "ok"),
    ]
    parts = []
    for x0, y0, x1, y1, fill, label in regions:
        x, y = pad + x0 * size, pad / 2 + (1 - y1) * size
        parts.append(
            f'<rect x="{x}" y="{y}" width="{(x1 - x0) * size}" height="{(y1 - y0) * size}" '
            f'fill="{fill}"/>' + svg_text(x + 6, y + 16, label, 'fill="#57606a"')
        )
    return "".join(parts)
