"""`--batch`: the calls go through the endpoint's Batch API, and every server behaviour is met
the way the sync road meets a failing call: retried within the budget, else an error row."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from batch_api import HttpReply
from judges import truthful
from openai_server import FakeOpenAI, Faults, Reply
from rich.console import Console
from support import (
    build_store,
    closed_port,
    custom_key,
    docs,
    edit_cell,
    exam,
    grade,
    ledger_events,
    marked_exam,
    number,
    read_csv,
    run_cli,
    wait_until,
    write_dict_rows,
)

from ragexam.cli import display
from ragexam.io import batchfiles
from ragexam.stages import batchwait, forked

N = 12


@pytest.fixture
def batch_env(env: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    """The fake server, polled every 20 ms."""
    monkeypatch.setenv("RAGEXAM_BATCH_POLL", "0.02")
    return env


def by_question(body: dict[str, Any]) -> Any:
    """Question #i is graded i/20 complete, whatever road it came by."""
    return grade(body, number(body, "Question") / 20)


def judge(*options: str) -> Any:
    """`ragexam judge --batch` on the run folder `run`, without controls."""
    return run_cli("judge", "--out", "run", "--controls", "0", "--batch", *options)


def lines_per_row(server: FakeOpenAI) -> Counter[str]:
    """How many batch lines the server ran for each row."""
    return Counter(custom_key(line.custom_id) for line in server.batch_requests)


def judged(tmp_path: Path) -> dict[str, dict[str, str]]:
    return {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}


def manifest(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "manifest.json").read_text())  # type: ignore[no-any-return]


def test_every_row_is_graded_through_batches_and_paid_once(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "2")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "8")
    exam(tmp_path / "run", N)
    batch_env.responder = by_question
    result = judge()
    assert result.exit_code == 0, result.output
    rows = judged(tmp_path)
    assert {qa_id: float(row["completeness"]) for qa_id, row in rows.items()} == {
        f"q{i}": i / 20 for i in range(N)
    }
    assert batch_env.count() == 0  # no chat call went the sync way
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    record = manifest(tmp_path)["stages"]["judge"]
    assert record["batch"]["requests"] == N and record["batch"]["batches"] == 1
    billed = record["tokens_billed"]
    sync = (billed["prompt"] * 2 + billed["completion"] * 8) / 1e6
    assert record["cost_usd_sync"] == pytest.approx(sync)
    assert record["cost_usd"] == pytest.approx(sync / 2)  # no batch price in the table: half
    assert "the batches took" in result.output and "batch rate" in result.output
    said = " ".join(result.output.split())
    assert f"batches: 1 made, {N} requests sent, {N} merged, the batches took" in said


@pytest.mark.parametrize("forks", [False, True])
def test_shards_keep_to_the_line_and_byte_limits(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forks: bool
) -> None:
    """In one process, and (on Linux) with a child writing the last rows' shards."""
    monkeypatch.setattr(batchfiles, "MAX_LINES", 5)
    monkeypatch.setattr(batchfiles, "MAX_BYTES", 7000)  # two or three judge requests
    batch_env.batch.max_lines, batch_env.batch.max_bytes = 5, 7000  # what the server takes
    exam(tmp_path / "run", N)
    ended: list[bool] = []
    if forks and sys.platform == "linux":
        monkeypatch.setattr(forked, "ROWS_TO_FORK", 8)
        monkeypatch.setattr(forked, "cores", lambda: 2)
        real = forked.Child.lines

        def read(child: forked.Child) -> Any:
            made = real(child)
            ended.append(made is not None)  # the child made its rows
            return made

        monkeypatch.setattr(forked.Child, "lines", read)
    assert judge().exit_code == 0
    # a child for the pass that writes the requests, and one for the pass that merges them
    assert ended == ([True, True] if forks and sys.platform == "linux" else [])
    events = ledger_events(tmp_path / "run" / "batches" / "judge.jsonl")
    sizes = [(event["lines"], event["bytes"]) for event in events if event["event"] == "shard"]
    assert len(sizes) >= N // 3 and all(lines <= 5 and size <= 7000 for lines, size in sizes)
    assert sum(lines for lines, _ in sizes) == N
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    files = tmp_path / "run" / "batches" / "judge"
    assert not [path for path in files.rglob("*") if path.is_file()]  # all spent: tidied away


def test_a_full_queue_is_submitted_again_at_no_cost_to_the_rows(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.fail_validation = "token_limit_exceeded"
    batch_env.batch.fail_validation_count = 2
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 0, result.output
    assert all(
        row["status"] == "ok" and row["attempts"] == "1" for row in judged(tmp_path).values()
    )
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    events = ledger_events(tmp_path / "run" / "batches" / "judge.jsonl")
    assert [e["event"] for e in events].count("resubmit") == 2


def test_invalid_first_replies_merged_first_do_not_make_the_valid_results_unusable(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # The merge meets the last three answers first (answers.csv is in reverse order). Their
    # first replies are malformed: on the sync road, three invalid replies in a row switch
    # the structured-output method. Here, the other rows' valid results were made under
    # that method: switched, they no longer answered their rows' requests, and were bought
    # again (a whole second batch).
    spoilt = {f"Question #{i}?" for i in (N - 1, N - 2, N - 3)}
    seen: set[str] = set()

    def first_reply_of_the_last_three(text: str) -> bool:
        asked = next((question for question in spoilt if question in text), None)
        if asked is None or asked in seen:
            return False
        seen.add(asked)
        return True

    batch_env.faults = Faults(malformed_if=first_reply_of_the_last_three)
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 0, result.output
    asked_again = {f"q{i}": 2 for i in (N - 1, N - 2, N - 3)}
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)} | asked_again
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    assert "no longer make" not in result.output


@pytest.mark.parametrize("rows", [3, N])
def test_a_method_every_reply_fails_is_left_and_the_warning_says_so(
    batch_env: FakeOpenAI, tmp_path: Path, rows: int
) -> None:
    # Every json_schema reply is malformed, and tool calls are answered: the batch road leaves
    # the method once HELD_TRIES replies failed and none passed, and says why results went
    # unused (it blamed an input or OPENAI_BASE_URL).
    batch_env.responder = lambda body: Reply(content="{no") if "response_format" in body else None
    exam(tmp_path / "run", rows)  # 3: too few to reach 20 within a pass; the pass decides
    result = judge()
    assert result.exit_code == 0, result.output
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    said = " ".join(result.output.split())
    assert "the structured-output method went from json_schema to function_calling" in said
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert record["structured_output"] == "function_calling"


def test_the_batches_time_ends_when_the_endpoint_says_they_ended(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # Made two hours ago and done in twenty minutes, collected now (a rerun the next morning):
    # the batches took twenty minutes, not two hours.
    def long_ago(method: str, path: str, reply: HttpReply) -> HttpReply:
        payload = reply.payload
        if not isinstance(payload, dict) or payload.get("object") != "batch":
            return reply
        shifted = {"created_at": payload["created_at"] - 7200}
        if payload.get("completed_at"):
            shifted["completed_at"] = payload["completed_at"] - 6000
        return replace(reply, payload={**payload, **shifted})

    batch_env.batch.alter = long_ago
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert 1200 <= record["batch"]["seconds"] < 1260
    assert "the batches took 20m" in " ".join(result.output.split())


def test_the_batches_time_counts_the_queue_that_refused_them(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.fail_validation = "token_limit_exceeded"
    batch_env.batch.fail_validation_count = 1
    refused: list[str] = []

    def made_ten_minutes_ago(method: str, path: str, reply: HttpReply) -> HttpReply:
        payload = reply.payload  # the first batch, the one the full queue refuses
        if not isinstance(payload, dict) or payload.get("object") != "batch":
            return reply
        refused[:] = refused or [payload["id"]]
        if payload["id"] != refused[0]:
            return reply
        return replace(reply, payload={**payload, "created_at": payload["created_at"] - 600})

    batch_env.batch.alter = made_ten_minutes_ago
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert record["batch"]["batches"] == 2 and 600 <= record["batch"]["seconds"] < 660
    assert "the batches took 10m" in " ".join(result.output.split())


def test_a_batch_that_fails_validation_leaves_error_rows_with_the_reason(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.fail_validation = "invalid_model"
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 1, result.output  # every row in error: above --max-error-rate
    rows = judged(tmp_path).values()
    assert len(rows) == N and all(row["status"] == "error" for row in rows)
    assert all("refused batch" in row["error"] and "invalid_model" in row["error"] for row in rows)
    assert all(row["completeness"] == "" for row in rows)  # never a score of 0
    assert not batch_env.batch_requests  # not one line ran: nothing was paid


def test_failed_lines_go_out_again_within_the_retry_budget(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "2")
    seen: Counter[str] = Counter()

    def fail(custom_id: str, body: str) -> int | None:
        key = custom_key(custom_id)
        seen[key] += 1
        if key == "q3":
            return 500  # every time: an error row after 3 attempts
        if key == "q5" and seen[key] == 1:
            return 503  # once: the retry in the next batch succeeds
        return 400 if key == "q7" else None  # a 400 is not retried

    batch_env.batch.fail_line_if = fail
    exam(tmp_path / "run", N)
    result = judge("--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    rows = judged(tmp_path)
    assert rows["q3"]["status"] == "error" and rows["q3"]["attempts"] == "3"
    assert "Injected HTTP 500" in rows["q3"]["error"] and "after 3 attempts" in rows["q3"]["error"]
    assert rows["q5"]["status"] == "ok" and rows["q5"]["attempts"] == "2"
    assert rows["q7"]["status"] == "error" and rows["q7"]["attempts"] == "1"
    assert "HTTP 400" in rows["q7"]["error"]
    paid = lines_per_row(batch_env)
    assert (paid["q3"], paid["q5"], paid["q7"]) == (3, 2, 1)
    assert all(paid[f"q{i}"] == 1 for i in range(N) if i not in (3, 5, 7))
    # each failed line counted once, as the sync road counts them (replays read them again)
    assert manifest(tmp_path)["stages"]["judge"]["retries"] == 3  # q3 twice, q5 once


def test_a_line_answered_429_is_counted_as_rate_limited_and_sent_again(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    seen: Counter[str] = Counter()

    def limited_once(custom_id: str, body: str) -> int | None:
        seen[custom_key(custom_id)] += 1
        return 429 if custom_key(custom_id) == "q2" and seen["q2"] == 1 else None

    batch_env.batch.fail_line_if = limited_once
    exam(tmp_path / "run", N)
    assert judge().exit_code == 0
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    record = manifest(tmp_path)["stages"]["judge"]
    assert (record["rate_limited"], record["retries"]) == (1, 0)


def test_an_expired_batch_leaves_its_unrun_lines_to_the_next(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    batch_env.batch.expire_after = 5  # each batch runs 5 lines, then expires
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 0, result.output
    rows = judged(tmp_path)
    assert all(row["status"] == "ok" for row in rows.values())
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}  # unrun lines cost nothing
    assert max(int(row["attempts"]) for row in rows.values()) == 3  # 12 lines: 5, 5, then 2
    record = manifest(tmp_path)["stages"]["judge"]
    assert record["batch"]["batches"] == 3
    assert record["calls"] == N  # the lines that ran: those left unrun made no call


def run_in_thread(*args: str) -> tuple[threading.Thread, list[Any]]:
    """`ragexam ARGS` in a thread, its result put in the list it returns."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run_cli(*args)), daemon=True)
    thread.start()
    return thread, results


def test_a_cancelled_batch_is_sent_again(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    batch_env.batch.manual = True
    exam(tmp_path / "run", N)
    thread, results = run_in_thread("judge", "--out", "run", "--controls", "0", "--batch")
    sdk = openai.OpenAI(base_url=batch_env.base_url, api_key="test", max_retries=0)
    wait_until(lambda: sdk.batches.list().data)
    batch_env.advance_batches(3)  # validated, and two lines run
    first = sdk.batches.list().data[0]
    sdk.batches.cancel(first.id)
    batch_env.batch.manual = False
    thread.join(30)
    assert results and results[0].exit_code == 0, results and results[0].output
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert len(sdk.batches.list().data) == 2


def test_each_batch_shows_its_state_and_counts_while_it_runs(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(display, "PLAIN_EVERY", 0.05)
    batch_env.batch.manual = True
    exam(tmp_path / "run", 4)
    thread, results = run_in_thread("judge", "--out", "run", "--controls", "0", "--batch")
    ledger = tmp_path / "run" / "batches" / "judge.jsonl"
    wait_until(lambda: any(e["event"] == "submitted" for e in ledger_events(ledger)))

    def looks() -> int:
        return sum(r.path.startswith("/v1/batches/") for r in list(batch_env.listings))

    for _ in range(6):  # validation, four lines, finalizing: a step at a time, each seen
        seen = looks()
        wait_until(lambda seen=seen: looks() > seen + 1)  # looked at twice since the step
        time.sleep(0.15)  # and said so in a progress line
        batch_env.advance_batches(1)
    thread.join(30)
    output = results[0].output
    assert results[0].exit_code == 0, output
    for state in ("validating", "in_progress", "finalizing"):
        assert f" {state}: " in output, state
    assert "2/4 answered, 0 failed" in output and "elapsed, expires in 23h" in output


def test_failed_polls_are_waited_out(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")  # the SDK's own retry off: ours is seen
    batch_env.batch.retrieve_status = lambda batch_id, poll: 500 if poll <= 4 else None
    exam(tmp_path / "run", N)
    assert judge().exit_code == 0
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_results_in_any_order_land_on_their_own_rows(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    batch_env.batch.reverse_output = True
    batch_env.responder = by_question
    exam(tmp_path / "run", N)
    assert judge().exit_code == 0
    assert {k: float(v["completeness"]) for k, v in judged(tmp_path).items()} == {
        f"q{i}": i / 20 for i in range(N)
    }


def test_a_reask_goes_out_in_a_later_batch(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An out-of-range grade is re-asked with the reason, as on the sync road.
    def once_too_high(body: dict[str, Any]) -> Any:
        again = "previous reply to this was invalid" in json.dumps(body)
        return grade(body, 0.4 if again or number(body, "Question") != 2 else 1.7)

    batch_env.responder = once_too_high
    exam(tmp_path / "run", N)
    assert judge().exit_code == 0
    rows = judged(tmp_path)
    assert rows["q2"]["status"] == "ok" and rows["q2"]["attempts"] == "2"
    reasked = [line.body for line in batch_env.batch_requests if custom_key(line.custom_id) == "q2"]
    assert len(reasked) == 2 and "less than or equal to 1" in reasked[1]["messages"][-1]["content"]


def test_samples_are_asked_one_round_each(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 3)
    assert judge("--samples", "3").exit_code == 0
    rows = judged(tmp_path)
    assert all(row["samples_valid"] == "3" for row in rows.values())
    assert lines_per_row(batch_env) == {"q0": 3, "q1": 3, "q2": 3}
    assert manifest(tmp_path)["stages"]["judge"]["batch"]["rounds"] == 4  # 3 sends, 1 merge


def test_controls_are_batched_too(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", N)
    result = run_cli("judge", "--out", "run", "--controls", "2", "--batch")
    assert result.exit_code == 0, result.output
    controls = read_csv(tmp_path / "run" / "judge_controls.csv")
    assert len(controls) == 16 and all(row["passed"] in ("true", "false") for row in controls)
    tags = Counter(line.custom_id.split("~")[0] for line in batch_env.batch_requests)
    assert tags == {"judge": N, "judge_controls": 16}
    assert batch_env.count() == 0


def test_dry_run_shows_the_batch_price_beside_the_sync_price(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_JUDGE_MODEL", "gpt-4o")  # the table has its batch price
    exam(tmp_path / "run", 300)
    result = run_cli("judge", "--out", "run", "--controls", "0", "--batch", "--dry-run")
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("judge:"))
    batch, sync = [float(value) for value in _dollars(line)]
    assert batch == pytest.approx(sync / 2, rel=0.01)  # gpt-4o's batch price: half
    assert "in batches" in line and "sync" in line
    assert not batch_env.batch_requests and batch_env.count() == 0


def _dollars(line: str) -> list[str]:
    import re

    return re.findall(r"\$([0-9.]+)", line)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["answer", "--rag", "my_rag:answer", "--batch"], "cannot batch"),
        (["judge", "--batch", "--batch-dir", "files"], "give one of them"),
    ],
)
def test_what_cannot_be_batched_is_refused_in_one_line(
    batch_env: FakeOpenAI, tmp_path: Path, args: list[str], says: str
) -> None:
    exam(tmp_path / "run", 2)
    result = run_cli(*args, "--out", "run")
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and says in errors[0]
    assert not batch_env.batch_requests and batch_env.count() == 0


def test_run_with_control_runs_batches_every_stage(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(6))
    batch_env.embedding_dim = 16
    result = run_cli(
        "run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e",
        "--controls", "1", "--control-runs", "--batch",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert batch_env.count() == 0  # every chat call went in a batch
    tags = Counter(line.custom_id.split("~")[0] for line in batch_env.batch_requests)
    assert tags == {
        "generate": 6, "answer": 6, "judge": 6, "judge_controls": 8,
        "gold.answer": 6, "gold.judge": 6, "closed_book.answer": 6, "closed_book.judge": 6,
    }  # fmt: skip
    for folder in ("run", "run/gold", "run/closed_book"):
        rows = read_csv(tmp_path / folder / "judgments.csv")
        assert len(rows) == 6 and all(row["status"] == "ok" for row in rows)
    assert (tmp_path / "run" / "summary.csv").exists()


def test_a_terminal_shows_a_line_per_batch(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(display, "err", Console(file=screen, force_terminal=True, width=140))
    exam(tmp_path / "run", N)
    assert judge().exit_code == 0
    shown = screen.getvalue()
    batch_id = batch_env.batch_requests[0].batch_id
    lines = [line for line in shown.splitlines() if batch_id[:18] in line]
    # Drawn again while the batch runs (on a slow machine it is seen in_progress first): every
    # drawing has its state, counts and age, and the last one is the batch as it ended.
    assert lines and all(f"/{N}" in line and "elapsed" in line for line in lines)
    last = lines[-1]
    assert "completed" in last and f"{N}/{N}" in last and "0 failed" in last


def test_key_points_are_marked_through_batches_as_on_the_sync_road(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    rows = [
        {
            "qa_id": f"q{i}",
            "question": f"Question {i}?",
            "truth": f"Alpha{i} beta{i} gamma{i} delta{i}.",
            "answer": f"Alpha{i} beta{i}." if i % 2 else f"Alpha{i} beta{i} gamma{i} delta{i}.",
            "key_points": [f"alpha{i} beta{i}", f"gamma{i} delta{i}"],
        }
        for i in range(N)
    ]
    batch_env.responder = truthful  # marks each key point by the words the answer shares
    graded = {}
    for road in ("sync", "batch"):
        marked_exam(tmp_path / road, rows)
        extra = ["--batch"] if road == "batch" else []
        result = run_cli("judge", "--out", road, "--controls", "0", "--samples", "2", *extra)
        assert result.exit_code == 0, result.output
        graded[road] = {
            row["qa_id"]: (row["scale"], row["completeness"], row["conciseness"])
            for row in read_csv(tmp_path / road / "judgments.csv")
        }
    assert graded["batch"] == graded["sync"]
    assert {scale for scale, _, _ in graded["batch"].values()} == {"key-points"}
    assert {completeness for _, completeness, _ in graded["batch"].values()} == {"0.5", "1.0"}
    assert len(batch_env.batch_requests) == 2 * N  # two samples a row, each in a batch


def altering(method: str, path: str, change: Callable[[Any], HttpReply]) -> Any:
    """A Batch API `alter` that changes its 200s to `method` on paths starting with `path`."""

    def alter(asked: str, at: str, reply: HttpReply) -> HttpReply:
        if asked == method and at.startswith(path) and reply.status == 200:
            return change(reply.payload)
        return reply

    return alter


def batches_made(server: FakeOpenAI) -> int:
    sdk = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    return len(list(sdk.batches.list().data))


def test_a_batch_made_without_an_id_stops_the_stage_and_is_found_again_not_made_twice(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # Each submission it could not record would be made again, and paid again: not one more.
    exam(tmp_path / "run", 3)
    without_id = altering("POST", "/v1/batches", lambda made: HttpReply(200, {**made, "id": None}))
    batch_env.batch.alter = without_id
    result = judge()
    assert result.exit_code == 4, result.output
    assert "the endpoint's Batch API answered with a batch without an id" in result.output
    assert batches_made(batch_env) == 1
    events = ledger_events(tmp_path / "run" / "batches" / "judge.jsonl")
    assert "submitted" not in {event["event"] for event in events}
    batch_env.batch.alter = None
    assert judge().exit_code == 0  # found by its input file, not made again
    assert batches_made(batch_env) == 1
    assert manifest(tmp_path)["stages"]["judge"]["batch"]["batches"] == 1  # counted once
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(3)}


@pytest.mark.parametrize("lost", [1, 10], ids=["once", "every-time"])
def test_a_batch_made_whose_reply_is_lost_is_found_not_made_again(
    batch_env: FakeOpenAI, tmp_path: Path, lost: int
) -> None:
    # A gateway's 502 after the endpoint made the batch: retried blindly (the SDK's retries),
    # each retry made another batch of the same requests, and every row was paid again.
    replies = [0]

    def bad_gateway(made: Any) -> HttpReply:
        replies[0] += 1
        return (
            HttpReply(502, {"error": {"message": "Bad gateway"}})
            if replies[0] <= lost
            else (HttpReply(200, made))
        )

    batch_env.batch.alter = altering("POST", "/v1/batches", bad_gateway)
    exam(tmp_path / "run", N)
    result = judge()
    assert result.exit_code == 0, result.output
    assert batches_made(batch_env) == 1 and replies[0] == 1  # found by its input file
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert record["calls"] == N


HTML = HttpReply(200, None, {"Content-Type": "text/html"}, b"<html>Bad gateway</html>")


@pytest.mark.parametrize(
    ("method", "path", "change", "said"),
    [
        (
            "GET",
            "/v1/batches/",
            lambda b: HttpReply(200, {**b, "status": None}),
            "without a status",
        ),
        ("GET", "/v1/batches/", lambda b: HttpReply(200, {**b, "output_file_id": 5}), "not text"),
        ("GET", "/v1/batches/", lambda b: HTML, "with a body that is not JSON, not a batch"),
        ("GET", "/v1/batches/", lambda b: HttpReply(200, [b]), "JSON of another shape (list)"),
        ("POST", "/v1/files", lambda f: HttpReply(200, {**f, "id": ""}), "a file without an id"),
        ("POST", "/v1/files", lambda f: HttpReply(200, None, raw=b""), "not JSON"),
    ],
    ids=["status", "output file", "html", "a list", "file id", "empty upload"],
)
def test_a_batch_api_reply_without_what_ragexam_goes_by_is_a_one_line_endpoint_error(
    batch_env: FakeOpenAI,
    tmp_path: Path,
    method: str,
    path: str,
    change: Callable[[Any], HttpReply],
    said: str,
) -> None:
    exam(tmp_path / "run", 3)
    batch_env.batch.alter = altering(method, path, change)
    result = judge()
    assert result.exit_code == 4, result.output
    (line,) = [text for text in result.output.splitlines() if text.startswith("Error:")]
    assert "the endpoint's Batch API" in line and said in " ".join(result.output.split())
    assert batches_made(batch_env) <= 1
    batch_env.batch.alter = None
    assert judge().exit_code == 0  # nothing was lost: the rerun goes on from where it stopped
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(3)}


def test_counts_times_and_errors_it_cannot_read_are_left_out(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    batch_env.responder = by_question
    odd = {"request_counts": {}, "created_at": "today", "expires_at": "soon", "errors": [1]}
    batch_env.batch.alter = altering(
        "GET", "/v1/batches/", lambda batch: HttpReply(200, {**batch, **odd})
    )
    result = judge()
    assert result.exit_code == 0, result.output
    assert {k: float(v["completeness"]) for k, v in judged(tmp_path).items()} == {
        f"q{i}": i / 20 for i in range(N)
    }


def test_a_status_in_capitals_is_read_as_one(batch_env: FakeOpenAI, tmp_path: Path) -> None:
    # Together's Batch API writes COMPLETED: waiting on it for "completed" would never end.
    exam(tmp_path / "run", 3)
    batch_env.batch.alter = altering(
        "GET",
        "/v1/batches/",
        lambda batch: HttpReply(200, {**batch, "status": batch["status"].upper()}),
    )
    result = judge()
    assert result.exit_code == 0, result.output
    assert {row["status"] for row in judged(tmp_path).values()} == {"ok"}


def test_a_state_the_batch_api_does_not_have_is_waited_out_and_said_once(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 3)
    looks: list[int] = []

    def paused_at_first(batch: dict[str, Any]) -> HttpReply:
        looks.append(1)
        return HttpReply(200, {**batch, "status": "paused"} if len(looks) <= 4 else batch)

    batch_env.batch.alter = altering("GET", "/v1/batches/", paused_at_first)
    result = judge()
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "'paused'" in line]
    assert len(said) == 1 and "a state OpenAI's Batch API does not have" in said[0]
    assert len(looks) > 4 and {row["status"] for row in judged(tmp_path).values()} == {"ok"}


@pytest.mark.parametrize("status", [404, 405])
def test_an_endpoint_without_a_batch_api_is_told_to_use_batch_dir(
    batch_env: FakeOpenAI, tmp_path: Path, status: int
) -> None:
    exam(tmp_path / "run", 3)
    no_api = HttpReply(status, None, raw=b"")
    batch_env.batch.alter = altering("POST", "/v1/files", lambda _: no_api)
    result = judge()
    assert result.exit_code == 4, result.output
    assert sum(text.startswith("Error:") for text in result.output.splitlines()) == 1
    said = " ".join(result.output.split())
    assert "the endpoint has no Batch API" in said and "/v1/files" in said
    assert "--batch-dir" in said and batches_made(batch_env) == 0
    # the advice works: nothing was sent, so nothing is "out in a batch" to refuse it for
    files = run_cli("judge", "--out", "run", "--controls", "0", "--batch-dir", "files")
    assert files.exit_code == 75, files.output
    written = [line for path in (tmp_path / "files" / "requests").glob("*.jsonl")
               for line in path.read_bytes().splitlines()]  # fmt: skip
    assert len(written) == 3


def test_requests_never_sent_whose_rows_another_road_took_are_not_counted_sent(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # The shard the first run wrote never reached the endpoint; the sync road took one of its
    # rows and dropped it. The job's record counted its three requests as sent all the same:
    # "5 requests sent" where the server ran 2.
    exam(tmp_path / "run", 3)
    no_api = HttpReply(404, None, raw=b"")
    batch_env.batch.alter = altering("POST", "/v1/files", lambda _: no_api)
    assert judge().exit_code == 4
    batch_env.batch.alter = None
    synced = run_cli("judge", "--out", "run", "--controls", "0", "--limit", "1")
    assert synced.exit_code == 0, synced.output
    result = judge()
    assert result.exit_code == 0, result.output
    assert len(batch_env.batch_requests) == 2 and len(judged(tmp_path)) == 3
    assert manifest(tmp_path)["stages"]["judge"]["batch"]["requests"] == 2
    assert "2 requests sent, 2 merged" in " ".join(result.output.split())


def test_an_endpoint_nothing_answers_at_is_named_with_the_setting_to_check(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said "the endpoint's Batch API failed: cannot connect to the endpoint: Connection
    # refused", naming neither the URL nor the setting, as the sync road does.
    exam(tmp_path / "run", 3)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    result = judge()
    assert result.exit_code == 4, result.output
    (said,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert said.startswith(f"Error: the endpoint's Batch API at {url} failed: cannot connect")
    assert said.endswith("; check OPENAI_BASE_URL and that it is up")


def without_the_limit(method: str, path: str, reply: HttpReply) -> HttpReply:
    """A Batch API whose refusals name no limit: 'Limit: N enqueued tokens.' taken out."""
    errors = (reply.payload or {}).get("errors") if isinstance(reply.payload, dict) else None
    if not errors:
        return reply
    data = [{**e, "message": re.sub(r"Limit: [\d,]+ enqueued tokens\. ", "", e["message"])}
            for e in errors["data"]]  # fmt: skip
    return replace(reply, payload={**reply.payload, "errors": {**errors, "data": data}})


@pytest.mark.parametrize("named", [True, False], ids=["limit-named", "no-limit-named"])
def test_a_shard_more_than_the_queue_holds_goes_out_in_batches_that_fit(
    batch_env: FakeOpenAI, tmp_path: Path, named: bool
) -> None:
    # A low tier's enqueued-token limit (2M tokens for gpt-4o-mini at tier 1) is below one
    # shard of judge requests: resubmitted whole, it was refused until the run gave up. Cut
    # to fit the limit the refusal names; else halved while the queue refuses it alone.
    batch_env.batch.alter = None if named else without_the_limit
    exam(tmp_path / "run", N)
    assert run_cli("judge", "--out", "run", "--controls", "0", "--batch-dir", "d").exit_code == 75
    (written,) = (tmp_path / "d" / "requests").glob("*.jsonl")
    per_line = written.stat().st_size / N / 4  # tokens a request counts for, at the server
    batch_env.batch.queue_tokens = int(per_line * 5)  # five requests fit, not twelve
    shutil.rmtree(tmp_path / "d")
    (tmp_path / "run" / "batches" / "judge.jsonl").unlink()
    result = judge()
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"refused a batch of {N} requests (token_limit_exceeded), more than" in said
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    sizes = [e["lines"] for e in ledger_events(tmp_path / "run" / "batches" / "judge.jsonl")
             if e["event"] == "shard"]  # fmt: skip
    assert sizes[0] == N and sizes == sorted(sizes, reverse=True)  # cut, never grown again
    ran = Counter(line.batch_id for line in batch_env.batch_requests)
    assert all(lines <= 5 for lines in ran.values()) and sum(ran.values()) == N
    assert manifest(tmp_path)["stages"]["judge"]["batch"]["requests"] == N  # not the refused
    assert f"{N} requests sent, {N} merged" in said


def refused_for_good(batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`judge --batch` on N rows against a queue that refuses every batch (3 refusals end it)."""
    monkeypatch.setattr(batchwait, "RESUBMITS", 3)
    batch_env.batch.fail_validation = "token_limit_exceeded"
    exam(tmp_path / "run", N)
    return judge()


def test_a_queue_that_stays_full_leaves_its_rows_to_the_sync_road(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every batch was refused: nothing is out, nothing was paid. The sync road was refused
    # all the same, as if its requests were out in a batch to collect.
    assert refused_for_good(batch_env, tmp_path, monkeypatch).exit_code == 4
    dry = run_cli("judge", "--out", "run", "--controls", "0", "--dry-run")  # as the sync road
    assert f"judge: {N} rows to do" in " ".join(dry.output.split()), dry.output
    sync = run_cli("judge", "--out", "run", "--controls", "0")
    assert sync.exit_code == 0, sync.output
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    assert batch_env.count() == N and not batch_env.batch_requests
    again = judge()  # and --batch has nothing left to send: the refused shard was dropped
    assert again.exit_code == 0 and "nothing to do" in again.output
    # refused whole twice, then as two halves (refused alone again: halved), none run
    assert batches_made(batch_env) == 4 and not batch_env.batch_requests


def test_a_queue_that_stays_full_stops_the_stage_with_its_rows_still_to_do(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = refused_for_good(batch_env, tmp_path, monkeypatch)
    assert result.exit_code == 4, result.output
    said = " ".join(result.output.split())
    assert "queue of batches is full (token_limit_exceeded), 3 times in this run" in said
    assert "rerun later" in said and not judged(tmp_path)  # no row is made an error
    batch_env.batch.fail_validation = None
    assert judge().exit_code == 0
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def in_flight(sdk: openai.OpenAI) -> frozenset[str]:
    """The stages (batch tags) whose batches the server has not ended."""
    batches = sdk.batches.list(limit=100).data
    return frozenset(
        (batch.metadata or {})["ragexam_shard"].rsplit("-", 1)[0]
        for batch in batches
        if batch.status not in batchwait.TERMINAL
    )


def stepped(server: FakeOpenAI, thread: threading.Thread) -> list[frozenset[str]]:
    """Run the batches a step at a time until the command ends: the stages in flight together
    at each step."""
    sdk = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    seen, last = [], None
    while thread.is_alive():
        time.sleep(0.1)
        now = in_flight(sdk)
        if now != last:  # still sending (a loaded machine): what is sent at once is out when
            last = now  # the stages in flight hold still for a tenth of a second
            continue
        seen.append(now)
        server.advance_batches(1)
    return seen


def test_the_grades_and_controls_batches_run_at_once_and_report_as_one_run(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(display, "PLAIN_EVERY", 0.05)
    batch_env.batch.manual = True
    exam(tmp_path / "run", 4)
    thread, results = run_in_thread("judge", "--out", "run", "--controls", "1", "--batch")
    together = stepped(batch_env, thread)
    thread.join(30)
    output = results[0].output
    assert results[0].exit_code == 0, output
    assert {"judge", "judge_controls"} in together  # neither waited for the other's turn
    # while the grades' batch is waited on, the controls' is said to be out, not out of sight
    assert "1 batch of the run's other stages out beside, collected next" in output
    stages = manifest(tmp_path)["stages"]
    for stage in ("judge", "judge_controls"):
        record = stages[stage]
        assert record["status"] == "finished" and record["rows_ok"] > 0, stage
        assert record["batch"]["runs"] == 1 and record["batch"]["batches"] == 1, stage
        assert record["batch"]["rounds"] == 2, stage  # one that sends, one that merges
    said = " ".join(output.split())
    assert said.count("batches: 1 made") == 2 and "runs of this batch job" not in said
    assert said.count("judge: 4 ok") == 1 and said.count("judge controls: 8 ok") == 1
    assert Counter(custom_key(line.custom_id) for line in batch_env.batch_requests).total() == 12


def test_run_sends_the_answers_of_its_control_runs_at_once_then_their_judges(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    batch_env.embedding_dim = 16
    batch_env.batch.manual = True
    thread, results = run_in_thread(
        "run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e",
        "--controls", "1", "--control-runs", "--batch",
    )  # fmt: skip
    together = stepped(batch_env, thread)
    thread.join(30)
    assert results[0].exit_code == 0, results[0].output
    waves = [stages for stages in dict.fromkeys(together) if len(stages) > 1]
    assert {"answer", "gold.answer", "closed_book.answer"} in waves
    assert {"judge", "judge_controls", "gold.judge", "closed_book.judge"} in waves
    for folder in ("run", "run/gold", "run/closed_book"):
        rows = read_csv(tmp_path / folder / "judgments.csv")
        assert len(rows) == 3 and all(row["status"] == "ok" for row in rows)
        stages = json.loads((tmp_path / folder / "manifest.json").read_text())["stages"]
        for stage in ("answer", "judge"):  # a pass that sends, one that merges: no more
            assert stages[stage]["batch"]["rounds"] == 2, (folder, stage)
    assert batch_env.count() == 0 and (tmp_path / "run" / "summary.csv").exists()


def test_rows_redone_after_an_edit_are_said_when_the_grades_go_out_beside_the_controls(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 4)
    args = ("judge", "--out", "run", "--controls", "1", "--batch")
    assert run_cli(*args).exit_code == 0
    edit_cell(tmp_path / "run" / "answers.csv", "q0", "answer", "Another answer.")
    result = run_cli(*args)  # the send phase finds the edit: the run that waits says it
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "judge: 1 ok, 0 errors this run (3 " in said and "1 rows redone" in said
    assert "judge controls: nothing to do (8 rows done before)" in said
    record = manifest(tmp_path)["stages"]["judge"]
    assert record["rows_redone"] == 1 and record["rows_done_before"] == 3


def test_the_grades_are_recorded_and_said_when_the_controls_batch_cannot_be_waited_on(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "2")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "8")
    server = batch_env.batches
    batch_env.batch.retrieve_status = lambda batch_id, poll: (
        503 if server.shard_of(batch_id).startswith("judge_controls") else None
    )
    exam(tmp_path / "run", 4)
    result = run_cli("judge", "--out", "run", "--controls", "1", "--batch")
    assert result.exit_code == 4, result.output  # the controls' batch goes on, out of sight
    said = " ".join(result.output.split())
    assert "judge: 4 ok" in said and "judge controls:" not in said
    record = manifest(tmp_path)
    assert record["stages"]["judge"]["cost_usd"] > 0 and record["cost_usd"] > 0


def generated(server: FakeOpenAI, tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """An exam of a store of three documents, written through batches (exam/qa_dataset.csv),
    and the options that answer it from that store through batches."""
    store = build_store(tmp_path / "store", docs(3))
    server.embedding_dim = 16
    common = ("--chroma", str(store), "--embedding", "openai:e", "--batch")
    assert run_cli("generate", "--out", "exam", *common).exit_code == 0
    return tmp_path / "exam" / "qa_dataset.csv", common


@pytest.mark.parametrize("fails", [False, True], ids=["every-key-point", "one-fails"])
def test_run_writes_the_shared_key_points_once_then_sends_the_four_judges_at_once(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    exam_file, common = generated(batch_env, tmp_path)
    write_dict_rows(exam_file, [{**row, "key_points": ""} for row in read_csv(exam_file)])
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    if fails:  # one question's key points fail for good: an error row, paid once, said once
        first = read_csv(exam_file)[0]["qa_id"]
        batch_env.batch.fail_line_if = lambda custom_id, body: (
            400 if custom_id.startswith("key_points~") and custom_key(custom_id) == first else None
        )
    batch_env.batch.manual = True
    thread, results = run_in_thread(
        "run", "--qa-dataset", str(exam_file), "--out", "run", "--controls", "1",
        "--control-runs", "--scale", "key-points", "--max-error-rate", "0.5", *common,
    )  # fmt: skip
    together = stepped(batch_env, thread)
    thread.join(30)
    assert results[0].exit_code == 0, results[0].output
    waves = list(dict.fromkeys(stages for stages in together if stages))
    assert waves.index(frozenset({"key_points"})) < waves.index(
        frozenset({"judge", "judge_controls", "gold.judge", "closed_book.judge"})
    )
    said = results[0].output
    assert said.count("they were written once into") == 1, said
    assert len(re.findall(r"^key points: \d+ ok", said, re.MULTILINE)) == 1, said
    asked = Counter(line.custom_id for line in batch_env.batch_requests)
    assert all(times == 1 for custom_id, times in asked.items() if "key_points~" in custom_id)
    for folder in ("run", "run/gold", "run/closed_book"):
        rows = read_csv(tmp_path / folder / "judgments.csv")
        graded = [row for row in rows if row["status"] == "ok"]
        assert len(graded) == 3 - fails and all(json.loads(r["key_point_verdicts"]) for r in graded)


def test_the_store_read_from_a_snapshot_is_said_once_when_the_answers_go_out_at_once(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam_file, common = generated(batch_env, tmp_path)
    result = run_cli(
        "run", "--qa-dataset", str(exam_file), "--out", "run", "--controls", "0",
        "--control-runs", *common,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    store = tmp_path / "store"
    assert result.output.count(f"reading a snapshot of {store}") == 1, result.output


def test_an_error_row_of_an_earlier_run_is_retried_when_the_grades_go_out_beside_the_controls(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 4)
    args = ("judge", "--out", "run", "--controls", "1", "--batch")

    def refuse_q1(body: dict[str, Any]) -> Reply | None:
        return Reply(status=400) if number(body, "Question") == 1 else None

    batch_env.responder = refuse_q1
    assert run_cli(*args).exit_code == 1  # one error row in four
    batch_env.responder = None
    result = run_cli(*args)  # the send phase puts the error row back: the run that waits retries it
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in judged(tmp_path).values()] == ["ok"] * 4
    assert lines_per_row(batch_env)["q1"] == 2  # the 400, then once more: not every rerun
    assert run_cli(*args).exit_code == 0 and lines_per_row(batch_env)["q1"] == 2


def request_bytes(tmp_path: Path, rows: int, args: tuple[str, ...]) -> dict[str, int]:
    """The bytes of each stage's requests for an exam of `rows` (written once to files, then
    forgotten): what a queue limit is set against."""
    exam(tmp_path / "run", rows)
    assert run_cli(*args, "--batch-dir", "d").exit_code == 75
    requests = (tmp_path / "d" / "requests").glob("*.jsonl")
    size = {path.name.split("-")[0]: path.stat().st_size for path in requests}
    shutil.rmtree(tmp_path / "d")
    shutil.rmtree(tmp_path / "run" / "batches")
    return size


def test_a_batch_refused_while_another_stages_filled_the_queue_is_sent_again_whole(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # The grades' and the controls' batches go out at once: a low tier's queue holds either,
    # not both. The controls' refusal is the grades' doing: neither cut (its size estimated
    # from its bytes, roughly, is over the limit) nor counted toward giving up.
    args = ("judge", "--out", "run", "--controls", "1")
    size = request_bytes(tmp_path, 3, args)
    controls = size["judge_controls"] / 4  # what the server counts: the estimate is above it
    batch_env.batch.queue_tokens = int(controls * 1.1)  # either fits alone, not both at once
    assert (size["judge"] + size["judge_controls"]) / 4 > batch_env.batch.queue_tokens
    batch_env.batch.queue_shared = batch_env.batch.manual = True
    thread, results = run_in_thread(*args, "--batch")
    stepped(batch_env, thread)
    thread.join(30)
    assert results[0].exit_code == 0, results[0].output
    events = ledger_events(tmp_path / "run" / "batches" / "judge_controls.jsonl")
    assert [e["event"] for e in events].count("resubmit") >= 1  # it was refused, once at least
    assert "dropped" not in [e["event"] for e in events]
    assert [e["lines"] for e in events if e["event"] == "shard"] == [8]
    rows = read_csv(tmp_path / "run" / "judge_controls.csv")
    assert len(rows) == 8 and all(row["status"] == "ok" for row in rows)


ENDS = ("completed_at", "failed_at", "expired_at", "cancelled_at", "finalizing_at")


def without_end_times(method: str, path: str, reply: HttpReply) -> HttpReply:
    """A Batch API that says when a batch was made, never when it ended."""

    def timeless(batch: Any) -> Any:
        if isinstance(batch, dict) and batch.get("object") == "batch":
            return {**batch, **dict.fromkeys(ENDS)}
        return batch

    payload = reply.payload
    if not path.startswith("/v1/batches") or not isinstance(payload, dict):
        return reply
    if payload.get("object") == "list":
        return replace(reply, payload={**payload, "data": [timeless(b) for b in payload["data"]]})
    return replace(reply, payload=timeless(payload))


def test_a_shard_the_queue_never_holds_is_cut_though_a_sibling_ended_without_a_time(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controls' batch ended (uncollected: the grades are waited on first) and the endpoint
    # gives no end times: it is no batch in the queue, and the grades' shard, refused alone,
    # is cut to fit, not resubmitted whole for ever.
    monkeypatch.setattr(batchwait, "RESUBMITS", 3)
    args = ("judge", "--out", "run", "--controls", "1")
    size = request_bytes(tmp_path, 40, args)
    batch_env.batch.queue_tokens = int(size["judge"] / 4 / 2)  # the grades' never fit whole
    assert size["judge_controls"] / 4 < batch_env.batch.queue_tokens
    batch_env.batch.alter = without_end_times
    thread, results = run_in_thread(*args, "--batch")
    thread.join(30)
    assert not thread.is_alive() and results[0].exit_code == 0, results and results[0].output
    events = [e["event"] for e in ledger_events(tmp_path / "run" / "batches" / "judge.jsonl")]
    assert "dropped" in events and events.count("resubmit") <= 3
    assert all(row["status"] == "ok" for row in judged(tmp_path).values())


def test_a_stage_over_its_error_rate_leaves_the_others_of_its_group_written(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The exam's grades end over --max-error-rate; the control runs' batches went out beside
    # them, paid for: their rows are written by the same command, not one rerun each.
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    exam_file, common = generated(batch_env, tmp_path)
    first = read_csv(exam_file)[0]["qa_id"]
    batch_env.batch.fail_line_if = lambda custom_id, body: (
        400 if custom_id.startswith("judge~") and custom_key(custom_id) == first else None
    )
    result = run_cli(
        "run", "--qa-dataset", str(exam_file), "--out", "run", "--controls", "0",
        "--control-runs", *common,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert [row["status"] for row in read_csv(tmp_path / "run" / "judgments.csv")].count("ok") == 2
    for folder in ("gold", "closed_book"):
        rows = read_csv(tmp_path / "run" / folder / "judgments.csv")
        assert len(rows) == 3 and all(row["status"] == "ok" for row in rows), folder


def test_a_batched_command_rerun_with_nothing_to_do_adds_nothing_to_the_total(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the send phase left each stage's record unpriced: an idle rerun counted every
    # stage's job again, and each rerun once more
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "1")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "4")
    exam(tmp_path / "run", 4)
    command = ("judge", "--out", "run", "--controls", "1", "--batch")
    assert run_cli(*command).exit_code == 0
    first = manifest(tmp_path)["cost_usd"]
    assert first > 0
    for _ in range(2):
        again = run_cli(*command)
        assert again.exit_code == 0, again.output
        assert manifest(tmp_path)["cost_usd"] == pytest.approx(first)


def test_a_run_of_a_mistyped_model_that_made_no_call_leaves_the_total_known(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it billed nothing at no known price: its cost was unknown, and so the total for good
    env.quirks.serves = frozenset({"gpt-4o-mini"})
    exam(tmp_path / "run", 3)
    judged = ("judge", "--out", "run", "--controls", "0")
    assert run_cli(*judged).exit_code == 0
    total = manifest(tmp_path)["cost_usd"]
    assert total > 0
    assert run_cli(*judged, "--model", "gpt-4o-mnii", "--force").exit_code == 2
    assert manifest(tmp_path)["cost_usd"] == pytest.approx(total)
    assert run_cli(*judged, "--force").exit_code == 0
    assert manifest(tmp_path)["cost_usd"] == pytest.approx(2 * total)  # graded twice, paid twice
