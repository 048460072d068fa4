"""What a user without write access sees: run as `nobody` in a subprocess (tests run as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import build_store, docs, hashes, questions, rag_module, read_csv, run_cli

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A folder `nobody` can enter and read (pytest's tmp_path is root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run ragexam as an unprivileged user")
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv: cannot switch to an unprivileged user")
    folder = Path(tempfile.mkdtemp(prefix="ragexam-nobody-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def as_nobody(env: FakeOpenAI, shared: Path) -> Run:
    """Run `ragexam ARGS` as nobody, in the shared folder; skipped if nobody cannot run it."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*AS_NOBODY, sys.executable, "-m", "ragexam.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=shared,
            env={**os.environ, "HOME": str(shared)},
        )

    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import ragexam.cli.app"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run this Python and its packages: {probe.stderr[-200:]}")
    return run


@pytest.mark.slow
def test_an_out_folder_nobody_may_write_is_one_line_before_any_call(
    env: FakeOpenAI, shared: Path, as_nobody: Run
) -> None:
    store = build_store(shared / "store", docs(4))
    taken = shared / "taken"  # root's run folder: nobody may read it, not write it
    made = run_cli("generate", "--chroma", str(store), "--out", str(taken))
    assert made.exit_code == 0, made.output
    before, calls = hashes(taken), env.count()
    mask = os.umask(0o022)
    os.umask(mask)
    assert (taken / "qa_dataset.csv").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's
    for out in (taken, taken / "new"):  # the folder itself; a folder to make inside it
        refused = as_nobody("generate", "--chroma", str(store), "--out", str(out))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr == (
            f"Error: {out}: cannot be written as a run folder (Permission denied); "
            "pass a writable --out\n"
        )
    assert env.count() == calls and hashes(taken) == before and not (taken / "new").exists()


@pytest.mark.slow
def test_an_output_file_nobody_may_write_is_one_line_keeping_its_rows(
    env: FakeOpenAI, tmp_path: Path, shared: Path, as_nobody: Run
) -> None:
    mine = shared / "mine"
    questions(mine, 4)
    for folder in (tmp_path, shared):  # the working directories of root and of nobody
        rag = rag_module(folder, "nobody_rag", "An answer.")
    assert run_cli("answer", "--rag", rag, "--out", str(mine), "--limit", "2").exit_code == 0
    for path in [mine, *mine.iterdir()]:
        os.chown(path, NOBODY, NOBODY)  # nobody's run folder, but answers.csv is read-only
    (mine / "answers.csv").chmod(0o444)
    refused = as_nobody("answer", "--rag", rag, "--out", "mine")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        "Error: mine/answers.csv: cannot be written: Permission denied"
    )
    assert len(read_csv(mine / "answers.csv")) == 2


@pytest.mark.slow
def test_a_store_nobody_may_write_is_read_from_a_snapshot_and_left_as_it_was(
    env: FakeOpenAI, shared: Path, as_nobody: Run
) -> None:
    store = build_store(shared / "store", docs(6))
    env.embedding_dim = 16
    before = hashes(store)
    for path in [store, *store.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)  # chmod -R a-w, on top of being root's
    (shared / "mine").mkdir()
    os.chown(shared / "mine", NOBODY, NOBODY)
    generated = as_nobody("generate", "--chroma", str(store), "--out", "mine")
    assert generated.returncode == 0, generated.stderr
    assert f"reading a snapshot of {store}" in generated.stderr
    answered = as_nobody(
        "answer", "--chroma", str(store), "--out", "mine", "--embedding", "openai:e"
    )
    assert answered.returncode == 0, answered.stderr
    assert hashes(store) == before
    rows = read_csv(shared / "mine" / "answers.csv")
    assert len(rows) == 6 and {row["status"] for row in rows} == {"ok"}
    assert (shared / "mine" / "answers.csv").stat().st_uid == NOBODY
