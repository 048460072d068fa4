"""A kill -9 at each step of the batch road, then a rerun: no row paid for twice, and the
stage's record bills the whole job, as its rows do (docs/cost.md).

Each kill is made by tests/dying.py, in a child process that dies at an exact step (a row
settled, a ledger event on disk), as `kill -9` would there: nothing flushed or closed after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
from batch_api import HttpReply
from openai_server import FakeOpenAI, Reply
from support import custom_key, exam, grade, read_csv, run_batch_files, run_cli

from ragexam.llm.batchapi import BatchApi
from ragexam.stages import replay

N = 12
JUDGE = ("judge", "--out", "run", "--controls", "0", "--batch")
DIR_JUDGE = ("judge", "--out", "run", "--controls", "0", "--batch-dir", "files")
HERE = Path(__file__).parent
KILLED, WAITING = 137, 75


@pytest.fixture
def batch_env(env: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    monkeypatch.setenv("RAGEXAM_BATCH_POLL", "0.02")
    return env


def killed_at(
    point: str, n: int, *args: str, held: int | None = None, shard_lines: int | None = None
) -> int:
    """Run ragexam in a child that dies at `point` (see tests/dying.py); its exit code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    if held is not None:
        env["RAGEXAM_TEST_HELD_BYTES"] = str(held)
    if shard_lines is not None:
        env["RAGEXAM_TEST_SHARD_LINES"] = str(shard_lines)
    command = [sys.executable, str(HERE / "dying.py"), point, str(n), *args]
    return subprocess.run(command, env=env, capture_output=True, timeout=120).returncode


def cut_then_grade(body: dict[str, Any]) -> Reply:
    """A first ask's reply is cut off at max_tokens; a re-ask's is a grade."""
    if "cut off" in json.dumps(body):
        return grade(body, 0.5)
    return Reply(content='{"reasoning": "' + "very " * 400)


def lines_per_row(server: FakeOpenAI) -> Counter[str]:
    return Counter(custom_key(line.custom_id) for line in server.batch_requests)


def record_of(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]  # type: ignore[no-any-return]


def rows(tmp_path: Path) -> list[dict[str, str]]:
    return read_csv(tmp_path / "run" / "judgments.csv")


def results_file(env: FakeOpenAI, tmp_path: Path) -> Path:
    """--batch-dir on an exam of N rows, its requests answered: the one results file."""
    exam(tmp_path / "run", N)
    assert run_cli(*DIR_JUDGE).exit_code == WAITING
    run_batch_files(env, tmp_path / "files")
    (path,) = (tmp_path / "files" / "results").iterdir()
    return path


def assert_billed_as_the_rows(tmp_path: Path, calls: int) -> None:
    """The record's calls, and tokens equal to the sums of the rows' (every row ok)."""
    found, record = rows(tmp_path), record_of(tmp_path)
    assert len(found) == N and all(row["status"] == "ok" for row in found)
    billed = {
        "prompt": sum(int(row["prompt_tokens"]) for row in found),
        "completion": sum(int(row["completion_tokens"]) for row in found),
    }
    assert record["tokens_billed"] == billed, record
    assert record["calls"] == calls and record["batch"]["results_merged"] == calls, record


def test_killed_mid_merge_the_rerun_bills_the_rows_written_before(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("settle", 6, *JUDGE, held=1) == KILLED  # 6 rows on disk, not recorded
    assert 0 < len(rows(tmp_path)) < N
    assert run_cli(*JUDGE).exit_code == 0
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert_billed_as_the_rows(tmp_path, N)
    assert record_of(tmp_path)["batch"]["runs"] == 2


def test_killed_as_a_pass_is_recorded_no_row_is_asked_twice(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    # each row: a cut-off reply (carried), then a re-ask. Killed as the second pass has
    # recorded its merge, the rerun has the first replies carried, and asks for nothing again
    batch_env.responder = cut_then_grade
    exam(tmp_path / "run", N)
    assert killed_at("event:merged", 2, *JUDGE) == KILLED
    assert run_cli(*JUDGE).exit_code == 0
    assert lines_per_row(batch_env) == {f"q{i}": 2 for i in range(N)}
    assert_billed_as_the_rows(tmp_path, 2 * N)


def test_killed_once_the_last_pass_is_recorded_the_rerun_shows_the_whole_job(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("event:merged", 2, *JUDGE) == KILLED  # every row written and recorded
    assert len(rows(tmp_path)) == N
    result = run_cli(*JUDGE)
    assert result.exit_code == 0 and "nothing to do" in result.output
    assert_billed_as_the_rows(tmp_path, N)
    assert record_of(tmp_path)["cost_usd"] > 0


def test_a_rerun_with_nothing_to_do_keeps_the_jobs_record(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert run_cli(*JUDGE).exit_code == 0
    first = record_of(tmp_path)
    again = run_cli(*JUDGE)
    assert again.exit_code == 0 and "nothing to do" in again.output
    record = record_of(tmp_path)
    for name in ("calls", "tokens_billed", "cost_usd"):
        assert record[name] == first[name] and first[name], name
    assert record["batch"]["runs"] == first["batch"]["runs"] == 1
    assert record["batch"]["rounds"] == first["batch"]["rounds"]
    assert record["batch"]["seconds"] == first["batch"]["seconds"] is not None


def test_killed_once_its_batch_is_made_the_rerun_times_the_batch(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("event:submitted", 1, *JUDGE) == KILLED
    assert run_cli(*JUDGE).exit_code == 0
    batch = record_of(tmp_path)["batch"]
    assert batch["runs"] == 2 and batch["batches"] == 1
    assert batch["seconds"] is not None  # from the first batch made to the last ended
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_results_of_rows_a_smaller_limit_leaves_out_are_kept_not_bought_again(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exam(tmp_path / "run", N)
    real = BatchApi.download

    async def ctrl_c(self: BatchApi, *args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(BatchApi, "download", ctrl_c)
    assert run_cli(*JUDGE).exit_code == 130  # every row's batch line paid for
    monkeypatch.setattr(BatchApi, "download", real)
    assert run_cli(*JUDGE, "--limit", "6").exit_code == 0
    assert len(rows(tmp_path)) == 6
    assert run_cli(*JUDGE).exit_code == 0
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert_billed_as_the_rows(tmp_path, N)


# -- --batch-dir --------------------------------------------------------------------------------


def test_batch_dir_killed_as_a_pass_is_recorded_bills_its_results_once(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.responder = cut_then_grade
    results_file(env, tmp_path)
    assert killed_at("event:merged", 1, *DIR_JUDGE) == KILLED  # merged: re-asks written
    assert run_cli(*DIR_JUDGE).exit_code == WAITING  # the same file is not read again
    run_batch_files(env, tmp_path / "files")
    assert run_cli(*DIR_JUDGE).exit_code == 0
    assert_billed_as_the_rows(tmp_path, 2 * N)


def test_batch_dir_lines_the_engine_writes_while_it_merges_are_merged_next_run(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = results_file(env, tmp_path)
    whole = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(whole[:6]))  # the engine has written half its output so far
    real = replay.ResultIndex.__init__

    def then_the_engine_writes_on(self: replay.ResultIndex, *args: Any) -> None:
        real(self, *args)
        with path.open("ab") as handle:
            handle.write(b"".join(whole[6:]))

    monkeypatch.setattr(replay.ResultIndex, "__init__", then_the_engine_writes_on)
    assert run_cli(*DIR_JUDGE).exit_code == WAITING
    assert len(rows(tmp_path)) == 6
    monkeypatch.setattr(replay.ResultIndex, "__init__", real)
    assert run_cli(*DIR_JUDGE).exit_code == 0
    assert_billed_as_the_rows(tmp_path, N)


def test_batch_dir_a_result_file_named_in_another_encoding_is_merged(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert run_cli(*DIR_JUDGE).exit_code == WAITING
    run_batch_files(env, tmp_path / "files")
    results = tmp_path / "files" / "results"
    for path in results.iterdir():  # a Latin-1 name, as copied from another machine
        path.rename(results / os.fsdecode(b"r\xe9sultats-" + os.fsencode(path.name)))
    result = run_cli(*DIR_JUDGE)
    assert result.exit_code == 0, result.output
    assert run_cli(*DIR_JUDGE).exit_code == 0  # and the ledger reads back what it wrote
    assert_billed_as_the_rows(tmp_path, N)


def test_batch_dir_a_request_answered_in_two_files_is_merged_and_billed_once(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    path = results_file(env, tmp_path)
    results = path.parent
    (results / "copy.jsonl").write_bytes(path.read_bytes())  # the same results, twice
    assert run_cli(*DIR_JUDGE).exit_code == 0
    assert_billed_as_the_rows(tmp_path, N)


def test_batch_dir_results_of_requests_no_longer_made_are_said_unused_and_billed(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Their answers changed after their requests went out: the 4 results are not used, but
    # they were paid for, and the record bills them beside the rows' own.
    first = results_file(env, tmp_path)
    changed = {f"q{i}" for i in range(4)}
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    paid = [
        line["response"]["body"]["usage"]
        for line in lines
        if custom_key(line["custom_id"]) in changed
    ]
    exam(tmp_path / "run", N, answers={i: f"A new answer #{i}." for i in range(4)})
    result = run_cli(*DIR_JUDGE)
    assert result.exit_code == WAITING  # the 4 changed rows are asked again, rightly
    said = " ".join(result.output.split())
    assert "4 rows have results for requests they no longer make" in said
    assert len(rows(tmp_path)) == N - 4
    run_batch_files(env, tmp_path / "files")
    last = run_cli(*DIR_JUDGE)
    assert last.exit_code == 0, last.output
    found, record = rows(tmp_path), record_of(tmp_path)
    assert len(found) == N and all(row["status"] == "ok" for row in found)
    assert record["calls"] == record["batch"]["results_merged"] == N + 4
    # the cost line says which tokens it priced: the rows' own count leaves the 4 unused out
    billed = record["tokens_billed"]
    said = " ".join(last.output.split())
    assert f"for {billed['prompt']:,} in + {billed['completion']:,} out billed" in said
    assert record["tokens_billed"] == {
        "prompt": sum(int(row["prompt_tokens"]) for row in found)
        + sum(usage["prompt_tokens"] for usage in paid),
        "completion": sum(int(row["completion_tokens"]) for row in found)
        + sum(usage["completion_tokens"] for usage in paid),
    }


def test_results_asked_of_another_model_are_said_so_by_name(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # The user forgot the `export RAGEXAM_MODEL=...` that the requests were made with: the
    # warning names the two models, not a list of what might have changed.
    exam(tmp_path / "run", N)
    assert run_cli(*DIR_JUDGE, "--model", "model-a").exit_code == WAITING
    run_batch_files(env, tmp_path / "files")
    result = run_cli(*DIR_JUDGE, "--model", "model-b")
    assert result.exit_code == WAITING, result.output
    said = " ".join(result.output.split())
    assert f"{N} rows have results for requests they no longer make" in said
    assert "(they were asked of the model model-a; this run asks model-b)" in said


def test_batch_dir_a_smaller_limit_ends_the_loop_and_the_rest_is_not_bought_again(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert run_cli(*DIR_JUDGE).exit_code == WAITING
    answered = run_batch_files(env, tmp_path / "files")  # every request answered
    # the 6 rows a smaller --limit leaves out have their results carried: nothing waits
    assert run_cli(*DIR_JUDGE, "--limit", "6").exit_code == 0
    assert not list((tmp_path / "files" / "requests").glob("*.jsonl"))  # moved to done/
    assert run_cli(*DIR_JUDGE).exit_code == 0  # the other 6, from what was carried
    assert answered == N and run_batch_files(env, tmp_path / "files") == 0
    assert_billed_as_the_rows(tmp_path, N)


def test_batch_dir_a_file_run_again_under_another_name_is_billed_once(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    path = results_file(env, tmp_path)
    results = path.parent
    whole = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(whole[:6]))  # the machine died halfway
    assert run_cli(*DIR_JUDGE).exit_code == WAITING
    (results / "again.jsonl").write_bytes(b"".join(whole))  # the file run again, renamed
    assert run_cli(*DIR_JUDGE).exit_code == 0
    assert_billed_as_the_rows(tmp_path, N)


def test_batch_dir_killed_as_a_shard_resolves_its_file_is_not_run_again(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.responder = cut_then_grade
    results_file(env, tmp_path)
    assert killed_at("event:resolved", 1, *DIR_JUDGE) == KILLED
    assert run_cli(*DIR_JUDGE).exit_code == WAITING
    left = sorted(path.name for path in (tmp_path / "files" / "requests").glob("*.jsonl"))
    assert left == ["judge-000002.jsonl"]  # the re-asks only: the first file is answered


@pytest.mark.parametrize("road", [(), ("--batch-dir", "files")], ids=["sync", "batch-dir"])
def test_results_downloaded_not_merged_are_merged_by_batch_not_bought_again(
    batch_env: FakeOpenAI, tmp_path: Path, road: tuple[str, ...]
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("event:ended", 1, *JUDGE) == KILLED  # results on disk, not merged
    other = run_cli("judge", "--out", "run", "--controls", "0", *road)
    assert other.exit_code == 2, other.output
    assert "paid for and not merged yet: rerun with --batch" in " ".join(other.output.split())
    dry = run_cli(*JUDGE, "--dry-run")
    assert "judge: 0 rows to do" in " ".join(dry.output.split())
    assert run_cli(*JUDGE).exit_code == 0 and batch_env.count() == 0
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


@pytest.mark.parametrize("damage", ["gone", "cut"])
def test_a_downloaded_result_file_damaged_before_its_merge_is_downloaded_again(
    batch_env: FakeOpenAI, tmp_path: Path, damage: str
) -> None:
    """Its rows were asked (and paid for) again, without a word, and the job billed less
    than the endpoint had."""
    exam(tmp_path / "run", N)
    assert killed_at("event:ended", 1, *JUDGE) == KILLED  # results on disk, not merged
    (output,) = (tmp_path / "run" / "batches" / "judge").glob("*.output.jsonl")
    if damage == "gone":
        output.unlink()
    else:
        output.write_bytes(output.read_bytes()[: output.stat().st_size // 2])
    again = run_cli(*JUDGE)
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    what = "is gone" if damage == "gone" else "is not whole"
    assert f"{what}: downloaded again from the endpoint" in said
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}  # none asked twice
    assert len(rows(tmp_path)) == N
    assert_billed_as_the_rows(tmp_path, N)


def test_killed_before_its_batch_is_made_the_rerun_times_the_batch_it_makes(
    batch_env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("event:shard", 1, *JUDGE) == KILLED  # the shard written, no batch yet
    assert run_cli(*JUDGE).exit_code == 0
    batch = record_of(tmp_path)["batch"]
    assert batch["seconds"] is not None
    # the killed run wrote the requests and their shard: the job's record counts it
    assert (batch["runs"], batch["requests"], batch["shards"], batch["batches"]) == (2, N, 1, 1)
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
    assert_billed_as_the_rows(tmp_path, N)


def test_batch_dir_killed_between_two_shards_the_record_counts_the_requests_it_wrote(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("event:shard", 2, *DIR_JUDGE, shard_lines=5) == KILLED  # 10 of 12 out
    assert run_cli(*DIR_JUDGE).exit_code == WAITING  # the last 2
    written = sorted((tmp_path / "files" / "requests").glob("*.jsonl"))
    assert [len(path.read_bytes().splitlines()) for path in written] == [5, 5, 2]
    run_batch_files(env, tmp_path / "files")
    assert run_cli(*DIR_JUDGE).exit_code == 0
    batch = record_of(tmp_path)["batch"]
    assert (batch["runs"], batch["requests"], batch["shards"]) == (3, N, 3), batch
    assert batch["results_merged"] == N
    assert_billed_as_the_rows(tmp_path, N)


def test_batches_made_at_another_endpoint_are_named_not_looked_for_here(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exam(tmp_path / "run", N)
    assert killed_at("event:submitted", 1, *JUDGE) == KILLED  # its batch made at batch_env
    with FakeOpenAI() as elsewhere:
        other = elsewhere.base_url
        monkeypatch.setenv("OPENAI_BASE_URL", other)
        result = run_cli(*JUDGE)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"was made at {batch_env.base_url}" in said and other in said
    assert "set OPENAI_BASE_URL back to collect its results" in said
    monkeypatch.setenv("OPENAI_BASE_URL", batch_env.base_url)
    assert run_cli(*JUDGE).exit_code == 0
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_an_endpoint_that_stops_answering_looks_says_the_batches_go_on(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")  # each look once: ten of them fail fast
    down = HttpReply(503, {"error": {"message": "Service unavailable"}})
    batch_env.batch.alter = lambda method, path, reply: (
        down if method == "GET" and path.startswith("/v1/batches/") else reply
    )
    exam(tmp_path / "run", N)
    result = run_cli(*JUDGE)
    assert result.exit_code == 4, result.output
    said = " ".join(result.output.split())
    assert "HTTP 503" in said and "(10 looks in a row)" in said
    assert "the batches go on at the endpoint, paid for; the same command collects them" in said
    batch_env.batch.alter = None
    assert run_cli(*JUDGE).exit_code == 0
    assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}


def test_results_of_a_job_of_another_model_are_billed_at_that_models_price(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch asked of gpt-4o-mini is out; the rerun asks gpt-4o. The mini results it collects
    # answer no row now, and were paid at mini's price: they were priced at gpt-4o's (9 times
    # too dear), and the other way round 9 times too cheap.
    from ragexam.config import Settings
    from ragexam.llm.prices import batch_price

    monkeypatch.setenv("RAGEXAM_JUDGE_MODEL", "gpt-4o-mini")
    exam(tmp_path / "run", N)
    assert killed_at("event:submitted", 1, *JUDGE) == KILLED  # mini's batch out
    monkeypatch.setenv("RAGEXAM_JUDGE_MODEL", "gpt-4o")
    result = run_cli(*JUDGE)
    assert result.exit_code == 0, result.output
    spent: dict[str, list[int]] = {}
    for line in batch_env.batch_requests:
        usage = line.usage or {}
        account = spent.setdefault(line.body["model"], [0, 0, 0])
        account[0] += 1
        account[1] += usage.get("prompt_tokens", 0)
        account[2] += usage.get("completion_tokens", 0)
    assert set(spent) == {"gpt-4o-mini", "gpt-4o"} and spent["gpt-4o"][0] == N
    record = record_of(tmp_path)
    mini = record["billed_elsewhere"]["gpt-4o-mini"]
    assert [mini["calls"], *mini["tokens_billed"].values()] == spent["gpt-4o-mini"]
    assert [record["calls"], *record["tokens_billed"].values()] == spent["gpt-4o"]
    settings = Settings()
    prices = {model: batch_price(model, settings) for model in spent}
    cost = sum(prices[model].cost(*spent[model][1:]) for model in spent)  # type: ignore[union-attr]
    assert record["cost_usd"] == pytest.approx(cost, rel=1e-9)


@pytest.mark.parametrize("road", [("--batch",), ()], ids=["batch", "sync"])
def test_a_refused_shard_made_again_unrecorded_is_found_not_paid_twice(
    batch_env: FakeOpenAI, tmp_path: Path, road: tuple[str, ...]
) -> None:
    # The queue refuses the first batch; the second is made, and the run is killed before the
    # ledger records it. The rerun looked no batch up for a refused shard (it made a third),
    # and the sync road took the refused shard's rows while its batch ran.
    batch_env.batch.fail_validation = "token_limit_exceeded"
    batch_env.batch.fail_validation_count = 1
    exam(tmp_path / "run", N)
    assert killed_at("create", 2, *JUDGE) == KILLED
    result = run_cli("judge", "--out", "run", "--controls", "0", *road)
    if road:
        assert result.exit_code == 0, result.output
        assert lines_per_row(batch_env) == {f"q{i}": 1 for i in range(N)}
        assert batch_env.count() == 0
    else:  # a batch of its requests may be out: the sync road refuses, and pays nothing
        assert result.exit_code == 2 and "are out in a batch" in " ".join(result.output.split())
        assert batch_env.count() == 0
    sdk = openai.OpenAI(base_url=batch_env.base_url, api_key="test", max_retries=0)
    assert len(sdk.batches.list().data) == 2  # the refused one, and the one found again


def test_results_of_another_model_stay_its_own_after_a_run_of_the_new_one_records_its_job(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mini's batch out for 6 rows; a gpt-4o run sends the other 6 and is killed; the next
    # gpt-4o run found the job recorded as gpt-4o's, and priced mini's results at gpt-4o's rate.
    monkeypatch.setenv("RAGEXAM_JUDGE_MODEL", "gpt-4o-mini")
    exam(tmp_path / "run", N)
    assert killed_at("event:submitted", 1, *JUDGE, "--limit", "6") == KILLED
    monkeypatch.setenv("RAGEXAM_JUDGE_MODEL", "gpt-4o")
    assert killed_at("event:submitted", 1, *JUDGE) == KILLED
    result = run_cli(*JUDGE)
    assert result.exit_code == 0, result.output
    asked = Counter(line.body["model"] for line in batch_env.batch_requests)
    assert asked == {"gpt-4o-mini": 6, "gpt-4o": N}
    record = record_of(tmp_path)
    assert record["billed_elsewhere"]["gpt-4o-mini"]["calls"] == 6
    assert record["calls"] == N


def test_batches_the_endpoint_does_not_know_say_so_and_the_way_on(
    batch_env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches recorded, then unknown to the endpoint (another key's project, a proxy that
    purged them): every rerun said they 'go on at the endpoint' and that the same command
    would collect them, which it never could."""
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    gone = HttpReply(404, {"error": {"message": "No batch found with id 'batch_x'."}})
    batch_env.batch.alter = lambda method, path, reply: (
        gone if method == "GET" and path.startswith("/v1/batches/") else reply
    )
    exam(tmp_path / "run", N)
    result = run_cli(*JUDGE)
    assert result.exit_code == 4, result.output
    said = " ".join(result.output.split())
    assert "HTTP 404" in said and "this endpoint knows no batch this folder recorded" in said
    assert "or delete run/batches/judge.jsonl to forget them and send their rows again" in said
    assert "go on at the endpoint" not in said
