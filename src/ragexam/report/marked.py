"""The marked script: each answer's key points ticked or crossed, with the answer's words as
evidence, and its statements the ground truth does not support; per document, the key points
missed most; and the key-point figures (recall, where points were lost, how samples agree).

Every text is escaped here.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

import pandas as pd

from ragexam.analysis.summary import StatsResult
from ragexam.io.cells import UNANSWERABLE
from ragexam.report import page

MARKS = {
    "present": ("\u2713", "present"),
    "partial": ("\u00bd", "partly"),
    "absent": ("\u2717", "missed"),
}
STYLE = """
ol.kp{list-style:none;margin:2px 0;padding:0}ol.kp li{margin:2px 0;padding-left:1.6em;
 text-indent:-1.6em}.kp b{display:inline-block;width:1.3em;text-align:center;border-radius:4px;
 color:#fff;text-indent:0;margin-right:.3em}.kp .present b{background:#2e9e6b}
.kp .partial b{background:#d39b22}.kp .absent b{background:#d1495b}
.kp q{color:#57606a;font-style:italic}.kp small,.st small{color:#8c959f;font-size:12px}
.kp small{display:block;text-indent:0}
ul.st{margin:2px 0;padding-left:1.2em}.st .contradicted{color:#d1242f}
"""
LOSSES = {True: "in the retrieved chunks: lost in generation", False: "not in the retrieved "
          "chunks: lost in retrieval"}  # fmt: skip


def _where_lost(held: Any, kind: str) -> str | None:
    """Where a missed key point was lost, as the losses count it (held_for_losses): by the
    judge's reading of the chunks, but an unanswerable question's, by the answer."""
    if kind == UNANSWERABLE and held in LOSSES:  # read: the report says what was read
        return "no chunk answers it: lost in generation (an answer made up)"
    return LOSSES.get(held) if isinstance(held, bool) else None


def _list(cell: Any) -> list[Any] | None:
    """A JSON array cell, or None for an empty or unreadable one."""
    if not isinstance(cell, str) or not cell:
        return None
    try:
        value = json.loads(cell)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def marked_points(row: dict[Any, Any]) -> str:
    """The key points, each ticked (present), halved (partial) or crossed (absent), with the
    answer's words that earned it and, when the judge read the context, where a miss was lost;
    empty when the answer was not graded by key points."""
    points, verdicts = _list(row.get("key_points")), _list(row.get("key_point_verdicts"))
    if not points or not verdicts or len(points) != len(verdicts):
        return ""
    evidence = _list(row.get("key_point_evidence")) or [""] * len(points)
    held = _list(row.get("key_point_context")) or [None] * len(points)
    samples = _samples(row, len(points))
    kind = str(row.get("kind", ""))
    items = []
    for at, (point, verdict, quote, was) in enumerate(
        zip(points, verdicts, evidence, held, strict=False)
    ):
        sign, word = MARKS.get(str(verdict), ("?", str(verdict)))
        said = f" <q>{escape(str(quote))}</q>" if quote and verdict != "absent" else ""
        lost = _where_lost(was, kind) if verdict != "present" else None
        where = f" <small>{lost}</small>" if lost else ""
        if samples:  # each grading's mark of it, the one shown being their majority
            marks = " ".join(MARKS.get(str(one[at]), ("?", ""))[0] for one in samples)
            where += f" <small>gradings: {marks}</small>"
        items.append(
            f'<li class="{escape(str(verdict))}"><b title="{word}">{sign}</b>'
            f"{escape(str(point))}{said}{where}</li>"
        )
    head = ""
    if samples:
        head = (
            f'<small class="st">graded {len(samples)} times: a point\'s mark is its majority, '
            f"and the grades are the means of the {len(samples)} gradings; the statements and "
            "words quoted are the first grading's</small>"
        )
    return f'{head}<ol class="kp">{"".join(items)}</ol>'


def _samples(row: dict[Any, Any], points: int) -> list[list[Any]]:
    """Each grading's verdicts, when the answer was graded more than once (and they fit)."""
    samples = _list(row.get("key_point_samples")) or []
    fits = all(isinstance(one, list) and len(one) == points for one in samples)
    return samples if len(samples) > 1 and fits else []


def unsupported(row: dict[Any, Any]) -> str:
    """The answer's statements the ground truth does not support (or contradicts)."""
    statements = _list(row.get("answer_statements"))
    if statements is None:
        return ""
    bad = [s for s in statements if isinstance(s, dict) and s.get("verdict") != "supported"]
    if not bad:
        return '<small class="st">every statement supported</small>' if statements else ""
    items = "".join(
        f'<li class="{escape(str(s.get("verdict")))}">{escape(str(s.get("statement", "")))} '
        f"<small>{escape(str(s.get('verdict')))}</small></li>"
        for s in bad
    )
    return f'<ul class="st">{items}</ul>'


def sections(result: StatsResult, documents: pd.DataFrame) -> list[str]:
    """The key-point figures per document and each document's most-missed key points."""
    if "key_point_recall" not in result.overall:
        return []
    figures = _figures(result, documents)
    found = [page.section("Graded by key points", _note(result), figures, anchor="key-points")]
    if not result.missed.empty:
        found.append(
            page.section(
                "Most-missed key points, by document",
                "The facts each document's answers leave out most (averaged over the samples "
                "when the judge graded several), worst documents first.",
                _missed(result.missed, documents),
                anchor="most-missed",
            )
        )
    return found


# (column, header) of the key-point figures, each shown when the summary has it
FIGURES = [
    ("key_points", "key points"),
    ("key_point_recall", "recall"),
    ("lost_in_generation", "lost in generation"),
    ("lost_in_retrieval", "lost in retrieval"),
    ("retrieval_loss", "retrieval loss (control runs)"),
    ("key_point_agreement", "samples agree"),
    ("key_point_kappa", "Fleiss' kappa"),
]


def _note(result: StatsResult) -> str:
    overall = result.overall.iloc[0]
    text = (
        "Completeness and conciseness are counted from the judge's verdicts: a verdict per key "
        "point of the ground truth (present, partial, absent) and per statement of the answer. "
        "Recall pools every key point of a document (a partial one counts half)."
    )
    if "lost_in_generation" in overall:
        text += (
            " The judge also read the retrieved chunks: a missed point they held was lost in "
            "generation, one they did not hold in retrieval; recall and the two losses add up "
            "to 1."
        )
        if "retrieval_loss" in overall:
            text += " The control runs' retrieval loss (gold minus RAG completeness) is beside it."
    if "key_point_kappa" in overall:
        text += " With several samples: the share of agreeing pairs of verdicts, and Fleiss' kappa."
    return text


def _figures(result: StatsResult, documents: pd.DataFrame) -> str:
    shown = [(column, header) for column, header in FIGURES if column in result.overall]
    rows = []
    for row in [*documents.to_dict("records"), result.overall.iloc[0].to_dict()]:
        cells = [page.cell(escape(str(row["document"])), "doc")]
        for column, _ in shown:
            value = row.get(column)
            text = str(int(value)) if column == "key_points" and not pd.isna(value) else None
            cells.append(page.cell(text or page.number(value)))
        rows.append(cells)
    return page.table(["document", *(header for _, header in shown)], rows)


def _missed(missed: pd.DataFrame, documents: pd.DataFrame) -> str:
    order = {name: place for place, name in enumerate(documents["document"].astype(str))}
    shown = missed[missed["document"].isin(order)]
    blocks = []
    groups = shown.groupby("document")
    for document, group in sorted(groups, key=lambda item: order[str(item[0])]):
        items = "".join(_missed_point(row) for row in group.to_dict("records"))
        total = int(group["missed"].iloc[0])
        blocks.append(
            f"<h3>{escape(str(document))} <small>· {total} key points missed</small></h3>"
            f'<ol class="kp">{items}</ol>'
        )
    return "".join(blocks)


def _missed_point(row: dict[Any, Any]) -> str:
    """One missed key point: crossed (always missed) or halved, with its question."""
    verdict = "absent" if row["loss"] >= 1 else "partial"
    notes = [escape(str(row["question"]))]
    if row["loss"] < 1:
        notes.append(f"lost {row['loss']:.0%}")
    if lost := _where_lost(row["in_context"], str(row.get("kind", ""))):
        notes.append(lost)
    return (
        f'<li class="{verdict}"><b>{MARKS[verdict][0]}</b>{escape(str(row["key_point"]))} '
        f"<small>{' · '.join(notes)}</small></li>"
    )


def key_point_line(overall: pd.DataFrame) -> str | None:
    """One line for the terminal: recall, where missed points were lost, how samples agree."""
    if "key_point_recall" not in overall:
        return None
    row = overall.iloc[0]
    parts = [f"key points: recall {page.number(row['key_point_recall'])} of {row['key_points']}"]
    if "lost_in_generation" in row:
        parts.append(
            f"lost in generation {page.number(row['lost_in_generation'])}, in retrieval "
            f"{page.number(row['lost_in_retrieval'])} (the judge read the retrieved chunks)"
        )
    if "key_point_agreement" in row:
        agree, kappa = row["key_point_agreement"], row["key_point_kappa"]
        share = "-" if pd.isna(agree) else f"{agree:.0%}"
        low, high = row.get("key_point_kappa_ci_low"), row.get("key_point_kappa_ci_high")
        interval = "" if low is None or pd.isna(low) else f" [95% CI {low:.2f}, {high:.2f}]"
        parts.append(
            f"samples agree on {share} of verdicts, Fleiss' kappa {page.number(kappa)}{interval}"
        )
    return "; ".join(parts)
