"""A small model on a CPU server (llama.cpp), through the test server's imitation of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI, Quirks, Reply
from support import build_store, docs, exam, read_csv, run_cli

from ragexam.llm.structured import schema_tokens
from ragexam.stages.grading import UnitGrade


def stage(run: Path, name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((run / "manifest.json").read_text())["stages"][name]
    return record


@pytest.mark.parametrize(
    ("quirks", "asked", "method"),
    [
        # llama.cpp: json_schema is a 500, and the 270M model echoes the schema in JSON mode
        (Quirks(json_schema_status=500, echo_schema_in_json_mode=True), [], "function_calling"),
        (Quirks(echo_schema_in_json_mode=True), ["--structured-output", "json_mode"], "prompt"),
    ],
)
def test_a_method_whose_replies_keep_failing_gives_way_to_the_next(
    env: FakeOpenAI, tmp_path: Path, quirks: Quirks, asked: list[str], method: str
) -> None:
    env.quirks = quirks
    store = build_store(tmp_path / "store", docs(12))
    args = ("--chroma", str(store), "--out", "run", "--concurrency", "1", *asked)
    result = run_cli("generate", *args)
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 12 and {row["status"] for row in rows} == {"ok"}
    assert stage(tmp_path / "run", "generate")["structured_output"] == method
    echoed = sum("properties" in (r.body.get("response_format") or {}) for r in env.requests)
    assert env.count() <= 12 + 3 + echoed  # a few echoes, then every row on the next method


def test_a_template_that_drops_the_system_message_is_named_with_its_fix(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.quirks = Quirks(drop_system=True)
    store = build_store(tmp_path / "store", docs(6))
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    said = " ".join(result.output.split())
    assert said.count("drops the system message") == 1 and "RAGEXAM_SYSTEM_PROMPT=user" in said
    monkeypatch.setenv("RAGEXAM_SYSTEM_PROMPT", "user")
    moved = run_cli("generate", "--chroma", str(store), "--out", "other")
    assert moved.exit_code == 0 and "drops the system message" not in moved.output


def test_reasons_that_differ_only_in_their_numbers_are_counted_as_one(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # chunks of five lengths: each cut reply's reason names its own prompt's tokens, and the
    # summary showed three of them, "1 x" each, and left the rest unsaid
    env.quirks = Quirks(context_room=4)
    texts = [f"Fact {i}: " + "widget " * (5 * i + 1) for i in range(5)]
    chunks = [Document(text, metadata={"source": "a.md"}) for text in texts]
    store = build_store(tmp_path / "store", chunks)
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    reasons = {row["error"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    assert len(reasons) == 5  # five wordings
    said = [line.strip() for line in result.output.splitlines() if " x the reply" in line]
    assert len(said) == 1 and said[0].startswith("5 x the reply was cut off"), result.output
    assert said[0].endswith("(and alike, but for their numbers: 5 variants)")


def test_a_reply_cut_by_a_small_context_is_said_so_and_not_asked_again(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.quirks = Quirks(context_room=4)  # --n_ctx 512: the prompt leaves 4 tokens for a reply
    store = build_store(tmp_path / "store", docs(3))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert {row["status"] for row in rows} == {"error"}
    assert all("context window was full" in row["error"] for row in rows)
    assert all("--n_ctx" in row["error"] and "1024 in the" not in row["error"] for row in rows)
    assert {row["attempts"] for row in rows} == {"1"}  # the same prompt would be cut again
    assert all(row["raw_reply"] for row in rows)  # the cut reply kept, as every invalid one is
    # one reason, said once with its count, however its numbers differ from row to row
    said = [line for line in result.output.splitlines() if " x the reply was cut off" in line]
    assert len(said) == 1 and said[0].strip().startswith("3 x "), result.output
    # billed all the same: each row and the stage's record count the tokens the server billed
    usage = [rec.usage for rec in env.requests if rec.usage]
    billed = [sum(u[name] for u in usage) for name in ("prompt_tokens", "completion_tokens")]
    rows_say = [
        sum(int(row[name]) for row in rows) for name in ("prompt_tokens", "completion_tokens")
    ]
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["generate"]
    assert billed[0] > 0 and rows_say == billed == list(record["tokens_billed"].values())


def test_a_tool_call_cut_at_the_limit_is_cut_off_not_invalid_json(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_TOKENS", "5")
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    env.quirks = Quirks(tools_finish_as_tool_calls=True)
    store = build_store(tmp_path / "store", docs(3))
    args = ("--chroma", str(store), "--out", "run", "--structured-output", "function_calling")
    result = run_cli("generate", *args, "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    for row in read_csv(tmp_path / "run" / "qa_dataset.csv"):
        assert "cut off at max_tokens" in row["error"] and "JSON" not in row["error"], row


def test_a_slow_cpu_server_is_given_the_time_its_replies_need(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One reply at a time, 100 words a second, written to the end for a caller that left; a
    # grade of 150 words takes 1.5 s, and the timeout (RAGEXAM_TIMEOUT) is 1 s.
    monkeypatch.setenv("RAGEXAM_TIMEOUT", "1")
    env.quirks = Quirks(words_per_second=100)
    exam(tmp_path / "run", 4)

    def verbose(body: dict[str, Any]) -> Reply | None:
        reasoning = "the answer states the facts " * 30
        grade = {"reasoning": reasoning, "completeness": 0.5, "conciseness": 0.5}
        return Reply(content=json.dumps(grade))

    env.responder = verbose
    result = run_cli("judge", "--out", "run", "--concurrency", "1", "--controls", "0")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(rows) == 4 and {row["status"] for row in rows} == {"ok"}
    timeouts = sum(int(row["attempts"]) - 1 for row in rows)
    assert timeouts <= 2, timeouts  # the first calls teach the speed; then none time out
    grades = [r.body for r in env.requests if r.path.endswith("/chat/completions")]
    assert {body["max_tokens"] for body in grades} == {schema_tokens(UnitGrade)}  # not 2048
