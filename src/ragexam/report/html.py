"""Render the summary: a rich table for the terminal and a self-contained HTML report."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from ragexam.analysis.controlruns import LOW_GOLD, PRIOR_KNOWLEDGE, RETRIEVAL_LOSS
from ragexam.analysis.resampling import RESAMPLES
from ragexam.analysis.summary import (
    DIAGNOSES,
    LOW_COMPLETENESS,
    LOW_CONCISENESS,
    LOW_HIT_RATE,
    StatsResult,
)
from ragexam.io.atomic import atomic_file
from ragexam.io.cells import UNANSWERABLE
from ragexam.report import drilldown, kinds, marked, page
from ragexam.report.charts import bars, histogram, scatter
from ragexam.report.controlcharts import sections as measured_sections
from ragexam.report.headline import FEW_QUESTIONS, headline, too_few

REPORT_DOCUMENTS = 30


# -- HTML ---------------------------------------------------------------------------------------

STYLE = """
body{margin:0;background:#f4f5f7;color:#1f2328;
 font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1180px;margin:0 auto;padding:28px 24px 60px}
h1{font-size:28px;margin:0 0 4px}h2{font-size:19px;margin:0 0 6px}
.context{color:#57606a;margin:0 0 10px}.lead{font-size:17px;margin:0 0 18px;max-width:62em}
.narrow{display:none}details.judge>summary{cursor:pointer}
details.judge[open]>summary{margin-bottom:12px}.note{color:#57606a;margin:0 0 12px;font-size:13.5px}
section,.pair>div,.card{background:#fff;border-radius:10px;box-shadow:0 1px 3px #0000001f}
section{overflow-x:auto;padding:18px 20px;margin:0 0 18px}.pair>div{padding:18px 20px}
.cards,.pair{display:grid;gap:14px;background:none;box-shadow:none;padding:0}
.cards{grid-template-columns:repeat(4,1fr) 1.5fr}.pair{grid-template-columns:1fr 1fr}
.card{padding:12px 14px}.card b{display:block;font-size:26px}
.card span{color:#57606a;font-size:13px}.card i,td small{display:block;color:#8c959f;
 font-size:12px;font-style:normal}
table{border-collapse:collapse;width:100%;font-size:13.5px}
th{text-align:left;color:#57606a;font-weight:600;border-bottom:2px solid #d0d7de;padding:6px 8px}
td{border-bottom:1px solid #eaeef2;padding:6px 8px;vertical-align:top}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafbfc}.doc{min-width:12em;overflow-wrap:break-word}
.text{max-width:300px;max-height:9em;overflow:auto;white-space:pre-wrap;overflow-wrap:break-word}
.chip{display:inline-block;border-radius:999px;padding:1px 9px;color:#fff;font-size:12.5px;
 white-space:nowrap}
svg{display:block;max-width:100%;height:auto}svg text{font-size:12px;fill:#1f2328}
dl{display:grid;grid-template-columns:max-content 1fr;gap:6px 14px;margin:0 0 14px}dd{margin:0}
.card dl{gap:1px 10px;margin:0;font-size:13.5px}.card dt{text-align:right;font-weight:600}
.card dd{color:#57606a}
"""
# Phones: cards in two columns, each chart in its narrow drawing (text stays 12 px), and each
# table row stacked as lines of "header value": neither the page nor a section overflows.
PHONE = """
@media (max-width:720px){main{padding:16px 10px 40px}h1{font-size:22px}
section{padding:14px 12px}.pair>div{padding:14px 12px;min-width:0}
.cards{grid-template-columns:1fr 1fr}.cards>.card:last-child{grid-column:1/-1}
.pair{grid-template-columns:minmax(0,1fr)}.wide{display:none}.narrow{display:block}
table,tbody,tr,td{display:block}thead{display:none}tr{padding:6px 0;border-bottom:1px solid #d0d7de}
td,td.n{border:none;padding:2px 0;text-align:left;white-space:normal}
td[data-label]::before{content:attr(data-label);display:inline-block;min-width:8em;
 color:#57606a;font-size:12.5px}.doc,.text{min-width:0;max-width:none}}
"""
# No fetch and no script may run: the page is static, and a hostile text that escaping somehow
# missed still could not act.
POLICY = "default-src 'none'; style-src 'unsafe-inline'"


def write_report(result: StatsResult, path: Path) -> Path:
    """Write report.html: one file that needs no network to view."""
    from ragexam.report.trust import judge_panels  # trust draws with this module's helpers

    documents = result.by_document.head(REPORT_DOCUMENTS)
    sections = [
        _header(result),
        _cards(result.overall.iloc[0]),
        _errors(result),
        kinds.section(result.by_kind),
        *judge_panels(result),
        page.section(
            "Documents, worst completeness first",
            f"The {len(documents)} documents with the lowest completeness: mean and 95% "
            "confidence interval of each judge score, and the diagnosis; a document of fewer "
            f"than {FEW_QUESTIONS} questions is marked: its figures are too noisy to read.",
            page.responsive(bars(documents), bars(documents, narrow=True)),
        ),
        _pair(result),
        *(
            page.section(*section)
            for section in measured_sections(documents, result.overall, result.k)
        ),
        *marked.sections(result, documents),
        page.section("Per document", "The same documents, every figure.", _documents(documents)),
        _worst_section(result),
        _every_question(result),
        page.section("How to read this report", "", _legend(result)),
    ]
    text = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>ragexam report</title><style>{STYLE}{marked.STYLE}{PHONE}</style></head>\n"
        "<body><main>\n" + "\n".join(sections) + "\n</main></body></html>\n"
    )
    with atomic_file(path) as handle:
        handle.write(text)
    return path


def _every_question(result: StatsResult) -> str:
    """The drill-down (drilldown.py): every question, by document, filterable."""
    if result.out is None or result.questions.empty:
        return ""
    total = len(result.questions)
    shown = drilldown.lowest_graded(result.questions, drilldown.SHOWN_QUESTIONS)
    totals = {str(doc): int(n) for doc, n in result.questions["document"].value_counts().items()}
    questions = drilldown.extra_columns(result.out, shown)
    title = f"Every question ({total:,})"
    if len(shown) < total:
        title = f"The {len(shown):,} lowest-graded questions of {total:,}"
    cut = (
        f" Past {drilldown.SHOWN_QUESTIONS:,} questions the page would not open, so it holds "
        "the lowest graded, as many from every document; judgments.csv and answers.csv hold all."
    )
    return page.section(
        title,
        "By document, worst first; open a document to see each question with its answer, the "
        "judge's reasoning, the retrieved chunks (the source chunk marked) and the source text."
        + (cut if len(shown) < total else ""),
        drilldown.section(questions, result.by_document, result.k, totals),
    )


def _header(result: StatsResult) -> str:
    """The title, what the run was, and the opening sentence: what to fix first."""
    context = " · ".join(f"{escape(key)}: {escape(value)}" for key, value in result.context.items())
    lead = f'<p class="lead">{escape(headline(result))}</p>'
    return f'<h1>RAG report card</h1><p class="context">{context}</p>{lead}'


def _errors(result: StatsResult) -> str:
    """Why questions ended in error, stage by stage (their rows' error column, grouped)."""
    if not result.errors:
        return ""
    items = "".join(
        f"<li><b>{escape(stage)}</b>: {rows:,} row{'s' * (rows != 1)} in error; most often "
        + "; ".join(f"{escape(text)} ({count:,})" for count, text in reasons)
        + "</li>"
        for stage, rows, reasons in result.errors
    )
    note = (
        "Each stage's file has the reason of every row in its error column; rerun the stage "
        "to retry them."
    )
    return page.section("Errors", note, f"<ul>{items}</ul>", anchor="errors")


def _cards(overall: pd.Series) -> str:
    """The overall means, large, each with its CI; then the counts in one card."""
    html = "".join(
        f'<div class="card"><b>{page.number(overall[mean])}</b><span>{label}</span>'
        f"<i>95% CI {page.ci(overall, name) or '-'}</i></div>"
        for name, mean, label in page.MEANS
    )
    counts = ("questions", "errors", "pending", "missed")
    rows = "".join(f"<dt>{overall[name]:,}</dt><dd>{name}</dd>" for name in counts)
    return f'<section class="cards">{html}<div class="card"><dl>{rows}</dl></div></section>'


# -- charts (drawn in charts.py) -----------------------------------------------------------------


def _pair(result: StatsResult) -> str:
    """The rank histogram and the scatter, side by side."""
    return (
        '<section class="pair"><div><h2>Where the source chunk ranked</h2>'
        f'<p class="note">Every answered question; a miss is a rank beyond k={result.k}.</p>'
        + page.responsive(
            histogram(result.overall.iloc[0]),
            histogram(result.overall.iloc[0], 330),
        )
        + "</div>"
        '<div><h2>Completeness against conciseness</h2><p class="note">One dot per document, '
        "sized by its questions and coloured by its diagnosis, over the diagnosis regions.</p>"
        + page.responsive(scatter(result.by_document), scatter(result.by_document, 270))
        + "</div></section>"
    )


# -- tables -------------------------------------------------------------------------------------


def _documents(documents: pd.DataFrame) -> str:
    """Every figure of each document, each mean with its CI below it."""
    counts = ("questions", "errors", "pending")
    headers = [
        "document",
        *counts,
        *(label for *_, label in page.MEANS),
        "nDCG",
        "missed",
        "diagnosis",
    ]
    rows = []
    for _, row in documents.iterrows():
        cells = [page.cell(escape(str(row["document"])), "doc")]
        cells += [page.cell(str(row[name])) for name in counts]
        if too_few(int(row["questions"])):
            cells[1] = page.cell(f"{row['questions']}<small>too few to read</small>")
        cells += [
            page.cell(f"{page.number(row[mean])}<small>{page.ci(row, name)}</small>")
            for name, mean, _ in page.MEANS
        ]
        cells += [page.cell(page.number(row["ndcg"])), page.cell(str(row["missed"]))]
        rows.append([*cells, page.cell(page.chip(str(row["diagnosis"])), "d")])
    return page.table(headers, rows)


def _worst_section(result: StatsResult) -> str:
    """The worst questions; marked, when they were graded by key points."""
    worst = _marked(result, result.worst)
    note = "Lowest completeness first, then conciseness, then the worst rank."
    if "key_point_verdicts" in worst:
        note += (
            " Each ground truth's key points are ticked (present), halved (partial) or crossed "
            "(missed), with the answer's words that earned them; under each answer, the "
            "statements the ground truth does not support."
        )
    title = f"The {len(result.worst)} worst questions"
    if worst.empty:  # perfect answers are not shown as the worst
        return page.section(
            "The worst questions",
            "Every answered question is graded complete and concise, its source chunk first.",
            "",
            anchor="worst",
        )
    return page.section(
        title, note + " Perfect answers are left out.", _worst(worst, result.k), anchor="worst"
    )


def _marked(result: StatsResult, worst: pd.DataFrame) -> pd.DataFrame:
    """The worst questions with their marking, when they were graded by key points."""
    if result.out is None or worst.empty or "key_point_recall" not in result.overall:
        return worst
    return drilldown.extra_columns(result.out, worst)


def _worst(worst: pd.DataFrame, k: int) -> str:
    """The worst questions with their texts (marked, when graded by key points), rank, scores."""
    texts = ("document", "question", "ground_truth_answer", "answer")
    headers = ["document", "question", "ground truth", "answer", "rank"]
    headers += ["completeness", "conciseness"]
    marks = {"ground_truth_answer": marked.marked_points, "answer": marked.unsupported}
    rows = []
    for row in worst.to_dict("records"):
        rank = row["rank"]
        shown = "miss" if pd.isna(rank) or rank > k else str(int(rank))
        if row.get("kind") == UNANSWERABLE:
            shown = "-"  # no source chunk to retrieve: none to miss
        cells = [
            page.cell(escape(str(row[name])) + marks.get(name, _nothing)(row), "text")
            for name in texts
        ]
        scores = [page.number(row["completeness"]), page.number(row["conciseness"])]
        rows.append([*cells, page.cell(shown), *map(page.cell, scores)])
    return page.table(headers, rows)


def _nothing(row: dict[Any, Any]) -> str:
    return ""


def _legend(result: StatsResult) -> str:
    """The diagnoses, their thresholds, and how the figures are computed."""
    items = "".join(
        f"<dt>{page.chip(name)}</dt><dd>{escape(text)}</dd>" for name, text in DIAGNOSES.items()
    )
    notes = [
        f"Completeness below {LOW_COMPLETENESS:g} is low, hit rate below {LOW_HIT_RATE:g} is "
        f"low, conciseness below {LOW_CONCISENESS:g} is low.",
        "Judge means are over the judged questions, retrieval means over the answered ones, "
        "misses included; a question that failed counts in errors, and in no mean of the "
        "stage that failed or of those after it (a failed judgment keeps the retrieval of its "
        "answer, but not a place in the diagnosis).",
        f"95% confidence intervals: percentile bootstrap, {RESAMPLES} resamples, seed "
        f"{result.seed} (per document a Poisson bootstrap, overall the exact multinomial one).",
        "Retrieval metrics follow trec_eval, with the question's chunks as its relevant ones "
        "(one for a single question, two for a multi-hop one); unanswerable questions are out "
        "of the retrieval means and of the conciseness means (a right decline states nothing).",
    ]
    if "retrieval_loss" in result.overall:  # control runs: the diagnosis is measured instead
        notes.insert(
            1,
            "With the control runs, the diagnosis is measured, first match wins: prior "
            f"knowledge when closed-book completeness is {PRIOR_KNOWLEDGE:g} or more; generation "
            f"when gold completeness is below {LOW_GOLD:g}; retrieval when the retrieval loss "
            f"(gold less RAG completeness) is {RETRIEVAL_LOSS:g} or more; too much context when "
            f"conciseness is below {LOW_CONCISENESS:g}; else ok. The thresholds above read a "
            "document without both control figures.",
        )
    return f"<dl>{items}</dl>" + "".join(f'<p class="note">{escape(note)}</p>' for note in notes)
