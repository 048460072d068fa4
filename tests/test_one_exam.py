"""Runs compared on one exam: the exam is written the same way twice, and other exams are named."""

from __future__ import annotations

from pathlib import Path

from openai_server import FakeOpenAI
from support import BASE, build_store, docs, run_cli, write_run


def test_the_exam_is_written_at_temperature_0_unless_told_otherwise(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    assert run_cli("generate", "--chroma", str(store), "--out", "a").exit_code == 0
    assert {request.body.get("temperature") for request in env.requests} == {0}
    env.reset()
    told = run_cli("generate", "--chroma", str(store), "--out", "b", "--exam-temperature", "0.7")
    assert told.exit_code == 0, told.output
    assert {request.body.get("temperature") for request in env.requests} == {0.7}


def test_compare_says_when_the_runs_sat_different_exams(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", BASE)
    b = write_run(tmp_path / "b", {qa_id: score + 0.25 for qa_id, score in BASE.items()})
    exam = b / "qa_dataset.csv"
    lines = exam.read_text(encoding="utf-8").splitlines()
    lines[1:4] = [line.replace(",q,", ",another question,") for line in lines[1:4]]
    exam.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli("compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "3 of 24 paired questions differ in their question or ground truth" in said
    assert "--qa-dataset" in said
    gated = run_cli("compare", str(a), str(b), "--fail-on-regression")
    assert gated.exit_code == 2, gated.output
