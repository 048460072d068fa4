"""`ragexam compare` on crafted runs: known differences, exact p-values, manifest warnings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import (
    ANSWER_HEADER,
    BASE,
    JUDGE_HEADER,
    QA_HEADER,
    rows,
    run_cli,
    write_csv,
    write_run,
)


def figures(row: dict[str, str]) -> list[float]:
    names = ("mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_value")
    return [float(row[name]) for name in names]


def counts(row: dict[str, str]) -> list[int]:
    return [int(row[name]) for name in ("improved", "worse", "same", "n")]


def test_a_document_that_improved_by_a_known_amount(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", BASE, extra="a-only")
    better = {qa_id: score + 0.5 if qa_id[0] == "a" else score for qa_id, score in BASE.items()}
    b = write_run(tmp_path / "b", better | {"b11": None})  # b11's judgment failed in run B
    result = run_cli("compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    table = rows(b / "comparison.csv")
    mean_a = sum(BASE[f"a{i}"] for i in range(12)) / 12  # 0.25
    # every question of doc A gained exactly 0.5: the CI is that point, and all 2^12 sign
    # patterns but the two extremes give a smaller |sum|, so p = 2 / 4096
    assert figures(table["doc A", "completeness"]) == [
        mean_a,
        mean_a + 0.5,
        0.5,
        0.5,
        0.5,
        2 / 4096,
    ]
    assert counts(table["doc A", "completeness"]) == [12, 0, 0, 12]
    assert figures(table["doc B", "completeness"])[2:] == [0, 0, 0, 1]
    assert counts(table["doc B", "completeness"]) == [0, 0, 11, 11]  # b11 pairs in neither
    overall = figures(table["ALL", "completeness"])
    assert overall[2] == pytest.approx(12 * 0.5 / 23) and overall[5] == 2 / 4096
    assert overall[3] < overall[2] < overall[4]
    assert counts(table["ALL", "completeness"]) == [12, 0, 11, 23]
    for metric in ("conciseness", "hit", "rr", "ndcg"):
        assert figures(table["ALL", metric])[2:] == [0, 0, 0, 1]
    assert "questions in only one of the runs are left out: 1" in result.stderr
    assert f"comparison: {b / 'comparison.csv'}" in result.stderr


def test_identical_runs_differ_by_nothing(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", BASE)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    out = tmp_path / "out"
    result = run_cli("compare", str(a), str(b), "--out", str(out))
    assert result.exit_code == 0, result.output
    table = rows(out / "comparison.csv")
    assert {document for document, _ in table} == {"ALL", "doc A", "doc B"}
    for row in table.values():
        assert figures(row)[2:] == [0, 0, 0, 1]
        assert row["improved"] == row["worse"] == "0" and row["same"] == row["n"]
    assert "no manifest.json in" in result.stderr


def manifest(folder: Path, model: str, prompt: str, collection: str) -> None:
    stages = {
        "generate": {"model": model, "prompt": {"generate": prompt}, "collection": collection},
        "answer": {"model": "m", "k": 5},
        "judge": {"model": "judge-1", "prompt": {"judge": "j1"}},
    }
    (folder / "manifest.json").write_text(json.dumps({"stages": stages}))


def test_warns_when_the_exams_differ(tmp_path: Path) -> None:
    a, b = write_run(tmp_path / "a", BASE), write_run(tmp_path / "b", BASE)
    manifest(a, "gpt-4o-mini", "abc", "handbook")
    manifest(b, "gpt-4o", "def", "handbook-v2")
    result = run_cli("compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert warnings == [
        "Warning: the runs differ in generate model: 'gpt-4o-mini' (A) and 'gpt-4o' (B)",
        "Warning: the runs differ in generate prompt hash: {'generate': 'abc'} (A) and "
        "{'generate': 'def'} (B)",
        "Warning: the runs differ in generate collection: 'handbook' (A) and 'handbook-v2' (B)",
    ]
    manifest(b, "gpt-4o-mini", "abc", "handbook")
    assert "Warning" not in run_cli("compare", str(a), str(b)).stderr


def test_runs_of_different_exams_are_refused(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", BASE)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    for name in ("qa_dataset.csv", "answers.csv", "judgments.csv"):
        path = b / name
        path.write_text(path.read_text().replace("\na", "\nz").replace("\nb", "\ny"))
    result = run_cli("compare", str(a), str(b))
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and "shares no qa_id with" in result.stderr


def test_a_large_document_is_compared_with_sampled_signs(tmp_path: Path) -> None:
    # 25 questions of doc C all gain 0.25: only 2 of 2^25 sign patterns reach that sum, so none
    # of the 10,000 sampled ones does and p is its floor, 1 / 10001
    extra = [f"c{i}" for i in range(25)]
    base = BASE | dict.fromkeys(extra, 0.5)
    a = write_run(tmp_path / "a", base)
    b = write_run(tmp_path / "b", base | dict.fromkeys(extra, 0.75))
    for run in (a, b):  # write_run lists the questions of IDS only: add doc C's
        for name, row in (
            ("qa_dataset.csv", "{0},c-{0},doc C,q,t,ok,\n"),
            ("answers.csv", "{0},x,[],1,ok,\n"),
        ):
            with (run / name).open("a") as handle:
                handle.writelines(row.format(qa_id) for qa_id in extra)
    result = run_cli("compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    table = rows(b / "comparison.csv")
    assert figures(table["doc C", "completeness"]) == [0.5, 0.75, 0.25, 0.25, 0.25, 1 / 10001]
    assert counts(table["doc C", "completeness"]) == [25, 0, 0, 25]
    assert figures(table["doc A", "completeness"])[2:] == [0, 0, 0, 1]


def forty(folder: Path, grades: dict[int, float | None]) -> Path:
    """A run of 40 questions in one document, each retrieved at rank 1, graded 0.75 but for
    `grades` (None: a judge error row)."""
    folder.mkdir()
    ids = [f"q{i}" for i in range(40)]
    qa = [[qa_id, f"c-{qa_id}", "doc", f"Q {qa_id}?", f"T {qa_id}", "ok", ""] for qa_id in ids]
    write_csv(folder / "qa_dataset.csv", QA_HEADER, qa)
    answers = [[qa_id, "A", json.dumps([f"c-{qa_id}"]), 1, "ok", ""] for qa_id in ids]
    write_csv(folder / "answers.csv", ANSWER_HEADER, answers)
    judged = []
    for i, qa_id in enumerate(ids):
        grade = grades.get(i, 0.75)
        error = [qa_id, "", "", "error", "invalid JSON"]
        judged.append(error if grade is None else [qa_id, grade, 1.0, "ok", ""])
    write_csv(folder / "judgments.csv", JUDGE_HEADER, judged)
    return folder


def test_the_gate_fails_only_on_a_regression_its_p_value_calls_significant(
    tmp_path: Path,
) -> None:
    # 4 of 40 answers lose two thirds of their grade: the bootstrap CI lies below zero, but
    # the randomisation test gives p = 0.125, printed beside it; the gate fired on the CI alone
    a = forty(tmp_path / "a", {})
    b = forty(tmp_path / "b", dict.fromkeys(range(4), 0.08))
    shown = run_cli("compare", str(a), str(b), "--fail-on-regression")
    assert shown.exit_code == 0, shown.output
    row = rows(b / "comparison.csv")[("ALL", "completeness")]
    assert float(row["ci_high"]) < 0 and float(row["p_value"]) == pytest.approx(0.125)
    # 10 of 40: both say so, and the gate names the CI and the p-value
    worse = forty(tmp_path / "worse", dict.fromkeys(range(10), 0.08))
    failed = run_cli("compare", str(a), str(worse), "--fail-on-regression")
    assert failed.exit_code == 3, failed.output
    assert "completeness -0.168 (95% CI" in failed.output and ", p = 0.00" in failed.output


def test_the_gate_refuses_a_comparison_that_measured_nothing(tmp_path: Path) -> None:
    # B's judge failed on every question: no grade in both runs, nothing measured, and the
    # gate passed (exit 0) with a warning
    a = forty(tmp_path / "a", {})
    b = forty(tmp_path / "b", dict.fromkeys(range(40)))
    result = run_cli("compare", str(a), str(b), "--fail-on-regression")
    assert result.exit_code == 2, result.output
    assert (
        "--fail-on-regression: completeness, conciseness have no question with a value in "
        "both runs (graded, or answered, in each): a regression cannot be measured"
    ) in " ".join(result.output.split())
    assert run_cli("compare", str(a), str(b)).exit_code == 0  # no gate: the table is written


def test_questions_graded_in_one_run_alone_are_said_to_be_left_out(tmp_path: Path) -> None:
    # B's judge failed on the 4 questions that got worse: the comparison pairs 36, sees no
    # change, and once said nothing of the 4
    a = forty(tmp_path / "a", {})
    b = forty(tmp_path / "b", dict.fromkeys(range(4)))
    result = run_cli("compare", str(a), str(b), "--fail-on-regression")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert (
        "completeness, conciseness are compared on 36 of 40 paired questions: 4 graded in A "
        "alone and 0 in B alone (error rows or pending) are left out"
    ) in said
    assert "hit, rr, ndcg are compared" not in said  # every question answered in both


def test_a_k_one_run_did_not_record_is_not_said_to_differ(tmp_path: Path) -> None:
    a, b = forty(tmp_path / "a", {}), forty(tmp_path / "b", {})
    answer = {"stages": {"answer": {"k": 3}, "judge": {"model": "m"}}}
    (a / "manifest.json").write_text(json.dumps(answer))
    (b / "manifest.json").write_text(json.dumps({"stages": {"judge": {"model": "m"}}}))
    unknown = run_cli("compare", str(a), str(b))
    assert unknown.exit_code == 0 and "different k" not in unknown.output  # B's is not 5
    (b / "manifest.json").write_text(json.dumps({"stages": {"answer": {"k": 5}}}))
    known = run_cli("compare", str(a), str(b))
    assert "the runs retrieved different k: 3 (A) and 5 (B)" in " ".join(known.output.split())
