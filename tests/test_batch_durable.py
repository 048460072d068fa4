"""The batch road survives being killed anywhere: a rerun reattaches to its batches, pays for
no row twice, loses none, and never merges a result into a row whose input has changed."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
from openai_server import FakeOpenAI, Reply
from support import (
    custom_key,
    exam,
    grade,
    kill_midway,
    ledger_events,
    read_csv,
    run_cli,
    start_cli,
    wait_until,
    write_dict_rows,
)

from ragexam.io.fingerprint import input_hash
from ragexam.io.ledger import Ledger
from ragexam.llm.batchapi import BatchApi
from ragexam.stages.runner import Runner

N = 12
JUDGE = ("judge", "--out", "run", "--controls", "0", "--batch")


@pytest.fixture
def batch_env(env: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    monkeypatch.setenv("RAGEXAM_BATCH_POLL", "0.02")
    return env


def lines_per_row(server: FakeOpenAI) -> Counter[str]:
    return Counter(custom_key(line.custom_id) for line in server.batch_requests)


def batches(server: FakeOpenAI) -> list[Any]:
    sdk = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    return list(sdk.batches.list().data)


def all_ok(tmp_path: Path, rows: int = N) -> bool:
    found = read_csv(tmp_path / "run" / "judgments.csv")
    return len(found) == rows and all(row["status"] == "ok" for row in found)


def interrupt_at(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, when: Any) -> None:
    """Make owner.name raise KeyboardInterrupt (as Ctrl-C would) the first time `when` is true."""
    real = getattr(owner, name)
    fired: list[bool] = []

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not fired and when(*args, **kwargs):
            fired.append(True)
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


@pytest.mark.slow
def test_killed_while_it_waits_it_reattaches_and_pays_no_row_twice(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.manual = True
    exam(tmp_path / "run", N)
    process = start_cli(*JUDGE)
    ledger = tmp_path / "run" / "batches" / "judge.jsonl"
    wait_until(lambda: any(e["event"] == "submitted" for e in ledger_events(ledger)))
    batch_env.advance_batches(4)  # validated, three lines run: the batch is half done
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    batch_env.batch.manual = False
    result = run_cli(*JUDGE)
    assert result.exit_code == 0, result.output
    assert all_ok(tmp_path)
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert len(batches(batch_env)) == 1  # the rerun made none: it waited on the first


@pytest.mark.slow
def test_killed_while_it_merges_it_loses_no_row(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    rows = 4000
    exam(tmp_path / "run", rows)
    kill_midway(list(JUDGE), tmp_path / "run" / "judgments.csv", 500)
    written = len(read_csv(tmp_path / "run" / "judgments.csv"))
    assert written < rows  # killed mid-merge
    result = run_cli(*JUDGE)
    assert result.exit_code == 0, result.output
    assert all_ok(tmp_path, rows)
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(rows)}


def test_a_crash_between_making_a_batch_and_recording_it_finds_the_batch(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, Ledger, "record", lambda event, **_: event == "submitted")
        assert run_cli(*JUDGE).exit_code == 130
    assert len(batches(batch_env)) == 1  # made, but the ledger does not know its id
    result = run_cli(*JUDGE)
    assert result.exit_code == 0, result.output
    assert all_ok(tmp_path)
    assert len(batches(batch_env)) == 1  # found among the endpoint's batches, not made again
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_a_crash_while_downloading_downloads_again(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", N)
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, BatchApi, "download", lambda *_: True)
        assert run_cli(*JUDGE).exit_code == 130
    assert run_cli(*JUDGE).exit_code == 0
    assert all_ok(tmp_path)
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert len(batches(batch_env)) == 1


def test_a_crash_while_merging_merges_the_rest(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", N)
    written: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(
            patch,
            Runner,
            "settle",
            lambda task, values: written.append(task.key) or len(written) > 5,
        )
        assert run_cli(*JUDGE).exit_code == 130
    assert 0 < len(read_csv(tmp_path / "run" / "judgments.csv")) < N
    assert run_cli(*JUDGE).exit_code == 0
    assert all_ok(tmp_path)
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_a_result_is_never_merged_into_a_row_whose_input_changed(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, BatchApi, "download", lambda *_: True)
        assert run_cli(*JUDGE).exit_code == 130  # the batch ran, its results not yet merged
    answers = read_csv(tmp_path / "run" / "answers.csv")
    for row in answers:
        if row["qa_id"] == "q2":
            row["answer"] = "A new answer, written since."
    write_dict_rows(tmp_path / "run" / "answers.csv", answers)
    assert run_cli(*JUDGE).exit_code == 0
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}
    new = input_hash("Question #2?", "Truth #2.", "A new answer, written since.")
    assert rows["q2"]["input_hash"] == new and rows["q2"]["status"] == "ok"
    asked = [line.body for line in batch_env.batch_requests if custom_key(line.custom_id) == "q2"]
    assert len(asked) == 2 and "A new answer" in asked[1]["messages"][-1]["content"]
    assert all(n == 1 for key, n in lines_per_row(batch_env).items() if key != "q2")


def test_stopped_while_merging_the_rerun_bills_the_whole_job(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch ended and its results came down; Ctrl-C mid-merge. The rerun's record still
    # covers the job: its batch, its requests and calls, and every token the rows were billed.
    exam(tmp_path / "run", N)
    real, seen = Runner.settle, []

    def ctrl_c_at_the_sixth(self: Runner, task: Any, values: Any) -> None:
        seen.append(task.key)
        if len(seen) == 6:  # the first pass sends, the second merges: its sixth row
            raise KeyboardInterrupt
        real(self, task, values)

    monkeypatch.setattr(Runner, "settle", ctrl_c_at_the_sixth)
    assert run_cli(*JUDGE).exit_code == 130
    assert len(read_csv(tmp_path / "run" / "judgments.csv")) == 5
    monkeypatch.setattr(Runner, "settle", real)
    assert run_cli(*JUDGE).exit_code == 0
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert record["batch"]["runs"] == 2 and record["batch"]["batches"] == 1
    assert record["batch"]["requests"] == record["calls"] == N
    assert record["tokens_billed"] == {
        "prompt": sum(int(row["prompt_tokens"]) for row in rows),
        "completion": sum(int(row["completion_tokens"]) for row in rows),
    }
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def cut_then_grade(body: dict[str, Any]) -> Reply:
    """A first ask's reply is cut off at max_tokens; a re-ask's is a grade."""
    if "cut off" in json.dumps(body):
        return grade(body, 0.5)
    return Reply(content='{"reasoning": "' + "very " * 400)


@pytest.mark.slow
def test_killed_while_it_waits_on_its_re_asks_the_rerun_bills_the_whole_job(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # The first batch's cut-off replies are merged (and billed), the re-asks go out in a
    # second batch; kill -9 while it waits on that one. The rerun's record bills both.
    batch_env.batch.manual = True
    batch_env.responder = cut_then_grade
    exam(tmp_path / "run", N)
    process = start_cli(*JUDGE)
    ledger = tmp_path / "run" / "batches" / "judge.jsonl"

    def submitted() -> int:
        return sum(event["event"] == "submitted" for event in ledger_events(ledger))

    wait_until(lambda: submitted() == 1)
    batch_env.advance_batches(N + 3)  # validated, every line run, finalized: it ends
    wait_until(lambda: submitted() == 2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    batch_env.batch.manual = False
    result = run_cli(*JUDGE)
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(rows) == N and {row["attempts"] for row in rows} == {"2"}
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert record["batch"]["batches"] == 2 and record["calls"] == 2 * N
    assert record["tokens_billed"] == {
        "prompt": sum(int(row["prompt_tokens"]) for row in rows),
        "completion": sum(int(row["completion_tokens"]) for row in rows),
    }


def test_the_sync_road_refuses_while_requests_are_out_in_batches(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.manual = True  # the batch stays in flight
    exam(tmp_path / "run", N)
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, BatchApi, "retrieve", lambda *_: True)  # Ctrl-C once it waits
        stopped = run_cli(*JUDGE)
    assert stopped.exit_code == 130
    assert "The batches made keep running at the endpoint" in " ".join(stopped.output.split())
    sync = run_cli("judge", "--out", "run", "--controls", "0")
    assert sync.exit_code == 2, sync.output
    assert f"{N} requests of judge are out in a batch" in sync.output
    assert "rerun with --batch" in sync.output and batch_env.count() == 0
    batch_env.batch.manual = False
    assert run_cli(*JUDGE).exit_code == 0  # collected, as it says
    assert all_ok(tmp_path) and lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_a_dry_run_leaves_out_the_rows_whose_requests_are_out(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.manual = True
    exam(tmp_path / "run", N)
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, BatchApi, "retrieve", lambda *_: True)
        assert run_cli(*JUDGE).exit_code == 130
    dry = run_cli(*JUDGE, "--dry-run")
    assert dry.exit_code == 0, dry.output
    said = " ".join(dry.output.split())
    assert "judge: 0 rows to do, 0 calls" in said
    assert f"{N} more wait on requests out in batches: not sent again" in said
    batch_env.batch.manual = False
    assert run_cli(*JUDGE).exit_code == 0 and len(batches(batch_env)) == 1  # as it said
