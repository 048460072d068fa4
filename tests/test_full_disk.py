"""A truly full disk, or a read-only one: a small tmpfs mounted as the run folder's file system."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import exam, questions, rag_module, read_csv, run_batch_files, run_cli

from ragexam import api

N = 80


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted in tmp_path; skipped where mounting is not permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]
    try:
        mounted = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command: a full disk cannot be made here")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True, timeout=30)


def grow(disk: Path) -> None:
    """Give the full disk room: a bigger tmpfs, with the same files."""
    subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True, timeout=30)


def read_only(disk: Path, ro: bool = True) -> None:
    """Make the disk read-only (a file system remounted so, a bind mount of another's), or not."""
    remount = ["mount", "-o", f"remount,{'ro' if ro else 'rw'}", str(disk)]
    subprocess.run(remount, check=True, timeout=30)


@pytest.mark.slow
def test_a_full_disk_is_one_line_keeps_whole_rows_and_a_failed_manifest(
    env: FakeOpenAI, tmp_path: Path, small_disk: Path
) -> None:
    run = small_disk / "run"
    questions(run, N)
    rag = rag_module(tmp_path, "tmpfs_rag", "An answer long enough to fill a small disk. " * 100)
    args = ["answer", "--rag", rag, "--out", str(run), "--concurrency", "4"]
    full = run_cli(*args)
    assert full.exit_code == 2, full.output
    last = full.output.strip().splitlines()[-1]
    assert last == (
        f"Error: no space left on {run} (writing answers.csv); make room and rerun the same "
        "command, every finished row is kept"
    )
    assert "Internal error" not in full.output
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["answer"]["status"] == "failed"
    output = run / "answers.csv"
    data = output.read_bytes()
    assert data.endswith(b"\n")
    kept = read_csv(output)
    assert 10 < len(kept) < N and output.read_bytes() == data  # whole rows only: nothing to cut
    assert {row["status"] for row in kept} == {"ok"}
    assert sorted(p.name for p in run.iterdir()) == [
        ".ragexam.lock", "answers.csv", "manifest.json", "qa_dataset.csv"
    ]  # fmt: skip
    still = run_cli(*args)  # the disk is still full: the same error, no row lost
    assert still.exit_code == 2 and "Internal error" not in still.output
    assert still.output.strip().splitlines()[-1].startswith(f"Error: no space left on {run} (")
    assert read_csv(output)[: len(kept)] == kept
    assert json.loads((run / "manifest.json").read_text())["stages"]["answer"]["status"] == "failed"
    grow(small_disk)
    again = run_cli(*args)
    assert again.exit_code == 0, again.output
    assert f"{len(kept)} done before" in again.output
    assert len(read_csv(output)) == N
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["answer"]["status"] == "finished"
    assert not (run / ".manifest.room").exists()


@pytest.mark.slow
def test_a_full_disk_under_the_request_shards_is_one_line_and_sends_nothing_half_written(
    env: FakeOpenAI, tmp_path: Path, small_disk: Path
) -> None:
    # The shards are written from another thread: the disk that fills under them is the same
    # one-line error, no shard is left under its name, and a rerun with room writes them all.
    exam(tmp_path / "run", N, {i: "A long answer to grade. " * 40 for i in range(N)})
    args = ["judge", "--out", str(tmp_path / "run"), "--controls", "0"]
    full = run_cli(*args, "--batch-dir", str(small_disk))
    assert full.exit_code == 2, full.output
    last = full.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: no space left on {small_disk / 'requests'} (writing judge-")
    assert "Internal error" not in full.output and env.count() == 0
    assert not list((small_disk / "requests").glob("*.jsonl"))  # only a `.part`, unrecorded
    assert not list((tmp_path / "run").rglob("*.ids"))  # nor its custom_ids under a name
    grow(small_disk)
    again = run_cli(*args, "--batch-dir", str(small_disk))
    assert again.exit_code == 75, again.output
    sent = [
        json.loads(line)["custom_id"].rsplit("~", 1)[1]
        for shard in (small_disk / "requests").glob("*.jsonl")
        for line in shard.read_text().splitlines()
    ]
    assert sorted(sent) == sorted(f"q{i}" for i in range(N))


@pytest.mark.slow
def test_a_batch_dir_on_a_read_only_disk_is_one_line_and_loses_nothing(
    env: FakeOpenAI, tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was "Internal error: OSError ... This is a bug", before any request was written, and
    # (exit 2) after every row was merged from its result.
    exam(tmp_path / "run", 3)
    files = small_disk / "files"
    args = ["judge", "--out", str(tmp_path / "run"), "--controls", "0", "--batch-dir", str(files)]
    read_only(small_disk)
    refused = run_cli(*args)
    assert refused.exit_code == 2, refused.output
    assert refused.output.strip().splitlines() == [
        f"Error: {files}: cannot be written (Read-only file system); pass a writable --batch-dir"
    ]
    assert not files.exists() and env.count() == 0
    read_only(small_disk, False)
    assert run_cli(*args).exit_code == 75
    assert run_batch_files(env, files) == 3
    read_only(small_disk)
    assert run_cli(*args).exit_code == 2  # refused before the merge, as before the requests
    assert read_csv(tmp_path / "run" / "judgments.csv") == []
    # made read-only after that check: the rows are merged, the shard cannot be moved aside
    monkeypatch.setattr(api, "unwritable", lambda _: None)
    late = run_cli(*args)
    assert late.exit_code == 2, late.output
    (shard,) = (files / "requests").glob("*.jsonl")
    assert late.output.strip().splitlines()[-1] == (
        f"Error: {files / 'requests' / 'done' / shard.name}: cannot be written: "
        "Read-only file system"
    )
    assert [row["status"] for row in read_csv(tmp_path / "run" / "judgments.csv")] == ["ok"] * 3
    read_only(small_disk, False)
    done = run_cli(*args)
    assert done.exit_code == 0, done.output
    assert len(read_csv(tmp_path / "run" / "judgments.csv")) == 3
    assert not (files / "requests" / shard.name).exists()
    assert (files / "requests" / "done" / shard.name).exists()
