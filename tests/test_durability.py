"""Nothing lost, nothing stale: fingerprints, one writer per folder, bad rows kept aside."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import (
    N,
    build_store,
    docs,
    make_store,
    questions,
    rag_module,
    ranked_questions,
    read_csv,
    run_cli,
)

from ragexam.io.csvfile import read_rows


def graded_then_unsure(tmp_path: Path) -> str:
    """A run folder `run` of N questions answered surely and graded; the --rag module of an
    unsure system, to answer them again with."""
    questions(tmp_path / "run")
    sure = rag_module(tmp_path, "sure_rag", "The answer is here.")
    assert run_cli("answer", "--out", "run", "--rag", sure).exit_code == 0
    assert run_cli("judge", "--out", "run", "--controls", "0").exit_code == 0
    return rag_module(tmp_path, "unsure_rag", "I don't know.")


def test_a_redone_answer_stage_makes_judge_regrade_every_changed_answer(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    dunno = graded_then_unsure(tmp_path)
    assert env.count() == N
    redo = run_cli("answer", "--out", "run", "--rag", dunno, "--force")
    assert redo.exit_code == 0, redo.output
    judged = run_cli("judge", "--out", "run", "--controls", "0")
    assert judged.exit_code == 0, judged.output
    assert env.count() == 2 * N  # every answer changed: every grade was asked again
    assert f"{N} rows redone: their input changed" in judged.output
    graded = {request.body["messages"][-1]["content"] for request in env.requests[N:]}
    assert all("I don't know." in text for text in graded)
    assert len(read_csv(tmp_path / "run" / "judgments.csv")) == N
    again = run_cli("judge", "--out", "run", "--controls", "0")
    assert again.exit_code == 0 and env.count() == 2 * N  # now current: nothing redone


def test_an_edited_question_is_answered_again_and_only_it(env: FakeOpenAI, tmp_path: Path) -> None:
    qa = questions(tmp_path / "run")
    rag = rag_module(tmp_path, "echo_rag", "An answer.")
    assert run_cli("answer", "--out", "run", "--rag", rag).exit_code == 0
    assert run_cli("judge", "--out", "run", "--controls", "0").exit_code == 0
    qa.write_text(qa.read_text().replace("Q3?", "A new question 3?"), encoding="utf-8")
    answered = run_cli("answer", "--out", "run", "--rag", rag)
    assert answered.exit_code == 0
    assert "1 rows redone" in answered.output and f"({N - 1} done before)" in answered.output
    judged = run_cli("judge", "--out", "run", "--controls", "0")
    assert "1 rows redone" in judged.output
    assert env.count() == N + 1
    assert "A new question 3?" in str(env.requests[-1].body["messages"])


def test_k_and_embedding_are_part_of_the_fingerprint(env: FakeOpenAI, tmp_path: Path) -> None:
    store = make_store(tmp_path / "store", env)
    ranked_questions(env, {f"Q{i}?": list(range(12)) for i in range(N)})
    questions(tmp_path / "run")
    base = ["answer", "--chroma", str(store), "--out", "run"]
    assert run_cli(*base, "--k", "1", "--limit", "3").exit_code == 0
    other_k = run_cli(*base, "--k", "5")
    assert other_k.exit_code == 2
    assert "different k (k '1') than this run (k '5')" in other_k.output
    assert "--force" in other_k.output
    other_embedding = run_cli(*base, "--k", "1", "--embedding", "openai:fake-embed")
    assert other_embedding.exit_code == 2
    assert "different embedding (embedding 'collection:openai')" in other_embedding.output
    assert env.count() == 3
    forced = run_cli(*base, "--k", "5", "--force")
    assert forced.exit_code == 0, forced.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert len(rows) == N and {row["k"] for row in rows} == {"5"}
    assert env.count() == 3 + N


@pytest.mark.slow
def test_a_second_writer_is_refused_naming_the_first(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_TIMEOUT", "120")  # the first writer's calls wait for the others
    store = build_store(tmp_path / "store", docs(40))
    release = threading.Event()
    env.responder = lambda body: release.wait(120) and None  # the first writer's calls wait
    args = [sys.executable, "-m", "ragexam.cli", "generate", "--chroma", str(store)]
    first = subprocess.Popen([*args, "--out", "run"], text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not env.requests:
        time.sleep(0.05)
    second = subprocess.run(
        [*args, "--out", "run", "--limit", "13"], capture_output=True, text=True, timeout=120
    )
    third = run_cli("stats", "--out", "run")
    release.set()
    assert first.wait(timeout=120) == 0
    assert second.returncode == 2
    assert second.stderr.strip() == (
        f"Error: another ragexam (pid {first.pid}) is writing to run; "
        "wait for it to finish, or choose another --out"
    )
    assert third.exit_code == 2 and f"pid {first.pid}" in third.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 40 and len({row["qa_id"] for row in rows}) == 40
    assert env.count() == 40  # no row paid twice
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_killed_writer_leaves_no_lock_behind(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(4))
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from ragexam.io.lock import run_folder_lock\n"
            "with run_folder_lock(Path('run')):\n    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    busy = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert busy.exit_code == 2 and f"pid {holder.pid}" in busy.output
    os.kill(holder.pid, 9)
    holder.wait()
    free = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert free.exit_code == 0, free.output
    assert len(read_csv(tmp_path / "run" / "qa_dataset.csv")) == 4


@pytest.mark.slow
def test_a_full_disk_is_one_line_leaves_whole_rows_and_a_failed_manifest(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    questions(tmp_path / "run", 60)
    output = tmp_path / "run" / "answers.csv"

    def small_files() -> None:  # the file-size limit fails writes as a full disk would
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    rag = rag_module(tmp_path, "full_rag", "A long answer that fills the disk. " * 3)
    args = ["answer", "--rag", rag, "--out", "run", "--concurrency", "4"]
    full = subprocess.run(
        [sys.executable, "-m", "ragexam.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
    )
    assert full.returncode == 2, full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last == (
        "Error: run/answers.csv: cannot be written: File too large; make room and rerun the "
        "same command, every finished row is kept"
    )
    assert "Internal error" not in full.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["answer"]["status"] == "failed"
    data = output.read_bytes()
    assert data.endswith(b"\n") and len(data) <= 6000
    kept = read_csv(output)
    assert 5 < len(kept) < 60 and output.read_bytes() == data  # nothing torn to repair
    again = run_cli(*args)
    assert again.exit_code == 0, again.output
    assert len(read_csv(output)) == 60


def test_stats_never_counts_a_grade_of_an_answer_that_changed(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    dunno = graded_then_unsure(tmp_path)
    graded = run_cli("stats", "--out", "run")
    assert graded.exit_code == 0 and "Warning" not in graded.output
    assert run_cli("answer", "--out", "run", "--rag", dunno, "--force").exit_code == 0
    result = run_cli("stats", "--out", "run")  # judge was not rerun
    assert result.exit_code == 0, result.output
    assert f"Warning: {N} grades were made from a question or answer that has changed" in (
        result.output
    )
    (overall,) = read_rows(tmp_path / "run" / "summary.csv", ["document"])
    assert overall["completeness_mean"] == "" and overall["pending"] == str(N)


def test_answers_forced_under_a_limit_say_what_was_taken_out_and_stats_says_what_to_rerun(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # `answer --force --limit 2` took the other answers out of the file unsaid, and stats
    # said "rerun judge" of their grades, which found nothing to do.
    dunno = graded_then_unsure(tmp_path)
    forced = run_cli("answer", "--out", "run", "--rag", dunno, "--force", "--limit", "2")
    assert forced.exit_code == 0, forced.output
    said = " ".join(forced.output.split())
    assert f"{N - 2} rows made with other settings were taken out by --force" in said
    assert len(read_csv(tmp_path / "run" / "answers.csv")) == 2
    stats = run_cli("stats", "--out", "run")
    said = " ".join(stats.output.split())
    assert "Warning: 2 grades were made from a question or answer that has changed" in said
    assert f"Warning: {N - 2} grades are of an answer gone from answers.csv" in said
    assert "they count as pending: rerun answer, then judge" in said
    assert run_cli("answer", "--out", "run", "--rag", dunno).exit_code == 0  # as it says
    regraded = run_cli("judge", "--out", "run", "--controls", "0")
    assert regraded.exit_code == 0 and f"{N} rows redone" in regraded.output
    final = run_cli("stats", "--out", "run")
    assert final.exit_code == 0 and "Warning" not in final.output
