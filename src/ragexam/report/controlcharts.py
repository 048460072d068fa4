"""Report charts of the measured diagnosis and the cutoffs: control runs beside the RAG run per
document, and the hit rate and MRR against the cutoff.
"""

from __future__ import annotations

import pandas as pd

from ragexam.analysis.controlruns import LOW_GOLD, PRIOR_KNOWLEDGE, RETRIEVAL_LOSS
from ragexam.analysis.cutoffs import cutoffs_for
from ragexam.report.charts import diagnosis_colour, svg, svg_text
from ragexam.report.page import responsive

TEXT_WIDTH = 7.2  # px per character of 12 px text, a little over the widest common font's
# (column, label, colour) of the three bars per document
RUNS = [
    ("completeness_gold", "gold context", "#2e9e6b"),
    ("completeness_rag", "RAG", "#3b6fb6"),  # over the questions the control runs read
    ("completeness_closed_book", "closed book", "#9aa0a6"),
]


def with_rag(figures: pd.DataFrame) -> pd.DataFrame:
    """The figures with the RAG run's completeness over the answerable questions, the base the
    control runs and the retrieval loss are read on (an unanswerable question's right answer
    is a decline): gold minus the loss. completeness_mean covers every question."""
    if "retrieval_loss" not in figures or "completeness_gold" not in figures:
        return figures
    return figures.assign(completeness_rag=figures["completeness_gold"] - figures["retrieval_loss"])


def sections(
    by_document: pd.DataFrame, overall: pd.DataFrame, k: int
) -> list[tuple[str, str, str]]:
    """(title, note, chart) of each section these figures allow; none without them."""
    found, by_document = [], with_rag(by_document)
    if all(column in by_document for column, _, _ in RUNS):
        note = (
            "Completeness with the source chunk handed over, with the retrieved chunks, and with "
            f"no context. Closed book at or above {PRIOR_KNOWLEDGE:g} is prior_knowledge; gold "
            f"below {LOW_GOLD:g} is generation; a retrieval loss (gold minus RAG) of "
            f"{RETRIEVAL_LOSS:g} or more is retrieval."
        )
        chart = responsive(control_bars(by_document), control_bars(by_document, narrow=True))
        found.append(("Is it retrieval or generation? Measured", note, chart))
    if f"hit_rate_at_{cutoffs_for(k)[0]}" in overall:
        note = "From the same answer run: the metrics if only the top C chunks had been retrieved."
        found.append(
            (
                "Hit rate and MRR against the cutoff",
                note,
                responsive(cutoff_chart(overall.iloc[0], k), cutoff_chart(overall.iloc[0], k, 240)),
            )
        )
    return found


def control_bars(documents: pd.DataFrame, narrow: bool = False) -> str:
    """Per document: gold, RAG and closed-book completeness side by side, and the diagnosis.

    The chart is as wide as its longest label needs; narrow (a phone), each document's name
    and diagnosis go on lines of their own, above and below its bars.
    """
    left, scale, height = (0, 240, 82) if narrow else (330, 480, 46)
    parts, widest = [], 0.0
    for number, row in enumerate(documents.to_dict("records")):
        top, name = 26 + number * height, str(row["document"])
        short = name if len(name) <= 44 else "…" + name[-43:]
        if narrow:
            parts.append(svg_text(0, top + 10, short))
            top += 16
        else:
            parts.append(svg_text(left - 10, top + 20, short, 'text-anchor="end"'))
        for place, (column, label, colour) in enumerate(RUNS):
            value, y = row[column], top + place * 13
            if pd.isna(value):
                continue
            parts.append(
                f'<rect x="{left}" y="{y}" width="{value * scale:.1f}" height="11" '
                f'fill="{colour}" rx="2"><title>{label} {value:.3f}</title></rect>'
            )
            parts.append(
                svg_text(left + value * scale + 4, y + 10, f"{value:.2f}", 'font-size="10"')
            )
        loss, diagnosis = row.get("retrieval_loss"), str(row["diagnosis"])
        text = diagnosis + ("" if pd.isna(loss) else f" · retrieval loss {loss:+.2f}")
        x, y = (6, top + 50) if narrow else (left + scale + 50, top + 18)
        parts.append(f'<circle cx="{x}" cy="{y}" r="6" fill="{diagnosis_colour(diagnosis)}"/>')
        parts.append(svg_text(x + 12, y + 4, text))
        widest = max(widest, x + 12 + TEXT_WIDTH * len(text))
    for place, (_, label, colour) in enumerate(RUNS):
        x = left + place * (90 if narrow else 120)
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{colour}"/>')
        parts.append(svg_text(x + 14, 13, label))
    width = max(left + scale + 40, widest + 10)
    return svg(width, 36 + height * len(documents), parts, "control runs per document")


def cutoff_chart(overall: pd.Series, k: int, width: int = 440) -> str:
    """Hit rate and MRR at each cutoff C <= k, as two lines over C on a 0-1 scale."""
    cutoffs, height, pad = cutoffs_for(k), 280, 40
    step = (width - 2 * pad) / max(len(cutoffs) - 1, 1)
    bottom, span = height - 60, height - 60 - pad // 2
    parts = _cutoff_axes(width, bottom, span, pad)
    # MRR@C never exceeds the hit rate@C: its values go below its points, the hit rate's above.
    for line, (metric, colour, shift) in enumerate(
        (("hit_rate", "#3b6fb6", -8), ("mrr", "#e69f00", 15))
    ):
        points = []
        for place, cutoff in enumerate(cutoffs):
            value = float(overall[f"{metric}_at_{cutoff}"])
            if value != value:  # NaN: nothing answered yet
                continue
            x, y = pad + place * step, bottom - value * span
            points.append(f"{x:.1f},{y:.1f}")
            tip = f"<title>{metric} at {cutoff}: {value:.3f}</title>"
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}">{tip}</circle>')
            parts.append(
                svg_text(x, y + shift, f"{value:.2f}", 'text-anchor="middle" font-size="10"')
            )
        polyline = f'points="{" ".join(points)}" fill="none" stroke="{colour}" stroke-width="2"'
        parts.append(f"<polyline {polyline}/>")
        top = 10 + 18 * line
        parts.append(
            f'<rect x="{width - pad + 10}" y="{top}" width="10" height="10" fill="{colour}"/>'
        )
        parts.append(
            svg_text(width - pad + 24, top + 9, metric.replace("_", " ").replace("mrr", "MRR"))
        )
    for place, cutoff in enumerate(cutoffs):
        parts.append(
            svg_text(pad + place * step, bottom + 34, f"@{cutoff}", 'text-anchor="middle"')
        )
    parts.append(svg_text(width / 2, height - 6, "cutoff C (chunks kept)", 'text-anchor="middle"'))
    return svg(width + 80, height, parts, "hit rate and MRR against the cutoff")


def _cutoff_axes(width: int, bottom: int, span: int, pad: int) -> list[str]:
    """Gridlines at 0, 0.5 and 1, each labelled on the left."""
    parts = []
    for value in (0.0, 0.5, 1.0):
        y = bottom - value * span
        stroke = "#8c959f" if value == 0 else "#e4e7eb"
        parts.append(f'<line x1="{pad}" y1="{y}" x2="{width - pad}" y2="{y}" stroke="{stroke}"/>')
        parts.append(svg_text(pad - 6, y + 4, f"{value:g}", 'text-anchor="end" font-size="10"'))
    return parts


def control_line(overall: pd.DataFrame) -> str | None:
    """One terminal line of the control runs' overall figures; None without control runs."""
    row = with_rag(overall).iloc[0]
    if not all(column in row for column, _, _ in RUNS):
        return None
    figures = ", ".join(f"{label} {row[column]:.2f}" for column, label, _ in RUNS)
    return f"completeness: {figures}; retrieval loss {row['retrieval_loss']:.2f}"
