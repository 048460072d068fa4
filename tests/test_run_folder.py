"""A run folder knows what it holds: one exam from one store, and the settings of its grades."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import build_store, docs, exam, read_csv, run_cli

import ragexam


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file of a folder with a hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def two_stores_and_an_exam_of_the_first(env: FakeOpenAI, tmp_path: Path) -> tuple[Path, Path]:
    """Two stores (collections 'handbook' and 'other'); the first's exam written into run/."""
    env.embedding_dim = 16
    first = build_store(tmp_path / "first", docs(4))
    second = build_store(tmp_path / "second", docs(5), collection="other")
    assert run_cli("generate", "--chroma", str(first), "--out", "run").exit_code == 0
    return first, second


def test_another_store_or_collection_is_refused_naming_both(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    first, second = two_stores_and_an_exam_of_the_first(env, tmp_path)
    before, calls = fingerprint(tmp_path / "run"), env.count()
    for stage in (("generate",), ("answer", "--embedding", "openai:e")):
        refused = run_cli(*stage, "--chroma", str(second), "--out", "run")
        assert refused.exit_code == 2, refused.output
        line = refused.output.strip().splitlines()[-1]
        assert line.startswith("Error: ") and str(first) in line and str(second) in line
        assert "'handbook'" in line and "'other'" in line and "--out" in line
    assert fingerprint(tmp_path / "run") == before and env.count() == calls
    # The same exam sat on the other store, from a folder of its own, is what the error advises.
    elsewhere = run_cli(
        "answer", "--chroma", str(second), "--out", "second-run", "--embedding", "openai:e",
        "--qa-dataset", str(tmp_path / "run" / "qa_dataset.csv"),
    )  # fmt: skip
    assert elsewhere.exit_code == 0, elsewhere.output


def test_a_manifest_edited_out_of_json_is_refused_not_rebuilt_to_take_another_store(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    _, second = two_stores_and_an_exam_of_the_first(env, tmp_path)
    manifest = tmp_path / "run" / "manifest.json"
    edited = manifest.read_text().replace('"collection": "handbook"', '"collection": "handbook",')
    assert edited != manifest.read_text()
    manifest.write_text(edited)  # a trailing comma: no longer JSON
    before, calls = fingerprint(tmp_path / "run"), env.count()
    for command in (("generate", "--chroma", str(second)), ("stats",)):
        refused = run_cli(*command, "--out", "run")
        assert refused.exit_code == 2, refused.output
        assert refused.output.startswith("Error: run/manifest.json: is not valid JSON (line ")
        assert refused.output.count("\n") == 1
    assert fingerprint(tmp_path / "run") == before and env.count() == calls


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [("--samples", "3", "samples"), ("--scale", "ten", "scale"), ("--temperature", "0.5", "temp")],
)
def test_a_changed_grading_setting_is_refused_by_name_then_redone_with_force(
    env: FakeOpenAI, tmp_path: Path, option: str, value: str, named: str
) -> None:
    exam(tmp_path / "run", 4)
    grade = ("judge", "--out", "run", "--controls", "0")
    assert run_cli(*grade).exit_code == 0
    calls = env.count()
    changed = run_cli(*grade, option, value)
    assert changed.exit_code == 2 and named in changed.output and "--force" in changed.output
    assert env.count() == calls  # refused before any call; nothing silently kept
    forced = run_cli(*grade, option, value, "--force")
    assert forced.exit_code == 0, forced.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    column = {"samples": "samples", "scale": "scale", "temp": "temperature"}[named]
    assert {row[column] for row in rows} == {value} and len(rows) == 4


def test_run_sits_an_existing_exam_without_writing_one(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(4))
    env.embedding_dim = 16
    assert run_cli("generate", "--chroma", str(store), "--out", "exam").exit_code == 0
    written = env.count()
    exam_file = tmp_path / "exam" / "qa_dataset.csv"
    result = run_cli(
        "run", "--chroma", str(store), "--out", "sat", "--qa-dataset", str(exam_file),
        "--embedding", "openai:e", "--controls", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "sat" / "qa_dataset.csv").exists()
    assert len(read_csv(tmp_path / "sat" / "judgments.csv")) == 4
    assert env.count() - written == 4 + 4  # four answers and four grades, no question written


def test_grades_from_before_temperature_was_recorded_are_kept(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 3)
    grade = ("judge", "--out", "run", "--controls", "0")
    assert run_cli(*grade).exit_code == 0
    path, calls = tmp_path / "run" / "judgments.csv", env.count()
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    older = [name for name in rows[0] if name != "temperature"]  # as an older version wrote it
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, older, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    again = run_cli(*grade)
    assert again.exit_code == 0 and env.count() == calls, again.output
    assert "judge: nothing to do (3 rows done before)" in again.output
    # Their temperature is the one the manifest recorded: a change is still refused by name,
    hotter = run_cli(*grade, "--temperature", "0.9")
    assert hotter.exit_code == 2 and "temperature" in hotter.output and env.count() == calls
    # and the same one, given as the API's int 0, is the same setting.
    same = ragexam.judge(out=tmp_path / "run", temperature=0, controls=0)
    assert same.figures["rows_done_before"] == 3 and env.count() == calls


def test_a_dry_run_refuses_and_counts_as_the_real_run_does(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 4)
    grade = ("judge", "--out", "run", "--controls", "0")
    assert run_cli(*grade).exit_code == 0
    calls = env.count()
    refused = run_cli(*grade, "--samples", "3", "--dry-run")
    assert refused.exit_code == 2 and "samples" in refused.output, refused.output
    forced = run_cli(*grade, "--samples", "3", "--dry-run", "--force")
    assert forced.exit_code == 0 and "4 rows to do, 12 calls" in forced.output, forced.output
    assert env.count() == calls


def test_run_with_an_exam_estimates_no_generate(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(6))
    assert (
        run_cli("generate", "--chroma", str(store), "--out", "exam", "--limit", "3").exit_code == 0
    )
    exam_file = str(tmp_path / "exam" / "qa_dataset.csv")
    dry = ragexam.run(store, out="sat", qa_dataset=exam_file, rag=my_rag, dry_run=True)
    stages = {estimate["stage"]: estimate["rows"] for estimate in dry.figures["estimates"]}
    assert "generate" not in stages and stages["answer"] == 3, stages


def my_rag(question: str) -> str:
    """A RAG system that answers without retrieving."""
    return "an answer"


def test_a_folder_of_an_older_version_made_with_a_relative_path_is_its_store(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    build_store(tmp_path / "db", docs(3))
    assert run_cli("generate", "--chroma", "db", "--out", "run").exit_code == 0
    manifest = tmp_path / "run" / "manifest.json"
    older = json.loads(manifest.read_text())
    del older["exam"]  # as versions before identities wrote it: the store as typed, in generate's
    older["stages"]["generate"]["store"] = "db"
    manifest.write_text(json.dumps(older))
    again = run_cli("generate", "--chroma", "db", "--out", "run")
    assert again.exit_code == 0, again.output
    other = build_store(tmp_path / "other", docs(3))
    assert run_cli("generate", "--chroma", str(other), "--out", "run").exit_code == 2
