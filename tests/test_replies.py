"""Replies that are not answers: a malformed 200 is retried then an error row; a withheld or
empty-content reply is an error row with its finish reason, never an `ok` empty answer."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from openai_server import FakeOpenAI, Faults, Reply
from support import (
    build_store,
    custom_key,
    docs,
    exam,
    make_store,
    questions,
    ranked_questions,
    read_csv,
    run_batch_files,
    run_cli,
)

BODIES = {
    "html": ("text/html", "<html><body>502 Bad Gateway</body></html>"),
    "nested past parsing": ("application/json", "[" * 100_000 + "]" * 100_000),
    "empty": ("application/json", ""),
    "empty object": ("application/json", "{}"),
    "no choices": ("application/json", '{"choices": []}'),
}


def chosen(text: str) -> bool:
    """About one chat request in five, chosen by a hash of its text."""
    return hashlib.sha256(text.encode()).digest()[0] < 52


@pytest.mark.parametrize("kind", list(BODIES))
def test_a_malformed_200_is_retried_and_the_stage_finishes(
    env: FakeOpenAI, tmp_path: Path, kind: str
) -> None:
    store = build_store(tmp_path / "store", docs(30))
    spoiled: set[str] = set()

    def once_per_chosen_text(text: str) -> tuple[str, str] | None:
        if chosen(text) and text not in spoiled:
            spoiled.add(text)
            return BODIES[kind]
        return None

    env.faults = Faults(raw_200_if=once_per_chosen_text)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 30 and {row["status"] for row in rows} == {"ok"}
    assert 0 < len(spoiled) < 30
    assert env.count() == 30 + len(spoiled)  # each malformed reply cost exactly one retry
    assert sum(row["attempts"] == "2" for row in rows) == len(spoiled)


def test_a_gateway_that_always_answers_html_makes_error_rows(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "2")
    store = build_store(tmp_path / "store", docs(10))
    env.faults = Faults(raw_200_if=lambda text: BODIES["html"] if "widget 3 " in text else None)
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--max-error-rate", "0.2")
    assert result.exit_code == 0, result.output
    rows = {row["chunk_id"]: row for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    bad = rows.pop("chunk-0003")
    assert bad["status"] == "error" and bad["question"] == ""
    assert bad["error"].startswith("the endpoint answered HTTP 200 with a body that is not JSON")
    assert {row["status"] for row in rows.values()} == {"ok"}
    assert env.count() == 9 + 3  # three attempts (RAGEXAM_MAX_RETRIES 2) for the broken row


def test_an_endpoint_that_answers_every_call_with_a_page_stops_the_stage(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # a login page or a web server at OPENAI_BASE_URL: every row an error, exit 1, as if
    # the rows had failed one by one; it is the endpoint, exit 4
    store = build_store(tmp_path / "store", docs(3))
    env.faults = Faults(raw_200_if=lambda text: BODIES["html"])
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 4, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: the endpoint http") and "not JSON (text/html)" in line
    assert "no OpenAI-compatible API answers at that URL" in line


def test_a_withheld_or_null_answer_is_an_error_row_but_an_empty_one_is_kept(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = make_store(tmp_path / "store", env)
    ranked_questions(env, {f"Q{i}?": list(range(12)) for i in range(4)})
    questions(tmp_path / "run", 4)
    replies = {
        "Q0?": Reply(content=None, finish_reason="content_filter"),
        "Q1?": Reply(content=None, finish_reason="stop"),
        "Q2?": Reply(content=""),
    }

    def respond(body: dict[str, object]) -> Reply | None:
        text = str(body["messages"])
        return next((reply for q, reply in replies.items() if q in text), None)

    env.responder = respond
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "answers.csv")}
    assert rows["q0"]["status"] == "error" and "finish_reason=content_filter" in rows["q0"]["error"]
    assert rows["q1"]["status"] == "error"
    assert rows["q1"]["error"] == "the model returned no content (finish_reason=stop)"
    assert rows["q2"]["status"] == "ok" and rows["q2"]["answer"] == ""
    assert rows["q3"]["status"] == "ok" and rows["q3"]["answer"]
    assert env.count() == 4  # a withheld answer is not paid for again


GRADE = '{"reasoning": "All there.", "completeness": 1, "conciseness": 1}'


def completion(message: dict[str, object], **rest: object) -> dict[str, object]:
    """A chat completion around one message, with the rest of its members as given."""
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
    return {"id": "c", "object": "chat.completion", "choices": [choice], **rest}


# Completions in outline only, as a proxy or a server of its own ways may send them, each with
# what the reason on its row names: langchain-openai's reader cannot read them, or ragexam
# cannot count their tokens.
UNREADABLE = {
    "usage.prompt_tokens": completion({"content": GRADE}, usage={"prompt_tokens": "many"}),
    "usage.completion_tokens_details": completion(
        {"content": GRADE}, usage={"prompt_tokens": 9, "completion_tokens_details": "none"}
    ),
    "usage.prompt_tokens_details.cached_tokens": completion(
        {"content": GRADE}, usage={"prompt_tokens_details": {"cached_tokens": "all"}}
    ),
    "message.content": completion({"content": ["a", 1]}),
    "message.role": completion({"role": 5, "content": GRADE}),
    "message.name": completion({"content": GRADE, "name": ["judge"]}),
    "error says": completion({"content": GRADE}, error={"message": "overloaded"}),
    "choices[1].message": {
        "choices": [*completion({"content": GRADE})["choices"], {"index": 1, "message": 7}]
    },
    "message.tool_calls": completion({"content": None, "tool_calls": [{"id": 1}]}),
    "with object arguments": completion(
        {
            "content": None,
            "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "[1]"}}],
        }
    ),
    "message.function_call": completion({"content": GRADE, "function_call": "grade"}),
}


@pytest.mark.parametrize("road", ["sync", "batch"])
def test_a_completion_no_reader_can_read_is_an_error_row_and_the_stage_goes_on(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, road: str
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    monkeypatch.setenv("RAGEXAM_BATCH_POLL", "0.02")
    spoiled = {f"Answer #{i}.": body for i, body in enumerate(UNREADABLE.values())}
    exam(tmp_path / "run", len(spoiled) + 2)

    def raw(text: str) -> tuple[str, str] | None:
        body = next((body for answer, body in spoiled.items() if answer in text), None)
        return None if body is None else ("application/json", json.dumps(body))

    env.faults = Faults(raw_200_if=raw)
    options = ["--batch"] if road == "batch" else []
    result = run_cli("judge", "--out", "run", "--controls", "0", "--max-error-rate", "1", *options)
    assert result.exit_code == 0, result.output
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}
    assert len(rows) == len(spoiled) + 2
    for number, named in enumerate(UNREADABLE):
        row = rows[f"q{number}"]
        assert row["status"] == "error" and row["completeness"] == "", named
        assert row["error"].startswith("the endpoint answered HTTP 200 with a completion whose ")
        assert named in row["error"] and row["attempts"] == "2", row["error"]
    assert {rows[f"q{n}"]["status"] for n in (len(spoiled), len(spoiled) + 1)} == {"ok"}
    asked = (
        Counter(custom_key(line.custom_id) for line in env.batch_requests)
        if road == "batch"
        else Counter(
            re.findall(r"Answer #[0-9]+", json.dumps(record.body))[0]
            for record in env.requests
            if record.path.endswith("/chat/completions")
        )
    )
    assert sorted(asked.values()) == [1, 1] + [2] * len(spoiled)  # each retried once, no more


def test_a_2xx_that_is_not_200_is_read_as_a_reply_and_its_error_is_an_error_row(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK reads any 2xx as a completion: a 201 carrying an error is an invalid reply.
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    exam(tmp_path / "run", 3)
    env.faults = Faults(status_if=lambda text: 201 if "Answer #1." in text else None)
    result = run_cli("judge", "--out", "run", "--controls", "0", "--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}
    assert rows["q1"]["status"] == "error" and rows["q1"]["attempts"] == "2"
    assert rows["q1"]["error"].startswith("the endpoint answered HTTP 201 with a completion")
    assert rows["q0"]["status"] == rows["q2"]["status"] == "ok"


# Half of a character: a valid JSON escape, no character UTF-8 can write (it crashed a stage).
LONE_SURROGATE = '{"reasoning": "\\ud800", "completeness": 1, "conciseness": 1}'


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"reasoning": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
        ('{"reasoning": "r", "completeness": 1' + "0" * 5000 + ', "conciseness": 1}', "too long"),
        (LONE_SURROGATE, "a lone surrogate"),
    ],
    ids=["deep", "long number", "lone surrogate"],
)
def test_a_structured_reply_json_cannot_read_is_re_asked_then_an_error_row(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, reason: str
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    exam(tmp_path / "run", 3)
    env.responder = lambda body: Reply(content=content) if "Answer #1." in str(body) else None
    result = run_cli("judge", "--out", "run", "--controls", "0", "--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}
    assert rows["q1"]["status"] == "error" and reason in rows["q1"]["error"]
    assert rows["q1"]["attempts"] == "2" and rows["q1"]["completeness"] == ""
    assert rows["q0"]["status"] == rows["q2"]["status"] == "ok"


@pytest.mark.parametrize("road", ["sync", "batch"])
def test_content_as_a_list_of_parts_is_read_as_its_text(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, road: str
) -> None:
    # Mistral's reasoning models: a thinking part, then the text. langchain reads it; so do we.
    monkeypatch.setenv("RAGEXAM_BATCH_POLL", "0.02")
    exam(tmp_path / "run", 3)
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "Compare them."}]}
    parts = completion(
        {"content": [thinking, {"type": "text", "text": GRADE}]},
        usage={"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
    )
    env.faults = Faults(raw_200_if=lambda text: ("application/json", json.dumps(parts)))
    options = ["--batch"] if road == "batch" else []
    result = run_cli("judge", "--out", "run", "--controls", "0", *options)
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert [(row["status"], row["completeness"], row["attempts"]) for row in rows] == [
        ("ok", "1.0", "1")
    ] * 3


def test_a_batch_result_holding_a_lone_surrogate_is_re_asked_then_an_error_row(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    exam(tmp_path / "run", 3)
    env.responder = lambda body: (
        Reply(content=LONE_SURROGATE) if "Answer #1." in str(body) else None
    )
    judge = ("judge", "--out", "run", "--controls", "0", "--batch-dir", "files")
    judge += ("--max-error-rate", "0.5")
    assert run_cli(*judge).exit_code == 75
    for _ in range(2):  # the first results, then the re-ask's
        run_batch_files(env, tmp_path / "files")
        result = run_cli(*judge)
    assert result.exit_code == 0, result.output
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "judgments.csv")}
    assert rows["q1"]["status"] == "error" and "a lone surrogate" in rows["q1"]["error"]
    assert rows["q1"]["attempts"] == "2" and rows["q0"]["status"] == rows["q2"]["status"] == "ok"
