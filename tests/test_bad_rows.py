"""Broken CSVs: a broken input is a one-line error naming its line; a broken output row is
moved to FILE.bad-rows and every good row is kept."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
from openai_server import FakeOpenAI
from support import build_store, docs, questions, rag_module, read_csv, run_cli

HEADER = "qa_id,chunk_id,document,question,ground_truth_answer,status,error\n"
GOOD = "q0,c0,d,Q0?,g0,ok,\nq1,c1,d,Q1?,g1,ok,\n"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (GOOD + "q2,c2,d,What is the", "line 4: has 4 fields where the header has 7"),
        (GOOD + 'q2,c2,d,"What is,g2,ok,\nq3,c3,d,Q3?,g3,ok,\n', "line 4: ends inside a quoted"),
        (GOOD + "q2,c2,d,,g2,ok,\n", "line 4: the question is empty"),
        (GOOD + "q2,c2,d,Q2?,,ok,\n", "line 4: the ground_truth_answer is empty"),
        (GOOD + "q1,c2,d,Q2?,g2,ok,\n", "line 4: qa_id 'q1' appears twice"),
        (GOOD + "q2,c2,d,Q2?,g2,ok,,extra\n", "line 4: has 8 fields where the header has 7"),
    ],
)
def test_a_broken_qa_dataset_is_an_error_naming_its_line(
    env: FakeOpenAI, tmp_path: Path, body: str, problem: str
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "qa_dataset.csv").write_text(HEADER + body, encoding="utf-8")
    rag = rag_module(tmp_path, "plain_rag", "An answer.")
    for command in (["answer", "--rag", rag], ["judge"]):
        result = run_cli(*command, "--out", "run")
        assert result.exit_code == 2, result.output
        assert result.output.startswith(f"Error: run/qa_dataset.csv, {problem}")
        assert result.output.count("\n") == 1
    assert env.count() == 0 and not (tmp_path / "run" / "answers.csv").exists()


def test_a_latin1_byte_in_an_input_names_its_line(env: FakeOpenAI, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    data = (HEADER + GOOD + "q2,c2,d,Caf\xe9?,g2,ok,\n").encode("latin-1")
    (tmp_path / "run" / "qa_dataset.csv").write_bytes(data)
    result = run_cli("answer", "--rag", rag_module(tmp_path, "l1_rag", "A."), "--out", "run")
    assert result.exit_code == 2
    assert result.output.startswith("Error: run/qa_dataset.csv, line 4: is not UTF-8 text")


def test_an_unreadable_output_row_is_moved_aside_and_every_good_row_kept(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(10))
    args = ["generate", "--chroma", str(store), "--out", "run"]
    assert run_cli(*args).exit_code == 0
    output = tmp_path / "run" / "qa_dataset.csv"
    lines = output.read_bytes().split(b"\n")
    damaged = lines[3].replace(b"question", b"qu\xe9stion", 1)  # a Latin-1 byte in row 3
    assert damaged != lines[3]
    lines[3] = damaged
    output.write_bytes(b"\n".join(lines))
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    bad = tmp_path / "run" / "qa_dataset.csv.bad-rows"
    assert f"1 unreadable rows moved to {Path('run', 'qa_dataset.csv.bad-rows')}" in result.output
    note = b"# line 4: is not UTF-8 text (save the file as UTF-8)\n"
    assert bad.read_bytes() == note + damaged + b"\n"
    rows = read_csv(output)
    assert len(rows) == 10 and {row["status"] for row in rows} == {"ok"}
    assert env.count() == 11  # only the unreadable row was asked again


def test_an_extra_field_in_answers_loses_only_that_row(env: FakeOpenAI, tmp_path: Path) -> None:
    questions(tmp_path / "run", 12)
    args = ["answer", "--out", "run", "--rag", rag_module(tmp_path, "x_rag", "An answer.")]
    assert run_cli(*args).exit_code == 0
    output = tmp_path / "run" / "answers.csv"
    lines = output.read_text(encoding="utf-8").split("\n")
    lines[10] += ",extra"  # row 10
    output.write_text("\n".join(lines), encoding="utf-8")
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert "1 unreadable rows moved to" in result.output and "(11 done before)" in result.output
    bad = (tmp_path / "run" / "answers.csv.bad-rows").read_text(encoding="utf-8")
    assert bad.startswith("# line 11: has ") and lines[10] in bad
    assert len(read_csv(output)) == 12


def without_column(path: Path, name: str) -> bytes:
    """Take a column out of a CSV, as a spreadsheet edit would; the bytes written."""
    rows = read_csv(path)
    columns = [column for column in rows[0] if column != name]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("stage", "file", "column"),
    [
        ("generate", "qa_dataset.csv", "question"),
        ("answer", "answers.csv", "answer"),
        ("judge", "judgments.csv", "completeness"),
        # every row would read as not ok: each paid for again, the grades dropped unsaid
        ("judge", "judgments.csv", "status"),
        ("answer", "answers.csv", "status"),
    ],
)
def test_an_output_that_lost_a_value_column_is_refused_not_resumed_empty(
    env: FakeOpenAI, tmp_path: Path, stage: str, file: str, column: str
) -> None:
    # Resumed, its ok rows would be values left empty: "nothing to do", and the next stage
    # would grade blank answers over the good grades.
    store = build_store(tmp_path / "store", docs(4))
    env.embedding_dim = 16  # the store's
    common = ("--out", "run", "--embedding", "openai:fake-embed")
    first = run_cli("run", "--chroma", str(store), *common, "--controls", "0")
    assert first.exit_code == 0, first.output
    kept = without_column(tmp_path / "run" / file, column)
    grades = (tmp_path / "run" / "judgments.csv").read_bytes()
    calls = env.count()
    reads = ("--chroma", str(store), "--embedding", "openai:fake-embed")
    result = run_cli(stage, "--out", "run", *(("--controls", "0") if stage == "judge" else reads))
    assert result.exit_code == 2, result.output
    assert f"run/{file}: line 1: lacks the column(s) {column}" in result.output
    assert result.output.count("\n") == 1
    assert (tmp_path / "run" / file).read_bytes() == kept and env.count() == calls
    if stage != "judge":
        assert (tmp_path / "run" / "judgments.csv").read_bytes() == grades


def test_a_folder_where_an_output_csv_goes_is_a_one_line_error(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "qa_dataset.csv").write_text(HEADER + GOOD, encoding="utf-8")
    (tmp_path / "run" / "answers.csv").mkdir()
    result = run_cli("answer", "--rag", rag_module(tmp_path, "dir_rag", "A."), "--out", "run")
    assert result.exit_code == 2, result.output
    assert result.output == "Error: run/answers.csv: is a folder, not a CSV file; move it away\n"
    assert env.count() == 0
    compared = run_cli("compare", "run", "run/qa_dataset.csv")
    assert compared.exit_code == 2, compared.output
    assert "run/qa_dataset.csv: is a file, not a run folder" in compared.output
    assert compared.output.count("\n") == 1


def test_a_lone_carriage_return_in_a_cell_is_written_quoted_and_read_back_whole(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    """The csv writer leaves a cell holding a lone "\\r" unquoted (its line end is "\\n"), and
    every reader takes that "\\r" for a line end: the row was cut in two, and moved aside
    as unreadable when the stage resumed."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "qa_dataset.csv").write_text(HEADER + GOOD, encoding="utf-8")
    rag = rag_module(tmp_path, "old_mac_rag", "Line one\rline two.\r")
    assert run_cli("answer", "--rag", rag, "--out", "run").exit_code == 0
    again = run_cli("answer", "--rag", rag, "--out", "run")
    assert again.exit_code == 0, again.output
    answers = tmp_path / "run" / "answers.csv"
    assert not answers.with_name("answers.csv.bad-rows").exists()
    with answers.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["answer"] for row in rows] == ["Line one\rline two.\r"] * 2
    assert len(pd.read_csv(answers)) == 2  # and a spreadsheet's, pandas', reader agrees
