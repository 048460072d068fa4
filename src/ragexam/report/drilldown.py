"""The report's drill-down: every question, by document, filterable, with what explains its grade.

Filtering needs no script: the filters are radio buttons and checkboxes placed before the
question list, and CSS sibling selectors hide what does not match. Sections start closed, so a
report of thousands of questions opens fast. Every text is escaped.
"""

from __future__ import annotations

import json
import math
import re
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ragexam.analysis.keypoints import exam_key_points
from ragexam.analysis.summary import LOW_COMPLETENESS, LOW_CONCISENESS
from ragexam.io.cells import SINGLE, UNANSWERABLE
from ragexam.io.csvfile import unescape_cell
from ragexam.io.runfolder import RunFolder
from ragexam.report.marked import marked_points, unsupported

# what the marked script needs of judgments.csv
MARKING = ("key_point_verdicts", "key_point_evidence", "key_point_context", "answer_statements",
           "key_point_samples")  # fmt: skip  # the last, with --samples N: each grading's
SHOWN_CHARS = 2000  # of a source chunk's text in the report; the CSV holds it all
# Questions the drill-down holds at most (a 5,000-question report opens in under 2 s; a
# million would make an 800 MB page that no browser opens); past it, the lowest graded.
SHOWN_QUESTIONS = 5000
# question filters: (id, class, label)
QUESTION_FILTERS = (
    ("fq-miss", "miss", "source chunk missed"),
    ("fq-lc", "lc", f"completeness < {LOW_COMPLETENESS:g}"),
    ("fq-ls", "ls", f"conciseness < {LOW_CONCISENESS:g}"),
)
STYLE = """
.f{position:absolute;opacity:0;pointer-events:none}
.filters{display:flex;flex-wrap:wrap;gap:6px 8px;align-items:center;margin:0 0 12px}
.filters span{color:#57606a;font-size:13px;margin-right:2px}
.filters label{border:1px solid #d0d7de;border-radius:999px;padding:2px 10px;cursor:pointer;
 font-size:13px;background:#fff}
.dg{border-top:1px solid #eaeef2}.dg summary{cursor:pointer;padding:8px 2px;
 overflow-wrap:break-word}
.dg summary small{color:#57606a}
.q{border-left:3px solid #d0d7de;margin:0 0 12px 4px;padding:2px 0 2px 12px}
.q.miss{border-color:#d1495b}.q>p{margin:4px 0;font-weight:600;overflow-wrap:break-word}
.q dl{grid-template-columns:max-content minmax(0,1fr);margin:0;font-size:13.5px}
.q dt{color:#57606a}.q dd{white-space:pre-wrap;overflow-wrap:break-word;min-width:0}
.q ol{margin:0;padding-left:1.6em}.q li.src{font-weight:600}
.q .chunk{max-height:12em;overflow:auto;background:#f6f8fa;padding:4px 6px;border-radius:6px}
"""


def lowest_graded(questions: pd.DataFrame, limit: int) -> pd.DataFrame:
    """At most `limit` questions: the same number from every document, lowest completeness
    first (ungraded last), then the lowest of what is left; all of them when they fit."""
    if len(questions) <= limit:
        return questions
    order = questions.assign(_c=questions["completeness"].fillna(np.inf)).sort_values(
        "_c", kind="stable"
    )
    place = order.groupby(order["document"].astype(str), sort=False).cumcount()
    per_document = max(1, limit // max(1, order["document"].nunique()))
    chosen = pd.concat([order[place < per_document], order[place >= per_document]])
    return chosen.head(limit).drop(columns="_c").sort_index()


def extra_columns(out: Path, questions: pd.DataFrame) -> pd.DataFrame:
    """The questions with what the drill-down adds: chunk id, retrieved ids and texts, reasoning."""
    ids = questions["qa_id"]
    folder = RunFolder(out)
    qa = _columns(folder.exam(), ("chunk_id", "chunk_ids"), ids)
    answers_path = folder.answers_read()
    wanted = ("retrieved_ids", "retrieved_texts", "source_text", "target_ranks")
    answers = _columns(answers_path, wanted, ids)
    judged = _columns(folder.judgments, ("reasoning", "error", *MARKING), ids)
    points = exam_key_points(folder) if (judged["key_point_verdicts"] != "").any() else {}
    return questions.assign(
        chunk_id=qa["chunk_id"].to_numpy(),
        chunk_ids=qa["chunk_ids"].to_numpy(),
        **{name: answers[name].to_numpy() for name in wanted},
        reasoning=judged["reasoning"].to_numpy(),
        **{name: judged[name].to_numpy() for name in MARKING},
        key_points=[points.get(unescape_cell(str(qa_id))) or "" for qa_id in ids],
    )


def _columns(path: Path, names: tuple[str, ...], ids: pd.Series) -> pd.DataFrame:
    """`names` of a CSV aligned to `ids` by qa_id; empty where the file, column or row is absent."""
    empty = pd.DataFrame({name: [""] * len(ids) for name in names})
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns
    except (OSError, ValueError):
        return empty
    present = [name for name in names if name in header]
    frame = pd.read_csv(
        path,
        usecols=["qa_id", *present],
        dtype=str,
        keep_default_na=False,
        encoding="utf-8-sig",
    ).drop_duplicates("qa_id", keep="last")
    aligned = frame.set_index("qa_id").reindex(ids.to_numpy()).fillna("")
    for name in names:
        empty[name] = aligned[name].to_numpy() if name in present else ""
    return empty


def slug(text: str) -> str:
    """A CSS class name for a diagnosis ("too much context" -> "too-much-context")."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "none"


def style(diagnoses: list[str]) -> str:
    """The CSS, with one hiding rule per filter."""
    rules = [STYLE]
    for diagnosis in diagnoses:
        name = slug(diagnosis)
        rules.append(f"#fd-{name}:checked~.drill .dg:not(.d-{name}){{display:none}}")
        rules.append(f"#fd-{name}:checked~.filters label[for=fd-{name}]{{{_ON}}}")
    rules.append(f"#fd-all:checked~.filters label[for=fd-all]{{{_ON}}}")
    for ident, css, _ in QUESTION_FILTERS:
        rules.append(f"#{ident}:checked~.drill .q:not(.{css}){{display:none}}")
        rules.append(f"#{ident}:checked~.drill .dg:not(:has(.{css})){{display:none}}")
        rules.append(f"#{ident}:checked~.filters label[for={ident}]{{{_ON}}}")
    return "\n".join(rules)


_ON = "background:#1f2328;color:#fff;border-color:#1f2328"


def section(
    questions: pd.DataFrame, by_document: pd.DataFrame, k: int, totals: dict[str, int]
) -> str:
    """The questions, grouped by document in closed sections, worst document first; `totals`
    is each document's count of questions, shown or not."""
    diagnoses = list(dict.fromkeys(by_document["diagnosis"].astype(str)))
    inputs = ['<input type="radio" class="f" name="fd" id="fd-all" checked>']
    inputs += [f'<input type="radio" class="f" name="fd" id="fd-{slug(d)}">' for d in diagnoses]
    inputs += [f'<input type="checkbox" class="f" id="{i}">' for i, _, _ in QUESTION_FILTERS]
    labels = ['<span>Documents:</span><label for="fd-all">all</label>']
    labels += [f'<label for="fd-{slug(d)}">{escape(d)}</label>' for d in diagnoses]
    labels.append("<span>Questions:</span>")
    labels += [f'<label for="{i}">{escape(text)}</label>' for i, _, text in QUESTION_FILTERS]
    members: dict[str, list[dict[Any, Any]]] = {}
    lowest_first = questions["completeness"].fillna(np.inf).sort_values(kind="stable").index
    for row in questions.loc[lowest_first].to_dict("records"):  # one pass: 5,000 documents
        members.setdefault(str(row["document"]), []).append(row)  # cost 2.5 ms each in pandas
    blocks = [
        _document(doc, str(diagnosis), members.get(doc), k, totals.get(doc, 0))
        for doc, diagnosis in zip(
            by_document["document"].astype(str), by_document["diagnosis"], strict=True
        )
    ]
    return (
        f"<style>{style(diagnoses)}</style>{''.join(inputs)}"
        f'<div class="filters">{"".join(labels)}</div>'
        f'<div class="drill">{"".join(blocks)}</div>'
    )


def _document(
    name: str, diagnosis: str, rows: list[dict[Any, Any]] | None, k: int, total: int
) -> str:
    """One closed section: the document's questions (`rows`, lowest completeness first)."""
    if not rows:
        return ""
    items = [_question(row, k) for row in rows]
    missed = sum(_missed(row, k) for row in rows)
    summary = (
        f"<summary><b>{escape(name)}</b> <small>· {escape(diagnosis)} · {len(items)} "
        f"questions, {missed} missed</small></summary>"
        if total <= len(items)
        else f"<summary><b>{escape(name)}</b> <small>· {escape(diagnosis)} · the {len(items)} "
        f"lowest graded of {total} questions, {missed} of them missed</small></summary>"
    )
    return f'<details class="dg d-{slug(diagnosis)}">{summary}{"".join(items)}</details>'


def _missed(row: dict[Any, Any], k: int) -> bool:
    """Whether the question was answered without a source chunk in the top k (an unanswerable
    question has none to miss)."""
    rank = _number(row["rank"])
    unanswerable = str(row.get("kind", "")) == UNANSWERABLE
    return bool(row["answered"]) and not unanswerable and (rank is None or rank > k)


def _question(row: dict[Any, Any], k: int) -> str:
    """One question: texts, grades, the judge's reasoning, ranks and the source chunk."""
    rank = _number(row["rank"])
    missed = _missed(row, k)
    shown = None if missed or rank is None else int(rank)
    classes = ["q"] + ["miss"] * missed
    classes += ["lc"] * _below(row["completeness"], LOW_COMPLETENESS)
    classes += ["ls"] * _below(row["conciseness"], LOW_CONCISENESS)
    points, statements = marked_points(row), unsupported(row)
    kind = str(row.get("kind", SINGLE))
    facts = [("kind", escape(kind))] if kind != SINGLE else []
    facts += [
        ("ground truth", _text(row["ground_truth_answer"])),
        *([("key points", points)] if points else []),
        ("answer", _text(row["answer"]) if row["answered"] else "<i>not answered</i>"),
        *([("statements", statements)] if statements else []),
        ("grades", _grades(row)),
        ("judge", _text(row["reasoning"])),
        ("rank", "miss" if missed else str(shown or "-")),
        ("retrieved", _retrieved(str(row["retrieved_ids"]), _found(row, shown, k))),
        ("source chunk", f"{escape(str(row['chunk_id']))}{_source(row, shown)}"),
    ]
    if kind != SINGLE:  # the first chunk's text is recorded; every chunk is named
        chunks = escape(unescape_cell(str(row.get("chunk_ids") or ""))) or "none"
        facts[-1] = ("source chunks", chunks + (_source(row, shown) if shown else ""))
    listed = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    return (
        f'<div class="{" ".join(classes)}" id="q-{escape(str(row["qa_id"]))}">'
        f"<p>{_text(row['question'])}</p><dl>{listed}</dl></div>"
    )


def _number(value: Any) -> float | None:
    """A float, or None for an empty or missing value."""
    if value is None or value == "":
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _below(value: Any, limit: float) -> bool:
    number = _number(value)
    return number is not None and number < limit


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return escape(unescape_cell(str(value)))


def _grades(row: dict[Any, Any]) -> str:
    if not bool(row["judged"]):
        return "<i>error</i>" if bool(row["error"]) else "<i>not judged yet</i>"
    return f"completeness {row['completeness']:.2f}, conciseness {row['conciseness']:.2f}"


def _found(row: dict[Any, Any], shown: int | None, k: int) -> set[int]:
    """The ranks within k of every source chunk (target_ranks), else of the one shown."""
    try:
        ranks = json.loads(str(row.get("target_ranks") or "null"))
    except ValueError:
        ranks = None
    if not isinstance(ranks, list):
        return {shown} if shown else set()
    return {rank for rank in ranks if isinstance(rank, int) and rank <= k}


def _retrieved(ids_json: str, found: set[int]) -> str:
    """The retrieved ids in order, the source chunks' ones marked."""
    try:
        ids = json.loads(ids_json) if ids_json else []
    except ValueError:
        return escape(ids_json)
    if not isinstance(ids, list) or not ids:
        return "-"
    items = [
        f'<li class="src">{escape(str(i))} ← source</li>'
        if n in found
        else f"<li>{escape(str(i))}</li>"
        for n, i in enumerate(ids, start=1)
    ]
    return f"<ol>{''.join(items)}</ol>"


def _source(row: dict[Any, Any], rank: int | None) -> str:
    """The source chunk's text: recorded by answer, else the retrieved text at its rank."""
    text = unescape_cell(str(row["source_text"] or ""))
    if not text and rank is not None and row["retrieved_texts"]:
        try:
            text = str(json.loads(str(row["retrieved_texts"]))[rank - 1] or "")
        except (ValueError, IndexError, TypeError):
            text = ""
    if not text:
        return " <i>(text not recorded: answer with texts on records it)</i>"
    cut = "…" if len(text) > SHOWN_CHARS else ""
    return f'<div class="chunk">{escape(text[:SHOWN_CHARS])}{cut}</div>'
