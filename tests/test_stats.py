"""The stats stage on crafted runs: every figure is derived by hand in the test."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from support import ANSWER_HEADER, JUDGE_HEADER, QA_HEADER, run_cli, write_csv

from ragexam.analysis.grouped import grouped_bootstrap_ci
from ragexam.io.csvfile import read_rows

# qa_id -> document; "'=C" is how ragexam escapes the document name "=C" in a CSV.
DOCUMENTS = {
    **{f"a{i}": "A" for i in range(1, 7)},
    **{f"b{i}": "B" for i in range(1, 4)},
    "c1": "'=C",
    "d1": "D",
    "d2": "D",
    "e1": "E",
    "f1": "F",
}
# qa_id -> target_rank ("" is a miss, None an error row); b1 failed in qa, b3 was not answered.
RANKS = {"a1": 1, "a2": 2, "a3": "", "a4": None, "a5": 3, "a6": 1, "b2": 7, "c1": 1}
RANKS |= {"d1": "", "d2": 2, "e1": 1, "f1": 1}
# qa_id -> (completeness, conciseness), None for an error row; zz is in no qa_dataset.
SCORES = {"a1": (1.0, 0.8), "a2": (0.5, 0.6), "a3": (0.0, 1.0), "a5": None, "b2": (0.9, 0.2)}
SCORES |= {"c1": (0.2, 0.4), "d1": (0.1, 0.9), "d2": (0.3, 0.9), "e1": (1.0, 1.0)}
SCORES |= {"zz": (0.0, 0.0)}


def crafted_run(folder: Path) -> Path:
    """Six documents with known ranks, scores, error rows in every stage and pending rows."""
    folder.mkdir(parents=True, exist_ok=True)
    qa = [
        [qa_id, f"chunk-{qa_id}", doc, f"Q {qa_id}?", f"T {qa_id}", "ok", ""]
        for qa_id, doc in DOCUMENTS.items()
    ]
    qa[6] = ["b1", "chunk-b1", "B", "", "", "error", "LLMError: 500"]
    write_csv(folder / "qa_dataset.csv", QA_HEADER, qa)
    answers = [
        [qa_id, "", "", "", "error", "timeout"]
        if rank is None
        else [qa_id, f"A {qa_id}", json.dumps([f"chunk-{qa_id}"]), rank, "ok", ""]
        for qa_id, rank in RANKS.items()
    ]
    write_csv(folder / "answers.csv", ANSWER_HEADER, answers[::-1])  # joined by id, not order
    judgments = [
        [qa_id, "", "", "error", "invalid JSON"] if scores is None else [qa_id, *scores, "ok", ""]
        for qa_id, scores in SCORES.items()
    ]
    write_csv(folder / "judgments.csv", JUDGE_HEADER, judgments)
    return folder


def summaries(folder: Path) -> tuple[dict[str, dict[str, str]], dict[str, str], list[str]]:
    """summary_by_document.csv by document, the summary.csv row, and the document order."""
    by_document = read_rows(folder / "summary_by_document.csv", ["document"])
    (overall,) = read_rows(folder / "summary.csv", ["document"])
    return (
        {row["document"]: row for row in by_document},
        overall,
        [row["document"] for row in by_document],
    )


def numbers(row: dict[str, str], *names: str) -> list[float]:
    return [float(row[name]) if row[name] else math.nan for name in names]


def test_every_figure_matches_the_hand_derived_value(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    docs, overall, order = summaries(run)
    # completeness ascending, NaN last; D and C tie at 0.2 and the lower hit rate comes first
    assert order == ["D", "=C", "A", "B", "E", "F"]
    counts = ("questions", "errors", "pending", "n_answered", "n_judged", "missed")
    ranks = ("rank_1", "rank_2", "rank_3", "rank_4", "rank_5")
    # A: ranks 1, 2, miss, 3, 1 (a4's answer failed, a5's judgment failed, a6 is not judged)
    assert numbers(docs["A"], *counts, *ranks) == [6, 2, 1, 5, 3, 1, 2, 1, 1, 0, 0]
    a = numbers(docs["A"], "completeness_mean", "conciseness_mean", "hit_rate", "mrr", "map")
    assert a == pytest.approx([1.5 / 3, 2.4 / 3, 4 / 5, (1 + 1 / 2 + 0 + 1 / 3 + 1) / 5, 17 / 30])
    ndcg = (1 + 1 / math.log2(3) + 0 + 1 / math.log2(4) + 1) / 5
    a = numbers(docs["A"], "ndcg", "precision", "recall", "f1")
    assert a == pytest.approx([ndcg, 4 / 5 / 5, 4 / 5, 4 / 5 * 2 / 6])
    # B: b1 failed in qa, b2's rank 7 is beyond k=5 (a miss), b3 has no answer yet
    assert numbers(docs["B"], *counts, "hit_rate", "mrr") == [3, 1, 1, 1, 1, 1, 0, 0]
    assert numbers(docs["D"], "completeness_mean", "hit_rate", "mrr") == pytest.approx(
        [0.2, 0.5, 0.25]
    )
    f = numbers(docs["F"], "questions", "pending", "n_judged", "completeness_mean", "hit_rate")
    assert f[:3] == [1, 1, 0] and math.isnan(f[3]) and f[4] == 1
    # A's diagnosis reads its graded questions, a1 to a3: completeness 0.5 and hit rate 2/3
    # (the hit rate of all five answers is 4/5)
    assert {doc: row["diagnosis"] for doc, row in docs.items()} == {
        "A": "retrieval",
        "B": "too much context",
        "=C": "generation",
        "D": "retrieval",
        "E": "ok",
        "F": "not judged",
    }
    assert overall["document"] == "ALL"
    design = ["document", "questions", "errors", "completeness_mean", "conciseness_mean"]
    design += ["hit_rate", "mrr", "ndcg", "map", "precision", "recall", "f1", "missed"]
    assert [name for name in overall if name in design] == design  # design.md's order
    assert numbers(overall, *counts, *ranks) == [14, 3, 3, 11, 8, 3, 5, 2, 1, 0, 0]
    figures = numbers(overall, "completeness_mean", "conciseness_mean", "hit_rate", "mrr")
    assert figures == pytest.approx([4.0 / 8, 5.8 / 8, 8 / 11, 19 / 33])
    assert "=C" in result.stdout and f"report: {run / 'report.html'}" in result.stderr


def test_the_written_document_name_is_escaped_again(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    text = (run / "summary_by_document.csv").read_text(encoding="utf-8")
    assert "\n'=C," in text and "\n=C," not in text


def test_confidence_intervals_bracket_the_mean(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    docs, overall, _ = summaries(run)
    for row in [*docs.values(), overall]:
        for name, mean in [("completeness", "completeness_mean"), ("hit_rate", "hit_rate")]:
            low, value, high = numbers(row, f"{name}_ci_low", mean, f"{name}_ci_high")
            assert math.isnan(value) or low <= value <= high
    # one judged question: every resample is that question, so the interval is a point
    assert numbers(docs["=C"], "completeness_ci_low", "completeness_ci_high") == [0.2, 0.2]
    # A's completeness is 1, 0.5 and 0: the interval is inside [0, 1] and not a point
    low, high = numbers(docs["A"], "completeness_ci_low", "completeness_ci_high")
    assert 0 <= low < 0.5 < high <= 1


def test_k_from_the_option_then_the_manifest(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    assert run_cli("stats", "--out", str(run), "--k", "8").exit_code == 0
    docs, _, _ = summaries(run)
    assert numbers(docs["B"], "hit_rate", "mrr", "missed", "rank_7") == pytest.approx(
        [1, 1 / 7, 0, 1]
    )
    (run / "manifest.json").write_text(json.dumps({"stages": {"answer": {"k": 2}}}))
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    docs, _, _ = summaries(run)
    # at k=2, A's rank 3 is a miss too: ranks 1, 2, miss, miss, 1
    assert numbers(docs["A"], "hit_rate", "missed", "rank_2") == pytest.approx([3 / 5, 2, 1])
    assert "rank_3" not in docs["A"]


def random_run(folder: Path) -> Path:
    """Four documents of 30 questions with random ranks and scores on a 0.1 grid."""
    rng = random.Random(7)
    ids = [f"q{i}" for i in range(120)]
    folder.mkdir()
    qa = [[qa_id, qa_id, f"doc{i % 4}", "?", "!", "ok", ""] for i, qa_id in enumerate(ids)]
    write_csv(folder / "qa_dataset.csv", QA_HEADER, qa)
    ranks = [rng.choice([1, 2, 3, ""]) for _ in ids]
    answers = [[qa_id, "a", "[]", rank, "ok", ""] for qa_id, rank in zip(ids, ranks, strict=True)]
    write_csv(folder / "answers.csv", ANSWER_HEADER, answers)
    scores = [[qa_id, rng.randint(0, 10) / 10, rng.randint(0, 10) / 10, "ok", ""] for qa_id in ids]
    write_csv(folder / "judgments.csv", JUDGE_HEADER, scores)
    return folder


def test_seeded_intervals_repeat_exactly(tmp_path: Path) -> None:
    run = random_run(tmp_path / "run")
    outputs = []
    for seed in ("0", "0", "1"):
        assert run_cli("stats", "--out", str(run), "--seed", seed).exit_code == 0
        outputs.append((run / "summary_by_document.csv").read_text())
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_later_stages_not_run_yet_leave_every_question_pending(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    (run / "answers.csv").unlink()
    (run / "judgments.csv").unlink()
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    _, overall, _ = summaries(run)
    assert numbers(overall, "questions", "errors", "pending", "n_answered") == [14, 1, 13, 0]
    assert overall["diagnosis"] == "not judged" and overall["hit_rate"] == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("missing", "qa_dataset.csv: not found; run the stage that writes it first"),
        ("no column", "qa_dataset.csv: lacks the column(s) document"),
        ("rank 0", "answers.csv: the row of qa_id 'a1' has status ok but a target_rank"),
        ("score 2", "judgments.csv: the row of qa_id 'a1' has status ok but no completeness"),
        ("text rank", "answers.csv, line 13: target_rank is 'first', not a number"),  # reversed
        ("repeated id", "qa_dataset.csv: repeats qa_id 'a1'"),
        ("nan score", "judgments.csv, line 2: completeness is 'nan', not a number"),
        ("torn", "answers.csv, line 14: ends inside a quoted field"),
        # a last line cut short, as a crash leaves it: pandas filled its cells with nothing
        ("cut judgments", "judgments.csv, line 11: has 3 fields where the header has 5"),
        ("cut answers", "answers.csv, line 13: has 3 fields where the header has 6"),
        ("folder", "judgments.csv: is a folder, not a CSV file"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, change: str, message: str) -> None:
    run = crafted_run(tmp_path / "run")
    qa = (run / "qa_dataset.csv").read_text()
    answers, judgments = run / "answers.csv", run / "judgments.csv"
    if change == "missing":
        (run / "qa_dataset.csv").unlink()
    elif change == "no column":
        (run / "qa_dataset.csv").write_text(qa.replace(",document,", ",source,"))
    elif change in ("rank 0", "text rank"):
        value = "0" if change == "rank 0" else "first"
        answers.write_text(
            answers.read_text().replace('a1,A a1,"[""chunk-a1""]",1,', f"a1,A a1,[],{value},")
        )
    elif change == "score 2":
        judgments.write_text(judgments.read_text().replace("a1,1.0,", "a1,2.0,"))
    elif change == "nan score":
        judgments.write_text(judgments.read_text().replace("a1,1.0,", "a1,nan,"))
    elif change.startswith("cut"):
        cut = judgments if change == "cut judgments" else answers
        lines = cut.read_text().splitlines(keepends=True)
        cut.write_text("".join(lines[:-1]) + ",".join(lines[-1].split(",")[:3]))
    elif change == "torn":  # a quoted field opened on the last line, never closed
        answers.write_text(answers.read_text() + 'zz,"A torn answer\n')
    elif change == "folder":
        judgments.unlink()
        judgments.mkdir()
    else:
        (run / "qa_dataset.csv").write_text(qa + "a1,c,A,q,t,ok,\n")
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


# -- the per-document bootstrap -------------------------------------------------------------------


def test_grouped_bootstrap_matches_the_normal_approximation() -> None:
    rng = np.random.default_rng(3)
    halves = np.repeat([0.0, 1.0], 50)  # mean 0.5, standard error sqrt(0.25 / 100) = 0.05
    uniform = rng.random(400)  # continuous: binned; standard error 1 / sqrt(12 * 400)
    groups = np.repeat([0, 1, 3], [100, 400, 7])
    values = np.concatenate([halves, uniform, np.full(7, 0.3)])
    low, high = grouped_bootstrap_ci(groups, values, 4, seed=0)
    assert low[0] == pytest.approx(0.5 - 1.96 * 0.05, abs=0.015)
    assert high[0] == pytest.approx(0.5 + 1.96 * 0.05, abs=0.015)
    error = 1 / math.sqrt(12 * 400)
    assert low[1] == pytest.approx(uniform.mean() - 1.96 * error, abs=0.005)
    assert high[1] == pytest.approx(uniform.mean() + 1.96 * error, abs=0.005)
    assert math.isnan(low[2]) and math.isnan(high[2])  # no values
    assert (low[3], high[3]) == (0.3, 0.3)  # one distinct value


def test_a_document_name_is_never_read_as_terminal_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # room for the name on one line
    run = tmp_path / "run"
    run.mkdir()
    write_csv(run / "qa_dataset.csv", QA_HEADER, [["q1", "c1", "[red]x[/red]", "?", "!", "ok", ""]])
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    assert "[red]x[/red]" in result.stdout


def test_a_huge_k_cuts_the_rank_distribution_not_precision(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    result = run_cli("stats", "--out", str(run), "--k", "10000")
    assert result.exit_code == 0, result.output
    assert "cutoff k=10000" in result.output
    said = " ".join(result.output.split())
    assert "--k 10000 is past every answer's retrieved chunks (7 at most)" in said  # not silent
    assert "the rank distribution stops at 7" in said
    by_document, overall, _ = summaries(run)
    # trec_eval's P@10000: e1's hit at rank 1 is one relevant chunk in 10,000 places
    assert math.isclose(float(by_document["E"]["precision"]), 1 / 10000)
    assert math.isclose(float(by_document["E"]["f1"]), 2 / (10000 + 1))
    assert overall["rank_7"] == "1" and "rank_8" not in overall  # b2, at the deepest rank
    assert (run / "report.html").is_file()


def test_answers_shorter_than_k_count_the_places_they_leave_empty(tmp_path: Path) -> None:
    """A RAG system that returns 2 chunks where answer's k was 4: precision is found/4, as
    trec_eval's P@4, and the distribution still goes to rank 4 (a k cut at the deepest rank
    retrieved made it found/2, and left rank_3, rank_4 and the cutoff 3 out)."""
    run = tmp_path / "run"
    run.mkdir()
    qa = [[qa_id, f"c-{qa_id}", "D", f"Q {qa_id}?", f"T {qa_id}", "ok", ""] for qa_id in "xy"]
    write_csv(run / "qa_dataset.csv", QA_HEADER, qa)
    answers = [
        ["x", "A x", json.dumps(["c-x", "c-other"]), 1, "ok", ""],
        ["y", "A y", json.dumps(["c-other", "c-more"]), "", "ok", ""],
    ]
    write_csv(run / "answers.csv", ANSWER_HEADER, answers)
    write_csv(run / "judgments.csv", JUDGE_HEADER, [[q, 1.0, 1.0, "ok", ""] for q in "xy"])
    (run / "manifest.json").write_text(json.dumps({"stages": {"answer": {"k": 4}}}))
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    assert "cutoff k=4" in result.output
    _, overall, _ = summaries(run)
    assert numbers(overall, "precision", "f1") == pytest.approx([1 / 4 / 2, 2 / 5 / 2])
    assert numbers(overall, "rank_1", "rank_2", "rank_3", "rank_4") == [1, 0, 0, 0]
    assert numbers(overall, "hit_rate_at_3", "recall_at_3") == [0.5, 0.5]


@pytest.mark.parametrize("status", [None, ""])
def test_an_exam_without_statuses_is_summarised_as_answer_and_judge_take_it(
    env: object, tmp_path: Path, status: str | None
) -> None:
    from support import exam, read_csv, write_dict_rows

    run = tmp_path / "run"
    exam(run, 4)
    rows = read_csv(run / "qa_dataset.csv")
    for row in rows:  # a hand-made exam: no status column, or an empty one
        row.pop("status")
        row.pop("error", None)
        if status is not None:
            row["status"] = status
    write_dict_rows(run / "qa_dataset.csv", rows)
    assert run_cli("judge", "--out", "run", "--controls", "0").exit_code == 0
    result = run_cli("stats", "--out", "run")
    assert result.exit_code == 0, result.output
    (overall,) = [row for row in read_csv(run / "summary.csv") if row["document"] == "ALL"]
    assert overall["questions"] == "4" and overall["errors"] == "0"
    assert overall["n_judged"] == "4"


def test_the_headline_counts_the_questions_its_hit_rate_is_over(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run")
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    _, overall, _ = summaries(run)
    assert overall["questions"] == "14"
    # by hand, from RANKS: 11 answered questions are scored (a4's answer failed, b1 failed in
    # the qa dataset, b3 has no answer), 8 of them hit within k=5 (a3 and d1 miss, b2's 7 is
    # past k): 73% of 11, not of the 14 questions
    said = " ".join(result.output.split())
    assert "the source chunk is retrieved for 73% of 11 questions" in said


def test_the_headline_of_a_run_whose_every_question_failed_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    qa = [[f"q{i}", f"c{i}", "doc", f"Q{i}?", f"T{i}", "ok", ""] for i in range(3)]
    write_csv(run / "qa_dataset.csv", QA_HEADER, qa)
    failed = [[f"q{i}", "", "", "", "error", "connection refused"] for i in range(3)]
    write_csv(run / "answers.csv", ANSWER_HEADER, failed)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert (
        "Every one of the 3 questions ended in error, in answer 3 (most often: connection "
        "refused)" in said
    )  # which stage, and why: it said only "the stage that failed"
    assert "run answer and judge" not in said and "nan" not in said


def test_the_report_says_why_questions_ended_in_error(tmp_path: Path) -> None:
    """It counted the errors and never showed a reason."""
    run = crafted_run(tmp_path / "run")
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    errors = page.split('id="errors"', 1)[1].split("</section>", 1)[0]
    assert "<b>generate</b>: 1 row in error; most often LLMError: 500 (1)" in errors
    assert "<b>answer</b>: 1 row in error; most often timeout (1)" in errors
    assert "<b>judge</b>: 1 row in error; most often invalid JSON (1)" in errors
    assert "With the control runs" not in page  # no control run: the thresholds read it
    clean = tmp_path / "clean"
    clean.mkdir()
    write_csv(clean / "qa_dataset.csv", QA_HEADER, [["q", "c", "D", "Q?", "T", "ok", ""]])
    assert run_cli("stats", "--out", str(clean)).exit_code == 0
    assert 'id="errors"' not in (clean / "report.html").read_text(encoding="utf-8")


def graded_run(folder: Path, grades: dict[str, tuple[str, int | str, float | None]]) -> Path:
    """A run of qa_id: (document, rank or "" for a miss, completeness or None for a judge
    error row); conciseness 1."""
    folder.mkdir(parents=True)
    qa = [[q, f"c-{q}", doc, f"Q {q}?", f"T {q}", "ok", ""] for q, (doc, _, _) in grades.items()]
    write_csv(folder / "qa_dataset.csv", QA_HEADER, qa)
    answers = [
        [q, f"A {q}", json.dumps([f"c-{q}"]), rank, "ok", ""] for q, (_, rank, _) in grades.items()
    ]
    write_csv(folder / "answers.csv", ANSWER_HEADER, answers)
    judged = [
        [q, "", "", "error", "invalid JSON"] if value is None else [q, value, 1.0, "ok", ""]
        for q, (_, _, value) in grades.items()
    ]
    write_csv(folder / "judgments.csv", JUDGE_HEADER, judged)
    return folder


def test_with_judge_errors_the_diagnosis_reads_grades_and_retrieval_of_the_same_questions(
    tmp_path: Path,
) -> None:
    # M's 4 answers missed their chunk and were graded 0.1; G's 14 hit, and their grades all
    # ended in error. The graded questions' hit rate is 0: retrieval, not generation (whose
    # reading paired M's grades with the hit rate of all 18, 78%).
    grades: dict[str, tuple[str, int | str, float | None]] = {
        f"m{i}": ("M", "", 0.1) for i in range(4)
    }
    grades |= {f"g{i}": ("G", 1, None) for i in range(14)}
    run = graded_run(tmp_path / "run", grades)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    by_document, overall, _ = summaries(run)
    assert (overall["diagnosis"], by_document["M"]["diagnosis"]) == ("retrieval", "retrieval")
    assert float(overall["hit_rate"]) == pytest.approx(14 / 18)  # still of every answer
    said = " ".join(result.output.split())
    assert "Answers are 10% complete (of the 4 graded; 14 in error: too few to read firmly)" in said
    assert "retrieve better first" in said


def test_a_mean_of_the_threshold_is_not_below_it(tmp_path: Path) -> None:
    # (1 + 1/3 + 1/3 + 2/3 + 2/3) / 5 is 0.6 written, 0.5999999999999999 as a float
    values = [1.0, 1 / 3, 1 / 3, 2 / 3, 2 / 3]
    grades: dict[str, tuple[str, int | str, float | None]] = {
        f"q{i}": ("D", 1, value) for i, value in enumerate(values)
    }
    run = graded_run(tmp_path / "run", grades)
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    by_document, overall, _ = summaries(run)
    assert by_document["D"]["completeness_mean"] == "0.6"
    assert by_document["D"]["diagnosis"] == overall["diagnosis"] == "ok"


def test_stats_on_a_folder_that_is_not_there_makes_none(tmp_path: Path) -> None:
    result = run_cli("stats", "--out", str(tmp_path / "typo"))
    assert result.exit_code == 2
    assert result.output.strip().endswith(
        "typo: is not a run folder; --out names the run to summarise"
    )
    assert not (tmp_path / "typo").exists()  # not even for its lock


def test_the_headlines_percent_says_what_the_figure_shown_says(tmp_path: Path) -> None:
    # 0.475 is shown 0.47 (its float is 0.47499...), and was said "48% complete" above it
    grades: dict[str, tuple[str, int | str, float | None]] = {
        "q0": ("D", 1, 0.45),
        "q1": ("D", 1, 0.5),
    }
    run = graded_run(tmp_path / "run", grades)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "Answers are 47% complete" in said and "0.47" in said and "48%" not in said


@pytest.mark.parametrize("columns", [80, 200])
def test_the_terminal_table_fits_and_never_cuts_a_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    """Thirty documents whose long names differ only in their middle: at 80 columns the hit
    rate 0.78 was cut to 0.7 and MRR left out unsaid, and every name read alike,
    '…er-provisioning-with-scim-v2.md'."""
    monkeypatch.setenv("COLUMNS", str(columns))
    run = tmp_path / "run"
    run.mkdir()
    tail = "-configuring-single-sign-on-and-user-provisioning-with-scim-v2.md"
    names = {f"q{i}": f"kb/admin/section-{i:02d}{tail}" for i in range(30)}
    qa = [[q, f"c{q}", name, f"Q {q}?", "T", "ok", ""] for q, name in names.items()]
    write_csv(run / "qa_dataset.csv", QA_HEADER, qa)
    ranks = {q: (1 if i % 9 else "") for i, q in enumerate(names)}  # a hit rate of 26/30
    answers = [[q, "A", json.dumps([f"c{q}"]), rank, "ok", ""] for q, rank in ranks.items()]
    write_csv(run / "answers.csv", ANSWER_HEADER, answers)
    write_csv(run / "judgments.csv", JUDGE_HEADER, [[q, 0.5, 0.25, "ok", ""] for q in names])
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), max(lines, key=len)
    header = next(line for line in lines if line.lstrip().startswith("document"))
    assert header.split()[-4:] == ["compl", "conc", "hit", "MRR"]
    (overall,) = [line for line in lines if line.lstrip().startswith("ALL")]
    assert overall.split()[-4:] == ["0.50", "0.25", f"{26 / 30:.2f}", f"{26 / 30:.2f}"]
    diagnoses = {"retrieval", "generation", "too", "ok", "not"}
    shown = [words[0] for words in map(str.split, lines) if words[1:2] and words[1] in diagnoses]
    assert len(shown) == 21 and len(set(shown)) == 21  # the 20 worst told apart, and ALL


def test_documents_that_need_work_say_what_to_try_when_the_whole_is_fine(
    tmp_path: Path,
) -> None:
    """Eight documents fine, two that never retrieve their chunk: the whole is ok (0.80), and
    the headline said "2 of 10 documents need work; nothing urgent"."""
    run = tmp_path / "run"
    run.mkdir()
    names = {f"q{d}{i}": f"doc{d}.md" for d in range(10) for i in range(10)}
    write_csv(
        run / "qa_dataset.csv",
        QA_HEADER,
        [[q, f"c{q}", n, "Q?", "T", "ok", ""] for q, n in names.items()],
    )
    bad = {"doc0.md", "doc1.md"}
    answers = [
        [q, "A", json.dumps([f"c{q}"]), "" if n in bad else 1, "ok", ""] for q, n in names.items()
    ]
    write_csv(run / "answers.csv", ANSWER_HEADER, answers)
    grades = [[q, 0.0 if n in bad else 1.0, 1.0, "ok", ""] for q, n in names.items()]
    write_csv(run / "judgments.csv", JUDGE_HEADER, grades)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    _, overall, _ = summaries(run)
    assert overall["diagnosis"] == "ok"
    said = " ".join(result.output.split())
    assert (
        "2 of 10 documents need work, worst doc0.md (retrieval, 0% complete); retrieve "
        "better first" in said
    )
    assert "nothing urgent" not in said


def test_perfect_answers_are_not_listed_among_the_worst(tmp_path: Path) -> None:
    """Two perfect answers made 'The 2 worst questions'; with one flawed, it alone is listed."""
    run = tmp_path / "run"
    run.mkdir()
    qa = [[q, f"c{q}", "D", f"Q {q}?", "T", "ok", ""] for q in ("p1", "p2", "w")]
    write_csv(run / "qa_dataset.csv", QA_HEADER, qa)
    answers = [[q, f"A {q}", json.dumps([f"c{q}"]), 1, "ok", ""] for q in ("p1", "p2", "w")]
    write_csv(run / "answers.csv", ANSWER_HEADER, answers)
    grades = [["p1", 1.0, 1.0, "ok", ""], ["p2", 1.0, 1.0, "ok", ""], ["w", 1.0, 0.5, "ok", ""]]
    write_csv(run / "judgments.csv", JUDGE_HEADER, grades)
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    worst = page.split('id="worst"', 1)[1].split("</section>", 1)[0]
    assert "The 1 worst questions" in worst and "Q w?" in worst
    assert "Q p1?" not in worst and "Q p2?" not in worst
    write_csv(
        run / "judgments.csv", JUDGE_HEADER, [[q, 1.0, 1.0, "ok", ""] for q in ("p1", "p2", "w")]
    )
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    worst = page.split('id="worst"', 1)[1].split("</section>", 1)[0]
    assert "Every answered question is graded complete and concise" in worst
    assert "Q p1?" not in worst


def test_a_headline_on_few_questions_says_they_are_few(tmp_path: Path) -> None:
    """Two perfect answers: "Answers are 100% complete" with tiles of 1.00, CI 1.00-1.00."""
    run = tmp_path / "run"
    run.mkdir()
    write_csv(
        run / "qa_dataset.csv", QA_HEADER, [[q, f"c{q}", "D", "Q?", "T", "ok", ""] for q in "xy"]
    )
    answers = [[q, "A", json.dumps([f"c{q}"]), 1, "ok", ""] for q in "xy"]
    write_csv(run / "answers.csv", ANSWER_HEADER, answers)
    write_csv(run / "judgments.csv", JUDGE_HEADER, [[q, 1.0, 1.0, "ok", ""] for q in "xy"])
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "Answers are 100% complete (2 graded: too few to read firmly)" in said
