"""`--batch-dir DIR`: requests as OpenAI batch input files under DIR/requests/, results merged
from DIR/results/ in OpenAI's or vLLM's output shape; exit 75 while any wait, 0 when done.

(`run_batch_files` writes what `vllm run-batch` writes: tests/batch_api.py records how vLLM's
output differs from OpenAI's; tests/test_vllm_run_batch.py runs a real one, when there is one.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from batch_api import batch_error_line, batch_output_line
from openai_server import FakeOpenAI, Reply
from support import (
    build_store,
    docs,
    exam,
    grade,
    number,
    read_csv,
    run_batch_files,
    run_cli,
    write_dict_rows,
)

from ragexam.stages.runner import Runner

N = 10
WAITING = 75


def judge(*options: str) -> Any:
    return run_cli("judge", "--out", "run", "--controls", "0", "--batch-dir", "files", *options)


def requests(tmp_path: Path) -> list[dict[str, Any]]:
    """Every request line waiting under files/requests/."""
    return [
        json.loads(line)
        for path in sorted((tmp_path / "files" / "requests").glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


def by_question(body: dict[str, Any]) -> Any:
    """Question #i is graded i/20 complete."""
    return grade(body, number(body, "Question") / 20)


def graded_by_question(rows: dict[str, dict[str, str]]) -> bool:
    """Whether every row is there, graded as `by_question` grades it."""
    return {key: float(row["completeness"]) for key, row in rows.items()} == {
        f"q{i}": i / 20 for i in range(N)
    }


def judged(tmp_path: Path) -> dict[str, dict[str, str]]:
    path = tmp_path / "run" / "judgments.csv"
    return {row["qa_id"]: row for row in read_csv(path)} if path.exists() else {}


@pytest.mark.parametrize("shape", ["openai", "vllm"])
def test_the_loop_writes_requests_merges_results_and_ends_at_zero(
    env: FakeOpenAI, tmp_path: Path, shape: str
) -> None:
    exam(tmp_path / "run", N)
    env.responder = by_question
    first = judge()
    assert first.exit_code == WAITING, first.output
    assert "Waiting:" in first.output and f"{N} requests wait" in first.output
    lines = requests(tmp_path)
    assert len(lines) == N and {tuple(line) for line in lines} == {
        ("custom_id", "method", "url", "body")
    }
    assert {(line["method"], line["url"]) for line in lines} == {("POST", "/v1/chat/completions")}
    assert env.count() == 0 and not env.batch_requests  # no chat call of any kind
    assert (tmp_path / "files" / "results").is_dir()  # for the engine: vLLM makes no folder
    again = judge()  # nothing came back yet: nothing is written twice
    assert again.exit_code == WAITING and len(requests(tmp_path)) == N
    assert run_batch_files(env, tmp_path / "files", shape) == N
    done = judge()
    assert done.exit_code == 0, done.output
    rows = judged(tmp_path)
    assert graded_by_question(rows)
    assert requests(tmp_path) == []  # answered files move to requests/done/
    assert len(list((tmp_path / "files" / "requests" / "done").glob("*.jsonl"))) == 1


def test_a_failed_line_goes_out_again_in_a_new_file(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    exam(tmp_path / "run", N)
    assert judge().exit_code == WAITING
    lines = requests(tmp_path)
    results = tmp_path / "files" / "results"
    error = {"error": {"message": "The server had an error.", "type": "server_error"}}
    out = [
        batch_output_line(line["custom_id"], error, status_code=500)
        if i in (1, 2)
        else batch_error_line(line["custom_id"], "batch_expired", "expired")
        if i == 3
        else batch_output_line(line["custom_id"], env.answer_line(line["url"], line["body"])[1])
        for i, line in enumerate(lines)
    ]
    (results / "first.jsonl").write_text("\n".join(reversed(out)) + "\n", encoding="utf-8")
    second = judge()
    assert second.exit_code == WAITING, second.output
    said = " ".join(second.output.split())  # said at once, not once the retries are spent
    assert (
        "3 results merged were failures (most often, 2: HTTP 500: The server had an error.); "
        "each row asks again while its retries last, then is an error row"
    ) in said
    resent = requests(tmp_path)
    assert sorted(line["custom_id"].split("~")[3] for line in resent) == sorted(
        lines[i]["custom_id"].split("~")[3] for i in (1, 2, 3)
    )
    assert len(judged(tmp_path)) == N - 3
    run_batch_files(env, tmp_path / "files", "vllm")
    last = judge()
    assert last.exit_code == 0, last.output
    assert "failure" not in last.output  # the retries' results all came back whole: said once
    rows = judged(tmp_path)
    assert all(row["status"] == "ok" for row in rows.values()) and len(rows) == N
    assert {rows[lines[i]["custom_id"].split("~")[3]]["attempts"] for i in (1, 2, 3)} == {"2"}


def test_vllm_errors_as_objects_or_strings_are_error_rows_with_the_reason(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    judge()
    lines = requests(tmp_path)
    refused = {"error": {"message": "max_tokens is too large", "type": "BadRequestError"}}
    out = []
    for i, line in enumerate(lines):
        if i == 0:
            out.append(batch_output_line(line["custom_id"], refused, status_code=400, shape="vllm"))
        elif i == 1:
            out.append(batch_error_line(line["custom_id"], "", "engine failed", shape="vllm"))
        else:
            answer = env.answer_line(line["url"], line["body"])[1]
            out.append(batch_output_line(line["custom_id"], answer, shape="vllm"))
    (tmp_path / "files" / "results" / "out.jsonl").write_text("\n".join(out) + "\n")
    result = judge("--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    rows = judged(tmp_path)
    first, second = (rows[lines[i]["custom_id"].split("~")[3]] for i in (0, 1))
    assert first["status"] == "error" and "max_tokens is too large" in first["error"]
    assert second["status"] == "error" and "engine failed" in second["error"]
    assert first["completeness"] == second["completeness"] == ""


def test_a_result_file_merged_once_is_not_merged_again(env: FakeOpenAI, tmp_path: Path) -> None:
    # A result that ended a row in error is spent: a rerun retries the row, as on the sync road.
    exam(tmp_path / "run", 3)
    judge()
    lines = requests(tmp_path)
    error = {"error": {"message": "refused", "type": "invalid_request_error"}}
    out = [batch_output_line(line["custom_id"], error, status_code=400) for line in lines]
    (tmp_path / "files" / "results" / "a.jsonl").write_text("\n".join(out) + "\n")
    assert judge("--max-error-rate", "1").exit_code == 0
    assert {row["status"] for row in judged(tmp_path).values()} == {"error"}
    retry = judge("--max-error-rate", "1")
    assert retry.exit_code == WAITING  # the error rows are asked again, in a new file
    assert len(requests(tmp_path)) == 3


def test_needs_no_key_and_no_endpoint(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    exam(tmp_path / "run", 2)
    result = judge()
    assert result.exit_code == WAITING, result.output
    bodies = [line["body"] for line in requests(tmp_path)]
    assert len(bodies) == 2 and all(body["model"] == "gpt-4o-mini" for body in bodies)
    assert "max_completion_tokens" in bodies[0]  # as OpenAI's own endpoint is asked


def test_judge_writes_the_controls_requests_beside_the_grades(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", N)
    result = run_cli("judge", "--out", "run", "--controls", "2", "--batch-dir", "files")
    assert result.exit_code == WAITING
    assert f"{N + 16} requests wait" in result.output  # 2 of each of the 8 kinds
    tags = sorted({line["custom_id"].split("~")[0] for line in requests(tmp_path)})
    assert tags == ["judge", "judge_controls"]
    run_batch_files(env, tmp_path / "files")
    assert (
        run_cli("judge", "--out", "run", "--controls", "2", "--batch-dir", "files").exit_code == 0
    )
    assert len(read_csv(tmp_path / "run" / "judge_controls.csv")) == 16


@pytest.mark.parametrize(
    ("options", "trips"),
    [
        (["--controls", "0"], [["generate"], ["answer"], ["judge"], []]),
        (  # the control runs' answers need only the exam, their judges only their answers
            ["--controls", "1", "--control-runs"],
            [
                ["generate"],
                ["answer", "closed_book.answer", "gold.answer"],
                ["closed_book.judge", "gold.judge", "judge", "judge_controls"],
                [],
            ],
        ),
    ],
)
def test_run_stops_at_the_first_stages_that_wait_each_asked_once(
    env: FakeOpenAI, tmp_path: Path, options: list[str], trips: list[list[str]]
) -> None:
    store = build_store(tmp_path / "store", docs(6))
    env.embedding_dim = 16
    args = ["run", "--chroma", str(store), "--out", "run", *options, "--batch-dir", "files"]
    args += ["--embedding", "openai:e"]
    stages = []
    for _ in range(4):
        result = run_cli(*args)
        stages.append(sorted({line["custom_id"].split("~")[0] for line in requests(tmp_path)}))
        if result.exit_code == 0:
            break
        assert result.exit_code == WAITING, result.output
        run_batch_files(env, tmp_path / "files")
    assert stages == trips
    assert result.exit_code == 0 and (tmp_path / "run" / "summary.csv").exists()
    assert env.count() == 0  # every chat call went through the files
    # each trip round the loop found the stages before its own finished: their records
    # (and the run's total) still bill their batch jobs
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    for stage in ("generate", "answer", "judge"):
        record = manifest["stages"][stage]
        assert record["calls"] > 0 and record["tokens_billed"]["prompt"] > 0, stage
    for control_run in ("gold", "closed_book") if "--control-runs" in options else ():
        manifest = json.loads((tmp_path / "run" / control_run / "manifest.json").read_text())
        for stage in ("answer", "judge"):  # their answers were merged two trips before
            record = manifest["stages"][stage]
            assert record["tokens_billed"]["prompt"] > 0 and record["cost_usd"] > 0, stage


def test_requests_out_in_a_folder_are_collected_from_it_not_elsewhere(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 3)
    assert judge().exit_code == WAITING
    other = run_cli("judge", "--out", "run", "--controls", "0", "--batch")
    assert other.exit_code == 2 and "rerun with --batch-dir" in other.output
    assert not env.batch_requests
    sync = run_cli("judge", "--out", "run", "--controls", "0")  # it would pay for them again
    assert sync.exit_code == 2 and "3 requests of judge are out in" in sync.output
    assert "rerun with --batch-dir" in sync.output and env.count() == 0
    assert not (tmp_path / "run" / "judgments.csv").exists() or not judged(tmp_path)


def test_requests_out_in_one_folder_are_not_waited_for_in_another(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    """--batch-dir other, while the requests are out in files: it exited 75 saying to run the
    files of other/requests/, which held none, and its until-loop never ended."""
    exam(tmp_path / "run", 3)
    assert judge().exit_code == WAITING
    other = run_cli("judge", "--out", "run", "--controls", "0", "--batch-dir", "other")
    assert other.exit_code == 2, other.output
    said = " ".join(other.output.split())
    assert "3 requests of judge are out in" in said and "rerun with --batch-dir" in said
    assert said.rstrip().endswith("rows again)")  # one line, naming the folder and the way on
    assert f"--batch-dir {tmp_path / 'files'}" in said
    assert not (tmp_path / "other" / "requests").exists()
    env.responder = by_question
    assert run_batch_files(env, tmp_path / "files") == 3
    assert judge().exit_code == 0 and len(judged(tmp_path)) == 3


def test_two_run_folders_cannot_share_one_batch_dir(env: FakeOpenAI, tmp_path: Path) -> None:
    """B's judge-000001.jsonl replaced A's (its requests lost without a word), and A then
    merged and billed B's results as results of requests its rows no longer made."""
    exam(tmp_path / "run", 3)
    exam(tmp_path / "other", 3)
    assert judge().exit_code == WAITING
    (sent,) = (tmp_path / "files" / "requests").glob("*.jsonl")
    before = sent.read_bytes()
    other = run_cli("judge", "--out", "other", "--controls", "0", "--batch-dir", "files")
    assert other.exit_code == 2, other.output
    said = " ".join(other.output.split())
    assert "holds files/requests/judge-000001.jsonl, a request file of judge that this run " in said
    assert "folder did not write" in said
    assert sent.read_bytes() == before and len(list(sent.parent.glob("*.jsonl"))) == 1
    env.responder = by_question
    assert run_batch_files(env, tmp_path / "files") == 3
    again = judge()
    assert again.exit_code == 0 and "no longer make" not in again.output
    assert len(judged(tmp_path)) == 3
    # done, its files moved to requests/done/: still not the other run folder's to use
    later = run_cli("judge", "--out", "other", "--controls", "0", "--batch-dir", "files")
    assert later.exit_code == 2 and "did not write" in later.output


@pytest.mark.parametrize("where", ["afile", "afile/sub"])
def test_a_batch_dir_that_is_a_file_is_one_line(
    env: FakeOpenAI, tmp_path: Path, where: str
) -> None:
    """It was 'Internal error: NotADirectoryError ... This is a bug'."""
    exam(tmp_path / "run", 2)
    (tmp_path / "afile").write_text("not a folder")
    result = run_cli("judge", "--out", "run", "--controls", "0", "--batch-dir", where)
    assert result.exit_code == 2, result.output
    assert f"--batch-dir {where}" in result.output and "a file, not a folder" in result.output
    assert "bug" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("inner", ["requests", "results", "requests/done"])
def test_a_file_where_the_batch_dir_keeps_a_folder_is_one_line(
    env: FakeOpenAI, tmp_path: Path, inner: str
) -> None:
    """It was 'Internal error: FileExistsError ... This is a bug'."""
    exam(tmp_path / "run", 2)
    (tmp_path / "files" / inner).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "files" / inner).write_text("not a folder")
    result = run_cli("judge", "--out", "run", "--controls", "0", "--batch-dir", "files")
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"Error: --batch-dir files: {Path('files', inner)} is a file, where ragexam keeps a "
        "folder: move it, or name another --batch-dir"
    ]
    assert (tmp_path / "files" / inner).read_text() == "not a folder"


def test_harder_questions_are_refused_on_the_batch_road_before_any_call(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(4))
    for harder in ("--multi-hop", "--unanswerable"):
        args = ("generate", "--chroma", str(store), "--out", "run", harder, "2")
        result = run_cli(*args, "--batch-dir", "files")
        assert result.exit_code == 2, result.output
        assert "sync road" in " ".join(result.output.split())
    assert env.count() == 0 and not (tmp_path / "run" / "qa_dataset.csv").exists()


def requested(env: FakeOpenAI, tmp_path: Path) -> None:
    """A judge of N rows, graded by question, whose requests wait in files/requests."""
    exam(tmp_path / "run", N)
    env.responder = by_question
    assert judge().exit_code == WAITING


def results_of_every_request(env: FakeOpenAI, tmp_path: Path) -> Path:
    """The one results file of a judge of N rows whose requests the engine has run."""
    requested(env, tmp_path)
    assert run_batch_files(env, tmp_path / "files") == N
    (result,) = (tmp_path / "files" / "results").glob("*.jsonl")
    return result


def test_a_result_file_that_begins_with_a_byte_order_mark_is_merged_whole(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # A tool on Windows may write its output as "UTF-8 with BOM": the first line is read too.
    result = results_of_every_request(env, tmp_path)
    result.write_bytes(b"\xef\xbb\xbf" + result.read_bytes())
    done = judge()
    assert done.exit_code == 0, done.output
    assert graded_by_question(judged(tmp_path))


def test_a_result_line_cut_short_is_said_to_be_cut_and_its_row_waits(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    """An engine's machine stopped while writing its last line: that line was said to be a
    request file's, or another shape than OpenAI's or vLLM's."""
    result = results_of_every_request(env, tmp_path)
    data = result.read_bytes()
    result.write_bytes(data[: len(data) - 200])  # the last line cut 200 bytes short
    cut = judge()
    assert cut.exit_code == WAITING, cut.output
    said = " ".join(cut.output.split())
    assert f"1 line of {result} names a request of this stage but is not whole JSON" in said
    assert "another shape" not in said
    assert len(judged(tmp_path)) == N - 1


def test_result_lines_only_python_reads_are_merged_as_python_reads_them(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # A NaN and a lone surrogate are Python's JSON, not strict JSON: the fast reader refuses
    # such lines, and they are read as before, not lost.
    result = results_of_every_request(env, tmp_path)
    lines = [json.loads(line) for line in result.read_text().splitlines()]
    for at, line in enumerate(lines):
        body = line["response"]["body"]
        body["system_fingerprint"] = float("nan") if at % 2 else "fp_\ud800"
    result.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = judge()
    assert done.exit_code == 0, done.output
    assert graded_by_question(judged(tmp_path)) and len(judged(tmp_path)) == N


def test_a_request_file_put_among_the_results_is_said_and_sends_nothing_again(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Copied the wrong way (or results in a shape of another tool's): its lines carry our
    # custom_ids but no result. It is named; its rows wait on the requests already out.
    requested(env, tmp_path)
    (shard,) = (tmp_path / "files" / "requests").glob("*.jsonl")
    (tmp_path / "files" / "results").mkdir(exist_ok=True)
    copy = tmp_path / "files" / "results" / shard.name
    copy.write_bytes(shard.read_bytes())
    waiting = judge()
    assert waiting.exit_code == WAITING, waiting.output
    said = " ".join(waiting.output.split())
    assert f"{N} lines of {copy} have a custom_id of this stage but no `response`" in said
    assert [path.name for path in (tmp_path / "files" / "requests").glob("*.jsonl")] == [
        shard.name
    ]  # nothing asked again, the shard still waits
    copy.unlink()
    assert run_batch_files(env, tmp_path / "files") == N
    done = judge()
    assert done.exit_code == 0, done.output
    assert graded_by_question(judged(tmp_path)) and record_of(tmp_path)["calls"] == N


def test_lines_that_are_not_results_of_ours_are_passed_over_on_every_run(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # A custom_id whose call number is a Unicode digit ("²" passes isdigit), and a line nested
    # deeper than Python parses under an id of ours: neither is a result; the rest merge.
    requested(env, tmp_path)
    ours = requests(tmp_path)[0]["custom_id"]
    tag, _, digest, key = ours.split("~")
    odd = [
        json.dumps({"custom_id": f"{tag}~²~{digest}~{key}", "response": None}),
        f'{{"custom_id": "{ours}", "response": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ]
    (tmp_path / "files" / "results" / "odd.jsonl").write_text("\n".join(odd) + "\n")
    assert run_batch_files(env, tmp_path / "files") == N
    done = judge()
    assert done.exit_code == 0, done.output
    assert graded_by_question(judged(tmp_path))
    assert judge().exit_code == 0  # and again: nothing left to trip over


def test_results_in_a_subfolder_merge_and_a_file_that_holds_none_is_said(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # results brought back from two machines, each into a folder of its own; and a binary
    # dropped in the results folder. Both once waited unsaid: "N requests wait".
    requested(env, tmp_path)
    run_batch_files(env, tmp_path / "files")
    results = tmp_path / "files" / "results"
    (results / "gpu1").mkdir()
    for path in results.glob("*.jsonl"):
        path.rename(results / "gpu1" / path.name)
    (results / "core.bin").write_bytes(bytes(range(256)) * 4)
    done = judge()
    assert done.exit_code == 0, done.output
    assert graded_by_question(judged(tmp_path))
    said = " ".join(done.output.split())
    assert f"{results / 'core.bin'} holds no line naming a request (custom_id)" in said


def cut_then_grade(body: dict[str, Any]) -> Reply:
    """A first ask's reply is cut off at max_tokens; a re-ask's is a grade."""
    if "cut off" in json.dumps(body):
        return grade(body, 0.5)
    return Reply(content='{"reasoning": "' + "very " * 400)


def test_the_record_and_cost_cover_every_run_of_the_batch_job(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every reply to a first ask is cut off: the job takes three runs (requests, re-asks, the
    # end), and its record bills every one of them, as the rows do.
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "2")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "8")
    exam(tmp_path / "run", N)

    env.responder = cut_then_grade
    first = judge()
    assert first.exit_code == WAITING
    assert f"judge: no row to write yet, {N} requests wait for their results" in first.output
    answered = run_batch_files(env, tmp_path / "files")
    second = judge()
    assert second.exit_code == WAITING, second.output  # the re-asks
    answered += run_batch_files(env, tmp_path / "files")
    done = judge()
    assert done.exit_code == 0, done.output
    rows = judged(tmp_path).values()
    assert len(rows) == N and {row["attempts"] for row in rows} == {"2"}
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    billed = record["tokens_billed"]
    assert billed == {
        "prompt": sum(int(row["prompt_tokens"]) for row in rows),
        "completion": sum(int(row["completion_tokens"]) for row in rows),
    }
    assert record["calls"] == answered == 2 * N
    assert record["batch"]["requests"] == 2 * N and record["batch"]["results_merged"] == 2 * N
    cost = (billed["prompt"] * 2 + billed["completion"] * 8) / 1e6 / 2  # the batch price: half
    assert record["cost_usd"] == pytest.approx(cost)
    assert f"{2 * N} merged over the 3 runs of this batch job" in done.output
    # the folder's total: the job once, not once a run of it
    assert record["spent_usd"] == pytest.approx(cost)
    assert judge().exit_code == 0  # nothing to do: the job's record, and the total, stay
    total = json.loads((tmp_path / "run" / "manifest.json").read_text())["cost_usd"]
    assert total == pytest.approx(cost)
    # A new job, for rows added since, is billed on its own, and the total adds it.
    exam(tmp_path / "run", N + 2)
    assert judge().exit_code == WAITING
    run_batch_files(env, tmp_path / "files")
    judge()
    run_batch_files(env, tmp_path / "files")
    assert judge().exit_code == 0
    whole = json.loads((tmp_path / "run" / "manifest.json").read_text())
    again = whole["stages"]["judge"]
    assert again["calls"] == 4 and again["batch"]["requests"] == 4
    assert whole["cost_usd"] == pytest.approx(cost + again["cost_usd"]) and again["cost_usd"] > 0


def test_a_2xx_result_that_is_not_a_completion_is_asked_again_then_an_error_row(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    exam(tmp_path / "run", 2)
    assert judge().exit_code == WAITING
    for round_ in (1, 2):  # the first ask, then its one retry: each answered 204, no body
        lines = requests(tmp_path)
        assert len(lines) == (2 if round_ == 1 else 1)
        out = [
            batch_output_line(line["custom_id"], None, status_code=204)
            if line["custom_id"].endswith("~q1")
            else batch_output_line(line["custom_id"], env.answer_line(line["url"], line["body"])[1])
            for line in lines
        ]
        (tmp_path / "files" / "results" / f"{round_}.jsonl").write_text("\n".join(out) + "\n")
        result = judge("--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    rows = judged(tmp_path)
    assert rows["q0"]["status"] == "ok" and rows["q1"]["status"] == "error"
    assert rows["q1"]["error"].startswith("the endpoint answered HTTP 204 with a completion")


def record_of(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]  # type: ignore[no-any-return]


def billed_by_rows(tmp_path: Path) -> dict[str, int]:
    rows = judged(tmp_path).values()
    return {
        "prompt": sum(int(row["prompt_tokens"]) for row in rows),
        "completion": sum(int(row["completion_tokens"]) for row in rows),
    }


def ctrl_c_at_the_seventh_row(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the runner stop with Ctrl-C as it would write its seventh row; the real settle."""
    real, seen = Runner.settle, []

    def ctrl_c_at_the_seventh(self: Runner, task: Any, values: Any) -> None:
        seen.append(task.key)
        if len(seen) == 7:
            raise KeyboardInterrupt
        real(self, task, values)

    monkeypatch.setattr(Runner, "settle", ctrl_c_at_the_seventh)
    return real


def test_stopped_mid_merge_the_rerun_merges_the_rest_ends_at_zero_and_bills_the_job(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exam(tmp_path / "run", N)
    env.responder = by_question
    assert judge().exit_code == WAITING
    assert run_batch_files(env, tmp_path / "files") == N
    real = ctrl_c_at_the_seventh_row(monkeypatch)
    assert judge().exit_code == 130
    assert len(judged(tmp_path)) == 6
    monkeypatch.setattr(Runner, "settle", real)
    done = judge()
    assert done.exit_code == 0, done.output  # the rows written before Ctrl-C wait no more
    assert len(judged(tmp_path)) == N and requests(tmp_path) == []
    record = record_of(tmp_path)
    assert record["batch"]["runs"] == 3 and record["batch"]["results_merged"] == N
    assert record["calls"] == N and record["tokens_billed"] == billed_by_rows(tmp_path)
    assert judge().exit_code == 0


def test_a_job_begun_with_another_model_is_not_billed_as_this_one(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gpt-4o-mini's first replies are cut off and billed; its re-asks are still out when the
    # stage goes on with another model: the record bills only what that model's rows cost,
    # and the folder's total both jobs (the first's cost was once taken off the second's)
    priced(monkeypatch)
    exam(tmp_path / "run", 4)
    env.responder = cut_then_grade
    assert judge().exit_code == WAITING
    run_batch_files(env, tmp_path / "files")
    assert judge().exit_code == WAITING  # the re-asks are out
    assert record_of(tmp_path)["tokens_billed"]["prompt"] > 0
    first = record_of(tmp_path)["spent_usd"]
    assert first > 0
    assert judge("--model", "other-model", "--force").exit_code == WAITING
    for _ in range(3):
        run_batch_files(env, tmp_path / "files")
        if (result := judge("--model", "other-model")).exit_code != WAITING:
            break
    assert result.exit_code == 0, result.output
    record = record_of(tmp_path)
    rows = judged(tmp_path).values()
    assert {row["model"] for row in rows} == {record["model"]} == {"other-model"}
    assert record["tokens_billed"] == billed_by_rows(tmp_path)
    assert record["cost_usd"] > 0
    assert folder_total(tmp_path) == pytest.approx(first + record["cost_usd"])


def test_run_writes_the_key_points_once_and_says_what_waits_once(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    env.embedding_dim = 16
    common = ("--chroma", str(store), "--embedding", "openai:e")
    assert run_cli("generate", "--out", "exam", *common).exit_code == 0
    exam_file = tmp_path / "exam" / "qa_dataset.csv"
    write_dict_rows(exam_file, [{**row, "key_points": ""} for row in read_csv(exam_file)])
    args = ["run", "--qa-dataset", str(exam_file), "--out", "run", "--controls", "1"]
    args += ["--control-runs", "--scale", "key-points", "--batch-dir", "files", *common]
    trips, said = [], []
    for _ in range(5):
        result = run_cli(*args)
        trips.append(sorted({line["custom_id"].split("~")[0] for line in requests(tmp_path)}))
        said.append(" ".join(result.output.split()))
        if result.exit_code == 0:
            break
        assert result.exit_code == WAITING, result.output
        run_batch_files(env, tmp_path / "files")
    assert trips == [
        ["answer", "closed_book.answer", "gold.answer"],
        ["key_points"],  # the runs share them: written once, before any judge
        ["closed_book.judge", "gold.judge", "judge", "judge_controls"],
        [],
    ]
    assert said[1].count("key points: no row to write yet, 3 requests wait") == 1
    assert "Waiting: 3 requests wait" in said[1]


def folder_total(tmp_path: Path) -> float:
    return float(json.loads((tmp_path / "run" / "manifest.json").read_text())["cost_usd"])


def priced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "1")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "4")


def test_a_sync_run_stopped_then_resumed_bills_both_runs(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the stopped run's calls went unpriced: its record had no cost, and the total lost them
    priced(monkeypatch)
    exam(tmp_path / "run", N)
    real = ctrl_c_at_the_seventh_row(monkeypatch)
    sync = ("judge", "--out", "run", "--controls", "0", "--concurrency", "1")
    assert run_cli(*sync).exit_code == 130
    monkeypatch.setattr(Runner, "settle", real)
    assert run_cli(*sync).exit_code == 0
    usage = [r.usage for r in env.requests if r.usage is not None]
    paid = sum(u["prompt_tokens"] + 4 * u["completion_tokens"] for u in usage) / 1e6
    assert len(usage) == N + 1  # the call whose row the stop lost, paid all the same
    assert folder_total(tmp_path) == pytest.approx(paid)


def test_a_run_stopped_after_its_job_ended_leaves_the_job_billed(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the rerun finds nothing to do and shows the job the stopped run ended: it was billed
    # nothing, as if the stopped run had counted the job
    from ragexam.stages.batch import BatchRoad

    priced(monkeypatch)
    exam(tmp_path / "run", N)
    env.responder = by_question
    assert judge().exit_code == WAITING
    run_batch_files(env, tmp_path / "files")
    real = BatchRoad.close_job

    def then_ctrl_c(self: BatchRoad) -> None:
        real(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(BatchRoad, "close_job", then_ctrl_c)
    assert judge().exit_code == 130
    monkeypatch.setattr(BatchRoad, "close_job", real)
    assert judge().exit_code == 0
    record = record_of(tmp_path)
    cost = (billed_by_rows(tmp_path)["prompt"] + 4 * billed_by_rows(tmp_path)["completion"]) / 2e6
    assert record["cost_usd"] == pytest.approx(cost) and cost > 0  # the batch price: half
    assert folder_total(tmp_path) == pytest.approx(cost)
