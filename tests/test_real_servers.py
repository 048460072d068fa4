"""Real servers' quirks, through the CLI: llama.cpp's refusals, endless replies, dropped system
messages, any model name, per-token embeddings, and what a failed row cost."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from openai_server import FakeOpenAI, Quirks, Reply
from support import build_store, docs, exam, grade, number, read_csv, run_cli

from ragexam.llm.endpoint import ReplyBound
from ragexam.llm.structured import schema_tokens
from ragexam.stages.generate import QAPair
from ragexam.stages.marking import Marks


def manifest(run: Path) -> dict[str, Any]:
    """The run's manifest."""
    return json.loads((run / "manifest.json").read_text())


def kinds(env: FakeOpenAI) -> list[str | None]:
    """The response_format type of each chat call, in order ("tools" for a forced tool call)."""
    return [
        "tools" if r.body.get("tools") else (r.body.get("response_format") or {}).get("type")
        for r in env.requests
    ]


def words(body: dict[str, Any]) -> int:
    """The prompt tokens the test server bills for a request: the words of its messages."""
    return max(1, len(" ".join(str(m.get("content") or "") for m in body["messages"]).split()))


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, None),  # llama-cpp-python's own answer, the pydantic error naming response_format
        (400, "response_format json_schema is not supported by this proxy"),
    ],
)
def test_a_refused_json_schema_switches_once_before_the_rows(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int, message: str
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")  # a refusal must not use up a retry
    env.quirks = Quirks(json_schema_status=status)
    if message is not None:
        env.quirks.json_schema_message = message
    env.latency = 0.02
    store = build_store(tmp_path / "store", docs(12))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 12 and {row["status"] for row in rows} == {"ok"}
    assert {row["attempts"] for row in rows} == {"1"}
    assert kinds(env) == ["json_schema"] + ["tools"] * 12  # one refusal, then function calling
    assert manifest(tmp_path / "run")["stages"]["generate"]["structured_output"] == (
        "function_calling"
    )


def test_judge_against_llama_cpp_refusing_json_schema(env: FakeOpenAI, tmp_path: Path) -> None:
    env.quirks = Quirks(json_schema_status=500)
    exam(tmp_path / "run", 10)
    env.responder = lambda body: grade(body, 0.5)
    result = run_cli("judge", "--out", "run", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert {row["status"] for row in rows} == {"ok"} and len(rows) == 10
    # One refusal, 10 exam rows, then 8 controls for each of 10 questions on the settled method.
    assert kinds(env).count("json_schema") == 1 and env.count() == 1 + 10 + 80


def test_a_refusal_met_by_calls_in_flight_switches_the_method_once(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy that takes json_schema once, then refuses it: 4 calls in flight meet the refusal."""
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    taken = threading.Event()

    def fickle(body: dict[str, Any]) -> Reply | None:
        if (body.get("response_format") or {}).get("type") != "json_schema":
            return None
        if taken.is_set():
            return Reply(status=400, error_message="json_schema not supported")
        taken.set()
        return None

    env.responder = fickle
    env.latency = 0.1  # the calls after the first are in flight together
    store = build_store(tmp_path / "store", docs(12))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert {row["status"] for row in rows} == {"ok"} and {row["attempts"] for row in rows} == {"1"}
    refused = kinds(env).count("json_schema") - 1
    assert 2 <= refused <= 4  # several calls met the refusal ...
    assert manifest(tmp_path / "run")["stages"]["generate"]["structured_output"] == (
        "function_calling"
    )
    assert kinds(env).count(None) == 0  # ... and none went on to `prompt`: one switch
    assert env.count() == 12 + refused


def test_every_call_is_bounded_and_an_endless_server_still_answers(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.quirks = Quirks(endless_without_max_tokens=True)
    env.faults.hang_seconds = 30  # longer than RAGEXAM_TIMEOUT: an unbounded call would fail
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(4))
    result = run_cli("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code == 0, result.output
    for name in ("qa_dataset", "answers", "judgments"):
        assert {row["status"] for row in read_csv(tmp_path / "run" / f"{name}.csv")} == {"ok"}
    chats = [r.body for r in env.requests if r.path.endswith("/chat/completions")]
    bounds = [(body.get("max_tokens"), "max_completion_tokens" in body) for body in chats]
    # generate and answer 4 rows each, then judge 4 rows and 8 controls for each question; a
    # structured reply is bounded by what its schema needs, within the stage's bound.
    exam, grade = min(schema_tokens(QAPair), 1024), min(schema_tokens(Marks), 2048)
    assert bounds == [(exam, False)] * 4 + [(1024, False)] * 4 + [(grade, False)] * (4 + 32)


def test_a_reply_cut_off_keeps_its_cost_and_is_reasked_shorter(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(2))
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    env.reset()
    env.embedding_dim = 16
    monkeypatch.setenv("RAGEXAM_MAX_TOKENS", "3")  # every answer runs past it
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "2")
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code == 1  # every row is an error
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert len(rows) == 2 and {row["status"] for row in rows} == {"error"}
    questions = {
        row["qa_id"]: row["question"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")
    }
    chats = [r.body for r in env.requests if r.path.endswith("/chat/completions")]
    for row in rows:
        tag = questions[row["qa_id"]].split()[1]  # the test server's digest: one per question
        asked = [body for body in chats if tag in json.dumps(body["messages"])]
        assert len(asked) == 3 and row["attempts"] == "3"
        assert "cut off" in row["error"] and len(row["raw_reply"].split()) == 3
        assert int(row["prompt_tokens"]) == sum(words(body) for body in asked)
        assert int(row["completion_tokens"]) == 3 * 3  # three replies of three words
        first, again = asked[0]["messages"], asked[2]["messages"]
        assert len(again) == len(first)  # the original conversation ...
        assert again[-1]["content"].startswith(first[-1]["content"])  # ... plus one short note
        assert "cut off at the length limit" in again[-1]["content"]
        assert words(asked[2]) - words(asked[0]) < 30  # a re-ask does not carry the long reply


def test_function_calling_error_rows_keep_the_arguments_sent(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    exam(tmp_path / "run", 10)

    def out_of_range(body: dict[str, Any]) -> Reply | None:
        if number(body, "Question") != 4:
            return None
        args = json.dumps({"reasoning": "generous", "completeness": 1.7, "conciseness": 0.5})
        return Reply(tool_args=args, finish_reason="tool_calls")

    env.responder = out_of_range
    method = ["--structured-output", "function_calling", "--samples", "2", "--controls", "0"]
    result = run_cli("judge", "--out", "run", *method, "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    bad = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}["q4"]
    assert bad["status"] == "error" and "1.7" in bad["raw_reply"]
    asked = [r.body for r in env.requests if number(r.body, "Question") == 4]
    assert len(asked) == 4 and bad["attempts"] == "4"  # two samples of two attempts each
    assert int(bad["prompt_tokens"]) == sum(words(body) for body in asked)


@pytest.mark.parametrize("where", ["system", "user"])
def test_a_template_that_drops_system_messages(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setenv("RAGEXAM_SYSTEM_PROMPT", where)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    env.quirks = Quirks(drop_system=True)
    exam(tmp_path / "run", 6)
    result = run_cli(
        "judge", "--out", "run", "--structured-output", "prompt", "--max-error-rate", "1"
    )
    assert result.exit_code == 0, result.output
    statuses = {row["status"] for row in read_csv(tmp_path / "run" / "judgments.csv")}
    roles = {m["role"] for r in env.requests for m in r.body["messages"]}
    if where == "system":  # the instructions and the schema were lost with the system message
        said = " ".join(result.output.split())
        assert said.count("set RAGEXAM_SYSTEM_PROMPT=user") == 1 and "system" in roles
        assert "error" in statuses  # prompt mode's first replies, before the next method
        method = manifest(tmp_path / "run")["stages"]["judge"]["structured_output"]
        assert method != "prompt"  # its replies kept failing validation: the next was tried
    else:
        assert statuses == {"ok"} and roles == {"user"}
        first = env.requests[0].body["messages"][0]["content"]
        assert first.startswith("You are a strict, fair grader.") and "<question>" in first


@pytest.mark.parametrize(
    ("listed", "warned"),
    [(["some-other-model"], True), (["gpt-4o-mini", "x"], False), (None, False)],
)
def test_a_model_the_endpoint_does_not_list_is_warned_about_once_per_stage(
    env: FakeOpenAI, tmp_path: Path, listed: list[str] | None, warned: bool
) -> None:
    env.quirks = Quirks(models=listed)  # the server answers any model name, as llama.cpp does
    store = build_store(tmp_path / "store", docs(6))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--concurrency", "3")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Warning:")]
    expected = (
        "Warning: model 'gpt-4o-mini' is not among the models the endpoint lists (some-other-model)"
    )
    assert [line.split(";")[0] for line in lines] == ([expected] if warned else [])
    assert len(env.listings) == 1 and env.listings[0].path == "/v1/models"
    assert env.count() == 6


def test_per_token_embeddings_are_one_line_naming_the_cause(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(3))
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    env.quirks = Quirks(per_token_embeddings=True)
    chats = env.count()
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "one vector per token" in lines[0] and "--pooling mean" in lines[0]
    assert "llama-cpp-python's server has no such option" in lines[0]  # no --pooling there
    assert "dimension" not in lines[0]
    assert env.count() == chats  # no answer call was made


def test_a_raw_newline_inside_a_json_string_is_accepted(env: FakeOpenAI, tmp_path: Path) -> None:
    env.responder = lambda body: Reply(
        content='{"question": "Line one\nline two?", "answer": "A.", "key_points": ["A."]}'
    )
    store = build_store(tmp_path / "store", docs(2))
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert [row["question"] for row in rows] == ["Line one\nline two?"] * 2


def test_a_refused_connection_says_so(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    store = build_store(tmp_path / "store", docs(2))
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code != 0
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert all("Connection refused" in row["error"] for row in rows) and len(rows) == 2


def test_openai_itself_gets_max_completion_tokens_and_other_servers_max_tokens() -> None:
    assert ReplyBound(None, 7).body() == {"max_completion_tokens": 7}
    assert ReplyBound("https://api.openai.com/v1", 7).body() == {"max_completion_tokens": 7}
    assert ReplyBound("http://localhost:8080/v1", 7).body() == {"max_tokens": 7}


def test_a_refused_max_tokens_switches_to_max_completion_tokens_once(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reasoning model behind a compatible endpoint refuses max_tokens, as OpenAI does."""
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")  # the switch must not use up a retry
    env.quirks = Quirks(refuse_max_tokens=True)
    env.latency = 0.02
    store = build_store(tmp_path / "store", docs(8))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert {row["status"] for row in rows} == {"ok"} and {row["attempts"] for row in rows} == {"1"}
    sent = [("max_tokens" in r.body, r.body.get("max_completion_tokens")) for r in env.requests]
    refused = sent.count((True, None))
    bound = min(schema_tokens(QAPair), 1024)  # what its schema needs, within the stage's bound
    assert 1 <= refused <= 4 and sent.count((False, bound)) == 8 and len(sent) == refused + 8


def test_a_model_the_endpoint_does_not_list_is_warned_about_once_per_run(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.quirks = Quirks(models=["some-other-model"])
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(4))
    args = ["--chroma", str(store), "--out", "run", "--embedding", "openai:e"]
    result = run_cli("run", *args, "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "not among the models" in line]
    assert len(warnings) == 1 and warnings[0].startswith("Warning: model 'gpt-4o-mini'")
    assert len(env.listings) == 1  # generate looked it up; answer and judge did not again
    again = run_cli("generate", "--chroma", str(store), "--out", "run2")  # a new run: warned again
    assert again.exit_code == 0, again.output
    assert again.output.count("not among the models") == 1 and len(env.listings) == 2
