"""Kinds of question in stats, the report and compare: single, multi-hop and unanswerable
apart, and together in the ALL row; unanswerable questions out of the retrieval means."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import exam_row, run_cli, write_dict_rows

from ragexam.io.csvfile import read_rows

SAYS_NOTHING = [{"statement": "The documents do not say.", "verdict": "supported"}]
MADE_UP = [{"statement": "It takes 5 days.", "verdict": "unsupported"}]
# qa_id: (document, kind, chunk_ids, target_ranks, completeness, conciseness, verdicts, statements)
QUESTIONS = {
    "s1": ("d1", "single", ["a"], [1], 1.0, 0.5, None, None),
    "s2": ("d1", "single", ["b"], [None], 0.0, 0.0, None, None),
    "m1": ("d1", "multi-hop", ["c", "d"], [2, None], 0.5, 1.0, None, None),
    "m2": ("d1", "multi-hop", ["e", "f"], [1, 3], 1.0, 1.0, None, None),
    "u1": ("d1", "unanswerable", [], [], 1.0, 1.0, ["present"], SAYS_NOTHING),
    "u2": ("d1", "unanswerable", [], [], 0.0, 0.0, ["absent"], MADE_UP),
    # No verdicts (a judge that grades by scores): completeness 0.6 declined, conciseness 0.4
    # says more than the decline.
    "u3": ("d2", "unanswerable", [], [], 0.6, 0.4, None, None),
}


def write_run(folder: Path, changed: dict[str, float] | None = None) -> Path:
    """The run of QUESTIONS, with some completeness changed."""
    qa, answers, judgments = [], [], []
    for qa_id, (
        document,
        kind,
        chunks,
        ranks,
        complete,
        concise,
        verdicts,
        said,
    ) in QUESTIONS.items():
        qa.append(exam_row(qa_id, document, kind, chunks, f"Q {qa_id}?"))
        found = [rank for rank in ranks if rank is not None]
        retrieved = json.dumps([f"x{i}" for i in range(5)])
        answers.append(
            {
                "qa_id": qa_id,
                "answer": "A",
                "retrieved_ids": retrieved,
                "target_rank": min(found, default=""),
                "target_ranks": json.dumps(ranks),
                "status": "ok",
                "error": "",
            }
        )
        judgments.append(
            {
                "qa_id": qa_id,
                "completeness": (changed or {}).get(qa_id, complete),
                "conciseness": concise,
                "key_point_verdicts": json.dumps(verdicts) if verdicts else "",
                "answer_statements": json.dumps(said) if said is not None else "",
                "status": "ok",
                "error": "",
            }
        )
    write_dict_rows(folder / "qa_dataset.csv", qa)
    write_dict_rows(folder / "answers.csv", answers)
    write_dict_rows(folder / "judgments.csv", judgments)
    return folder


def test_stats_shows_each_kind_apart_and_all_together(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    result = run_cli("stats", "--out", str(run), "--k", "5")
    assert result.exit_code == 0, result.output
    (overall,) = read_rows(run / "summary.csv", ["document"])
    figures = {name: float(value) for name, value in overall.items() if _number(value)}
    # Retrieval over s1, s2, m1 and m2 only. Hit: 1, 0, 1, 1. RR: 1, 0, 1/2, 1. Recall: 1, 0,
    # 1/2, 1. All found: 1, 0, 0, 1. AP: 1, 0, (1/2)/2, (1/1 + 2/3)/2. P@5: 1, 0, 1, 2 fifths.
    expected = {
        "questions": 7,
        "n_answered": 7,
        "n_ranked": 4,  # the answerable ones: the retrieval means' n
        "hit_rate": 0.75,
        "mrr": 2.5 / 4,
        "recall": 2.5 / 4,
        "all_found": 0.5,
        "map": (1 + 0.25 + 5 / 6) / 4,
        "precision": (1 + 0 + 1 + 2) / 5 / 4,
        "missed": 1,
        "completeness_mean": 4.1 / 7,  # every kind is graded
        "questions_single": 2,
        "questions_multi_hop": 2,
        "questions_unanswerable": 3,
        "n_judged_unanswerable": 3,
        "hit_rate_single": 0.5,
        "hit_rate_multi_hop": 1.0,
        "mrr_multi_hop": 0.75,
        "recall_multi_hop": 0.75,
        "all_found_multi_hop": 0.5,
        "completeness_mean_unanswerable": 1.6 / 3,
        "declined_unanswerable": 2 / 3,  # u1 by its verdict, u3 by its completeness
        "made_up_unanswerable": 2 / 3,  # u2 by its verdict, u3 by its conciseness
    }
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, abs=1e-12), name
    assert "hit_rate_unanswerable" not in overall
    by_kind = {row["kind"]: row for row in read_rows(run / "summary_by_kind.csv", ["kind"])}
    assert list(by_kind) == ["single", "multi-hop", "unanswerable", "ALL"]
    assert float(by_kind["multi-hop"]["recall"]) == pytest.approx(0.75)
    assert float(by_kind["unanswerable"]["declined"]) == pytest.approx(2 / 3)
    assert by_kind["unanswerable"]["hit_rate"] == ""  # no retrieval figure
    assert float(by_kind["ALL"]["hit_rate"]) == 0.75 and by_kind["ALL"]["questions"] == "7"
    assert float(by_kind["ALL"]["made_up"]) == pytest.approx(2 / 3)
    documents = {row["document"]: row for row in read_rows(run / "summary_by_document.csv", [])}
    assert documents["d2"]["hit_rate"] == ""  # only an unanswerable question: nothing retrieved
    assert float(documents["d2"]["declined_unanswerable"]) == 1.0
    assert "By kind of question" in result.output
    report = (run / "report.html").read_text(encoding="utf-8")
    assert "Questions by kind" in report and "<b>multi-hop</b>" in report
    # the worst questions: an unanswerable one has no source chunk, so none to miss
    made_up = report.split("Q u2?", 1)[1].split("</tr>", 1)[0]
    assert 'class="n">-</td>' in made_up and ">miss<" not in made_up
    missed = report.split("Q s2?", 1)[1].split("</tr>", 1)[0]
    assert ">miss<" in missed


def test_an_exam_of_single_questions_has_no_kind_figures(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    rows = [row for row in read_rows(run / "qa_dataset.csv", []) if row["kind"] == "single"]
    write_dict_rows(run / "qa_dataset.csv", rows)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    (overall,) = read_rows(run / "summary.csv", ["document"])
    assert "questions_single" not in overall and float(overall["hit_rate"]) == 0.5
    assert not (run / "summary_by_kind.csv").exists()  # the earlier one is gone: it was stale
    assert "Questions by kind" not in (run / "report.html").read_text(encoding="utf-8")


def test_a_multi_hop_answer_needs_a_rank_for_each_chunk(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    answers = read_rows(run / "answers.csv", [])
    for row in answers:
        if row["qa_id"] == "m2":
            row["target_ranks"] = "[1]"
    write_dict_rows(run / "answers.csv", answers)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 2
    assert "'m2' needs target_ranks: a JSON array of a rank or null for each" in result.output


def test_compare_shows_each_kind_apart(tmp_path: Path) -> None:
    run_a = write_run(tmp_path / "a")
    run_b = write_run(tmp_path / "b", {"m1": 1.0, "m2": 1.0, "u2": 1.0})
    result = run_cli("compare", str(run_a), str(run_b))
    assert result.exit_code == 0, result.output
    rows = {
        (row["document"], row["kind"], row["metric"]): row
        for row in read_rows(run_b / "comparison.csv", [])
    }
    assert float(rows["ALL", "all", "completeness"]["diff"]) == pytest.approx(1.5 / 7)
    assert float(rows["ALL", "multi-hop", "completeness"]["diff"]) == pytest.approx(0.25)
    assert float(rows["ALL", "unanswerable", "completeness"]["diff"]) == pytest.approx(1 / 3)
    assert float(rows["ALL", "single", "completeness"]["diff"]) == 0.0
    assert rows["ALL", "multi-hop", "hit"]["n"] == "2"
    assert ("ALL", "unanswerable", "hit") not in rows  # no retrieval to compare
    assert rows["d1", "all", "hit"]["n"] == "4"
    assert result.output.count("ALL ·") == 5 + 5 + 2  # the metrics of each kind


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def test_right_declines_do_not_make_a_document_look_wordy(tmp_path: Path) -> None:
    # A right answer to an unanswerable question declines, and a decline states nothing: its
    # conciseness is 0. Read in, d1 (answerable answers complete and concise) would be "too
    # much context"; the diagnosis is read from the answerable questions.
    declined = (1.0, 0.0, ["present"], [])
    runs = {
        "d1": [("single", 1.0, 1.0, None, None)] * 2 + [("unanswerable", *declined)] * 2,
        "d2": [("unanswerable", *declined)] * 2,  # only declines: ok
        "d3": [("unanswerable", 0.0, 0.0, ["absent"], MADE_UP)] * 2,  # only made up
        # its answerable question not graded yet: nothing to read, whatever its declines
        "d4": [("single", None, None, None, None), ("unanswerable", *declined)],
    }
    qa, answers, judgments = [], [], []
    for document, graded in runs.items():
        for n, (kind, complete, concise, verdicts, said) in enumerate(graded):
            qa_id = f"{document}-{n}"
            chunks, ranks = ([f"c-{qa_id}"], [1]) if kind == "single" else ([], [])
            qa.append(exam_row(qa_id, document, kind, chunks, f"Q {qa_id}?"))
            answers.append(
                {"qa_id": qa_id, "answer": "A", "retrieved_ids": json.dumps([f"c-{qa_id}"]),
                 "target_rank": min(ranks, default=""), "target_ranks": json.dumps(ranks),
                 "status": "ok", "error": ""}
            )  # fmt: skip
            if complete is None:  # pending: no judgment yet
                continue
            judgments.append(
                {"qa_id": qa_id, "completeness": complete, "conciseness": concise,
                 "key_point_verdicts": json.dumps(verdicts) if verdicts else "",
                 "answer_statements": json.dumps(said) if said is not None else "",
                 "status": "ok", "error": ""}
            )  # fmt: skip
    run = tmp_path / "run"
    write_dict_rows(run / "qa_dataset.csv", qa)
    write_dict_rows(run / "answers.csv", answers)
    write_dict_rows(run / "judgments.csv", judgments)
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    documents = {row["document"]: row for row in read_rows(run / "summary_by_document.csv", [])}
    assert float(documents["d1"]["conciseness_mean"]) == 1.0  # of its answerable questions
    assert documents["d1"]["diagnosis"] == "ok"
    assert documents["d2"]["diagnosis"] == "ok"
    assert documents["d3"]["diagnosis"] == "generation"  # it makes answers up
    assert documents["d4"]["diagnosis"] == "not judged"
    (overall,) = read_rows(run / "summary.csv", ["document"])
    assert overall["diagnosis"] == "ok"
    by_kind = {row["kind"]: row for row in read_rows(run / "summary_by_kind.csv", ["kind"])}
    assert by_kind["unanswerable"]["diagnosis"] == "ok"  # 4 of 6 declined, completeness 0.67
    assert "trim the context" not in result.output


def test_the_headline_says_what_is_pending_instead_of_nothing_urgent(tmp_path: Path) -> None:
    # A run killed mid-judge: two of seven graded. Their figures are fine, and the headline
    # said "nothing urgent", with five questions (a whole document) never graded.
    run = write_run(tmp_path / "run")
    judgments = read_rows(run / "judgments.csv", [])
    write_dict_rows(run / "judgments.csv", [row for row in judgments if row["qa_id"] in ("m2",)])
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "Answers are 100% complete (of the 1 graded; 6 pending: too few to read firmly)" in said
    assert "grade the 6 pending questions first: run answer and judge, then stats" in said
    assert "nothing urgent: look at" not in said


def test_a_question_of_no_kind_is_refused_before_answer_or_judge_pays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "multihop": answer and judge made their paid calls, and only stats refused it.
    run = write_run(tmp_path / "run")
    rows = read_rows(run / "qa_dataset.csv", [])
    rows[2]["kind"] = "multihop"
    write_dict_rows(run / "qa_dataset.csv", rows)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kind_rag.py").write_text("def answer(question):\n    return 'A', []\n")
    said = "has status ok but a kind that is none of single, multi-hop, unanswerable"
    for stage in (("answer", "--rag", "kind_rag:answer"), ("judge", "--controls", "0")):
        result = run_cli(*stage, "--out", str(run))
        assert result.exit_code == 2, result.output
        assert "qa_id 'm1'" in result.output and said in " ".join(result.output.split())


def test_the_made_up_share_names_the_graded_questions_it_is_of(tmp_path: Path) -> None:
    """u3's judgment failed: 1 of the 2 graded unanswerable questions got a made-up answer,
    which the headline said as "50% of 3" (3 asked), a share of no count it named."""
    run = write_run(tmp_path / "run")
    judgments = read_rows(run / "judgments.csv", [])
    failed = {"completeness": "", "conciseness": "", "status": "error", "error": "LLMError: 500"}
    rows = [row | failed if row["qa_id"] == "u3" else row for row in judgments]
    write_dict_rows(run / "judgments.csv", rows)
    result = run_cli("stats", "--out", str(run), "--k", "5")
    assert result.exit_code == 0, result.output
    (overall,) = read_rows(run / "summary.csv", ["document"])
    assert overall["n_judged_unanswerable"] == "2" and overall["questions_unanswerable"] == "3"
    assert float(overall["made_up_unanswerable"]) == 0.5
    said = " ".join(result.output.split())
    assert "50% of 2 graded unanswerable questions get made-up answers" in said


def test_the_scatter_places_a_document_by_the_grades_its_diagnosis_reads(
    tmp_path: Path,
) -> None:
    """d1's answerable questions average 0.625 and 0.625 (ok); its two unanswerable ones, a
    right decline (conciseness 1 here) and a made-up answer (0, 0), pull the means of all six
    to 0.58: the dot sat in the region of low completeness, coloured ok."""
    run = write_run(tmp_path / "run")
    result = run_cli("stats", "--out", str(run), "--k", "5")
    assert result.exit_code == 0, result.output
    documents = {row["document"]: row for row in read_rows(run / "summary_by_document.csv", [])}
    d1 = documents["d1"]
    assert d1["diagnosis"] == "ok"
    assert float(d1["completeness_answerable"]) == float(d1["conciseness_mean"]) == 0.625
    assert float(d1["completeness_mean"]) == pytest.approx(3.5 / 6)
    assert documents["d2"]["completeness_answerable"] == ""  # no answerable question
    report = (run / "report.html").read_text(encoding="utf-8")
    dot = "d1: completeness 0.62, conciseness 0.62 of the answerable questions, 6 questions, ok"
    assert dot in report
