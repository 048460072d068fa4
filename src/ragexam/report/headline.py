"""The report's opening sentence: how good the answers are, where they break, what to try first.

Drawn from the summary alone (compute once, render many): the overall row for how good, the
diagnoses of the documents for where, and, when control runs were made, their measured
retrieval loss, the strongest evidence the tool has of what to fix.
"""

from __future__ import annotations

import pandas as pd

from ragexam.analysis.summary import StatsResult

FEW_QUESTIONS = 10  # a document's figures on fewer questions than this are too noisy to read
MADE_UP = 0.2  # a share of unanswerable questions answered with made-up facts to fix first
TRY = {
    "retrieval": "retrieve better first: more chunks (--k), another embedding model, or reranking",
    "generation": "improve the answers first: a stronger answer model, or a prompt that keeps "
    "to the context",
    "too much context": "trim the context first: fewer chunks (--k), or reranking",
    "prior_knowledge": "write harder questions first: these are answered without retrieval",
    "ok": "nothing urgent: read the worst questions next",
    "made up": "stop the made-up answers first: a prompt that says so when the chunks do not "
    "hold the answer, or a stronger answer model",
    "not judged": "run judge: no answer is graded yet",
}


def headline(result: StatsResult) -> str:
    """One sentence, or two when the judge failed its controls."""
    row = result.overall.iloc[0]
    completeness = row.get("completeness_mean")
    if pd.isna(completeness):
        return _ungraded(row, result.errors)
    pending = int(row.get("pending", 0) or 0)
    advice = TRY.get(str(row["diagnosis"]), TRY["ok"])
    if advice == TRY["ok"]:  # fine as a whole, but the documents that need work say what to try
        advice = TRY.get(_commonest(result.by_document), advice)
    made_up = row.get("made_up_unanswerable")
    if advice == TRY["ok"] and made_up is not None and made_up >= MADE_UP:  # NaN: not
        advice = TRY["made up"]
    so_far = ""
    errors = int(row.get("errors", 0) or 0)
    if pending or errors:  # the figures are of the graded questions alone: said, as the rest
        left = [f"{pending:,} pending"] * bool(pending) + [f"{errors:,} in error"] * bool(errors)
        so_far = f" (of the {int(row.get('n_judged', 0)):,} graded; {', '.join(left)})"
        if pending and advice == TRY["ok"]:
            advice = (
                f"nothing urgent in what is graded, but grade the {pending:,} pending questions "
                "first: run answer and judge, then stats"
            )
    graded = int(row.get("n_judged", 0) or 0)
    if graded < FEW_QUESTIONS:  # 1.00 on two questions is no certainty: said at once
        few = "too few to read firmly"
        so_far = f"{so_far[:-1]}: {few})" if so_far else f" ({graded:,} graded: {few})"
    sentence = (
        f"Answers are {as_shown(completeness):.0%} complete{so_far}, and {_retrieval(row)}; "
        f"{_where(result)}; {advice}."
    )
    controls = result.controls
    if controls is not None and not controls.trusted:
        failed = f"{controls.passed_total}/{controls.total}"
        why = f"the judge passed only {failed} of its controls"
        if controls.unchecked_kinds() and controls.passed_total == controls.total:
            why = (  # it passed every control graded: "only 48/48" said nothing of why
                f"{controls.errors} of the judge's controls ended in error, so it is not "
                f"checked (it passed the {controls.total} graded)"
            )
        return f"Read these grades with care: {why}. {sentence}"
    return sentence


def _commonest(documents: pd.DataFrame) -> str:
    """The diagnosis of most questions among the documents that need work ("ok" if none)."""
    broken = documents[~documents["diagnosis"].isin(("ok", "not judged"))]
    if broken.empty:
        return "ok"
    return str(broken.groupby("diagnosis")["questions"].sum().idxmax())


def as_shown(value: float) -> float:
    """A figure as the page and the terminal show it, to two decimals: its percent then says
    the same (0.475 shown 0.47 is 47%, not 48%)."""
    return float(f"{value:.2f}")


def _ungraded(row: pd.Series, reasons: list[tuple[str, int, list[tuple[int, str]]]]) -> str:
    """Why no answer has a grade: none to grade, every one in error, or not judged yet."""
    questions, errors = int(row.get("questions", 0)), int(row.get("errors", 0))
    if questions == 0:
        return "No question to summarise: the exam is empty, or every question is left out."
    if errors == questions:
        why = "; ".join(
            f"{stage} {rows:,} (most often: {common[0][1]})" for stage, rows, common in reasons
        )
        return (
            f"Every one of the {questions:,} questions ended in error"
            + (f", in {why}" if why else "")
            + ": their rows' error column says why; fix the cause and rerun the stage that failed."
        )
    return "No answer is graded yet: run answer and judge, then stats."


def _retrieval(row: pd.Series) -> str:
    """The hit rate, over the questions it is measured on (those with a source chunk, answered)."""
    ranks = [name for name in row.index if name.startswith("rank_")]
    scored = int(row.get("missed", 0)) + int(sum(row[name] for name in ranks))
    if pd.isna(row.get("hit_rate")) or scored == 0:
        return "no answered question has a source chunk to retrieve"
    return f"the source chunk is retrieved for {row['hit_rate']:.0%} of {scored:,} questions"


def _where(result: StatsResult) -> str:
    """Where it breaks: the measured retrieval loss if any, and the worst documents."""
    row, documents = result.overall.iloc[0], result.by_document
    parts = []
    loss = row.get("retrieval_loss")
    if loss is not None and not pd.isna(loss):
        gold = row["completeness_gold"]  # both over the answerable questions, as the loss
        # over the answerable questions, as the loss: not the mean of every question above
        over = ", of the answerable questions" if row.get("questions_unanswerable", 0) else ""
        parts.append(
            f"retrieval loss {loss:.2f} (the source chunk handed over gives {gold:.0%} complete "
            f"answers, the retrieved chunks {gold - loss:.0%}{over})"
        )
    broken = documents[~documents["diagnosis"].isin(("ok", "not judged"))]
    readable = broken[broken["questions"] >= FEW_QUESTIONS]
    if len(readable):
        worst = readable.iloc[0]
        parts.append(
            f"{len(broken)} of {len(documents)} documents need work, worst {worst['document']} "
            f"({worst['diagnosis']}, {worst['completeness_mean']:.0%} complete)"
        )
    elif len(broken):
        parts.append(f"{len(broken)} of {len(documents)} documents need work")
    else:
        parts.append("no document stands out")
    made_up, graded = row.get("made_up_unanswerable"), row.get("n_judged_unanswerable", 0)
    if made_up is not None and not pd.isna(made_up) and made_up > 0:  # a share of the graded
        parts.append(
            f"{made_up:.0%} of {int(graded):,} graded unanswerable questions get made-up answers"
        )
    return "; ".join(parts)


def too_few(questions: int) -> bool:
    """A document whose figures rest on too few questions to read."""
    return questions < FEW_QUESTIONS
