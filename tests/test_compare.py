"""`ragexam compare` on crafted runs: known differences, exact p-values, manifest warnings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import BASE, rows, run_cli, write_run


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
