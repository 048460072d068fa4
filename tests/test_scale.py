"""What keeps ragexam fast at scale: resume cost, connections per call in flight, import cost."""

from __future__ import annotations

from pathlib import Path

from conftest import read_csv, run_cli
from openai_server import FakeOpenAI, Faults
from test_judge import exam


def test_resuming_a_file_of_ok_rows_appends_to_it_in_place(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 30)
    output = tmp_path / "run" / "judgments.csv"
    assert run_cli("judge", "--out", "run", "--limit", "10").exit_code == 0
    first, written = output.stat().st_ino, output.read_bytes()
    assert run_cli("judge", "--out", "run").exit_code == 0
    # the same file, its first ten rows byte for byte, and twenty rows appended after them
    assert output.stat().st_ino == first and output.read_bytes().startswith(written)
    assert len(read_csv(output)) == 30 and env.count() == 30


def test_an_error_row_to_drop_rewrites_the_file(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 20)
    output = tmp_path / "run" / "judgments.csv"
    env.faults = Faults(status_if=lambda text: 400 if "Question #4?" in text else None)
    assert run_cli("judge", "--out", "run").exit_code == 0  # 1 error in 20 is the 5% allowed
    assert [row["qa_id"] for row in read_csv(output) if row["status"] == "error"] == ["q4"]
    first = output.stat().st_ino
    env.faults = Faults()
    assert run_cli("judge", "--out", "run").exit_code == 0
    rows = read_csv(output)
    assert output.stat().st_ino != first  # rewritten, without the error row
    assert len(rows) == 20 and {row["status"] for row in rows} == {"ok"}
    assert env.count() == 21
