"""A stage with nothing to do writes its file and says why; an exam of no question is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_server import FakeOpenAI, Faults
from support import build_store, docs, read_csv, run_cli, write_qa


def test_a_run_whose_every_question_failed_writes_every_file_and_says_why(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(5))
    env.embedding_dim = 16
    env.faults = Faults(rate_malformed=1.0, max_faults_per_body=1000)  # every exam call fails
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    args = ("--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    result = run_cli("run", *args, "--max-error-rate", "1", "--controls", "0")
    assert result.exit_code == 0, result.output
    exam = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(exam) == 5 and {row["status"] for row in exam} == {"error"}
    assert read_csv(tmp_path / "run" / "answers.csv") == []
    assert read_csv(tmp_path / "run" / "judgments.csv") == []
    said = " ".join(result.output.split())
    assert "5 questions skipped: they are errors in the qa dataset" in said
    assert "not found" not in said
    assert (tmp_path / "run" / "summary.csv").is_file()


def test_an_exam_of_only_its_header_is_no_questions_not_a_missing_file(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(5))
    write_qa(tmp_path / "run" / "qa_dataset.csv", [])
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code == 2, result.output
    assert "holds no questions" in result.output and "not found" not in result.output
    assert env.count() == 0
