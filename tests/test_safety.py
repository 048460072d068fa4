"""Bad input fails fast and touches nothing; keys never leak; a killed run resumes exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import chromadb
import pytest
from chromadb.api.client import SharedSystemClient
from openai_server import FakeOpenAI, Recorded
from support import build_store, docs, hashes, kill_midway, read_csv, run_cli, snapshot

PLANTED = "sk-planted-4f9c2e7a1b3d5f6e8a9b0c1d2e3f4a5b"


def one_line(output: str) -> str:
    """The whole output is exactly one line, the error."""
    assert output.startswith("Error: ") and output.count("\n") == 1, repr(output)
    return output


def test_missing_store_is_not_created(env: FakeOpenAI, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    result = run_cli("generate", "--chroma", str(missing), "--out", "run")
    assert result.exit_code == 2
    assert "no Chroma store" in one_line(result.output)
    assert not missing.exists()
    assert env.count() == 0


@pytest.mark.parametrize("where", [[], ["--chroma", "store", "--chroma-url", "http://x"]])
def test_the_store_must_be_named_once(env: FakeOpenAI, where: list[str]) -> None:
    for command in ("generate", "answer", "run"):
        result = run_cli(command, *where)
        assert result.exit_code == 2
        assert "exactly one of --chroma PATH and --chroma-url URL" in one_line(result.output)
    assert env.requests == []


def test_wrong_collection_names_the_ones_there(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(5))
    before = snapshot(store)
    result = run_cli("generate", "--chroma", str(store), "--collection", "nope", "--out", "run")
    assert result.exit_code == 2
    assert "'nope'" in one_line(result.output) and "handbook" in result.output
    assert snapshot(store) == before
    assert env.count() == 0


def test_empty_collection(env: FakeOpenAI, tmp_path: Path) -> None:
    store = tmp_path / "store"
    chromadb.PersistentClient(path=str(store)).create_collection("empty")
    SharedSystemClient.clear_system_cache()
    before = snapshot(store)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2
    assert "empty" in one_line(result.output)
    assert snapshot(store) == before == {"empty": ([], [], [], [])}
    assert env.count() == 0


@pytest.mark.parametrize("named", [[], ["--collection", "docs"]])
def test_a_store_of_no_collection_says_so(
    env: FakeOpenAI, tmp_path: Path, named: list[str]
) -> None:
    # It said "holds 0 collections (none): choose one with --collection".
    store = tmp_path / "store"
    client = chromadb.PersistentClient(path=str(store))
    client.delete_collection(client.create_collection("gone").name)
    SharedSystemClient.clear_system_cache()
    before = snapshot(store)
    result = run_cli("generate", "--chroma", str(store), "--out", "run", *named)
    assert result.exit_code == 2
    assert one_line(result.output) == (
        f"Error: {store} holds no collection: is it the store your chunks were loaded into?\n"
    )
    assert snapshot(store) == before == {} and env.count() == 0


def test_several_collections_need_a_name(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(3))
    build_store(store, docs(3, "Other"), collection="second")
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2
    assert "--collection" in one_line(result.output) and "second" in result.output
    assert env.count() == 0


def test_no_api_key_with_the_default_endpoint(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(5))
    before = snapshot(store)
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in one_line(result.output)
    assert snapshot(store) == before
    assert env.count() == 0


def test_a_local_server_needs_no_key(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    monkeypatch.delenv("OPENAI_API_KEY")
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    assert env.count() == 3


def test_a_refused_key_stops_the_run_and_leaks_nowhere(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(50))
    env.api_key = "sk-the-right-one"  # the server echoes a wrong key back in its 401 message
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--concurrency", "2")
    assert result.exit_code == 4  # the endpoint refused the key
    assert "refused the API key" in result.output
    assert env.count() < 10  # stopped early, not 50 calls of 401s
    assert any(PLANTED in str(r.body) or PLANTED in str(r.headers) for r in env.requests)
    written = [path.read_text() for path in (tmp_path / "run").iterdir()]
    assert written and not [text for text in written if PLANTED in text]
    assert PLANTED not in result.output
    assert "***" in "".join(written)  # the reason was kept, with the key masked


def test_a_planted_key_is_in_no_output_of_a_good_run(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(5))
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.setenv("OPENAI_BASE_URL", env.base_url.replace("://", "://user:hunter2@"))
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    for path in (tmp_path / "run").iterdir():
        text = path.read_text()
        assert PLANTED not in text and "hunter2" not in text, path
    assert '"openai_api_key": "set"' in (tmp_path / "run" / "manifest.json").read_text()


@pytest.mark.slow
def test_sigkill_midway_then_rerun_loses_nothing_and_repeats_little(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(120))
    env.latency = 0.1
    concurrency = 8
    args = ["generate", "--chroma", str(store), "--out", "run", "--concurrency", str(concurrency)]
    output = tmp_path / "run" / "qa_dataset.csv"
    temporary = tmp_path / "tmp"  # where the snapshots of the store go
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    kill_midway(args, output, 60)
    first_run = _chunks_asked(env.requests)
    survived = {row["chunk_id"] for row in read_csv(output)}  # also repairs a torn tail
    assert 30 < len(survived) < 120
    (left,) = temporary.glob("ragexam-store-*")  # the killed process could not remove it
    namespace = str(Path("/proc/self/ns/pid").readlink())[5:-1]  # pid:[NUMBER]
    alive = temporary / f"ragexam-store-{os.getpid()}-{namespace}-x"  # a running one's: kept
    dead = left.name.split("-")[2]  # the killed process's number ...
    elsewhere = temporary / f"ragexam-store-{dead}-1-x"  # ... in another container's: kept
    for kept in (alive, elsewhere):
        kept.mkdir()

    env.latency = 0.0
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert sorted(temporary.iterdir()) == sorted([alive, elsewhere])  # the dead one's: swept
    rows = read_csv(output)
    assert sorted(row["chunk_id"] for row in rows) == sorted(f"chunk-{i:04d}" for i in range(120))
    assert {row["status"] for row in rows} == {"ok"}
    second_run = _chunks_asked(env.requests)[len(first_run) :]
    assert not survived & set(second_run)  # finished rows were not asked again
    assert len(set(first_run) & set(second_run)) <= concurrency  # only the in-flight ones


def _chunks_asked(requests: list[Recorded]) -> list[str]:
    """The chunk of every request that arrived whole (SIGKILL can cut one off mid-body)."""
    return [_chunk_of(r.body) for r in requests if isinstance(r.body, dict)]


def _chunk_of(body: dict[str, object]) -> str:
    text = str(body["messages"])
    return f"chunk-{int(text.split('widget ', 1)[1].split(' ', 1)[0]):04d}"


@pytest.mark.slow
def test_ctrl_c_keeps_every_finished_row_and_says_so(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(100))
    env.latency = 0.05
    args = ["generate", "--chroma", str(store), "--out", "run", "--concurrency", "2"]
    output = tmp_path / "run" / "qa_dataset.csv"
    process = subprocess.Popen(
        [sys.executable, "-m", "ragexam.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        not output.exists() or output.read_bytes().count(b"\n") < 20
    ):
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "Interrupted: every finished row is saved" in stderr
    rows = read_csv(output)
    assert 19 <= len(rows) < 100 and {row["status"] for row in rows} == {"ok"}
    # which stage stopped, and what it had written: the rows the file holds (the last one
    # may be written as the signal lands, before it is counted)
    said = re.search(r"generate stopped: (\d+) rows? written this run", stderr)
    assert said is not None and len(rows) - 1 <= int(said.group(1)) <= len(rows), stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    record = manifest["stages"]["generate"]
    assert record["status"] == "interrupted" and record["rows_ok"] == len(rows)
    assert record["calls"] - len(rows) <= 2  # only the calls in flight were lost
    env.latency = 0.0
    assert run_cli(*args).exit_code == 0
    assert len(read_csv(output)) == 100


def _dump_without_chroma_bookkeeping(path: Path) -> list[str]:
    """The store's SQL, read without Chroma (which would migrate it), less its lock table."""
    with sqlite3.connect(f"file:{path / 'chroma.sqlite3'}?mode=ro", uri=True) as db:
        return [line for line in db.iterdump() if "acquire_write" not in line]


def test_an_older_store_is_refused_not_migrated(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(5))
    with sqlite3.connect(store / "chroma.sqlite3") as db:  # look like an older Chroma's store
        newest = db.execute("SELECT max(version) FROM migrations WHERE dir = 'sysdb'").fetchone()
        db.execute("DELETE FROM migrations WHERE dir = 'sysdb' AND version = ?", newest)
    before, files = _dump_without_chroma_bookkeeping(store), hashes(store)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2
    assert "older Chroma" in one_line(result.output) and "copy" in result.output
    assert _dump_without_chroma_bookkeeping(store) == before  # no migration, no record changed
    assert hashes(store) == files  # not one byte: the refusal wrote no table either
    assert env.count() == 0


@pytest.mark.parametrize(("content", "said"), [(b"", "is empty"), (b"x", "is not a SQLite")])
def test_a_store_file_that_is_no_database_is_said_so_not_called_older(
    env: FakeOpenAI, tmp_path: Path, content: bytes, said: str
) -> None:
    # Chroma found no tables in it, and ragexam advised opening it with this chromadb to
    # migrate it: that makes a blank store
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "chroma.sqlite3").write_bytes(content)
    result = run_cli("generate", "--chroma", str(tmp_path / "store"), "--out", "run")
    assert result.exit_code == 2
    line = one_line(result.output)
    assert f"its chroma.sqlite3 {said}" in line and "older" not in line
    assert (tmp_path / "store" / "chroma.sqlite3").read_bytes() == content


def test_a_store_is_byte_identical_after_every_command_even_read_only(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(8))
    env.embedding_dim = 16
    before = hashes(store)
    for path in [store, *store.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)  # chmod -R a-w
    try:
        generated = run_cli("generate", "--chroma", str(store), "--out", "run")
        assert generated.exit_code == 0, generated.output
        assert f"reading a snapshot of {store}" in generated.output
        answered = run_cli(
            "answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:e"
        )
        assert answered.exit_code == 0, answered.output
        assert run_cli("judge", "--out", "run").exit_code == 0
        assert run_cli("stats", "--out", "run").exit_code == 0
    finally:
        for path in [store, *store.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert hashes(store) == before
    assert len(read_csv(tmp_path / "run" / "answers.csv")) == 8
