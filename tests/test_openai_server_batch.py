"""The fake server's Batch API (/v1/files, /v1/batches), driven through the real openai SDK."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import judges
import openai
import pytest
from batch_api import (
    BatchFaults,
    batch_error_line,
    batch_output_line,
    jsonl,
    read_lines,
    vllm_body,
)
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion
from openai_server import FakeOpenAI, Faults, Reply

JSON = dict[str, Any]
CHAT = "/v1/chat/completions"


@pytest.fixture
def sdk(fake_llm: FakeOpenAI) -> openai.OpenAI:
    """A real SDK client without retries, so each call is exactly one request."""
    return openai.OpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)


def request(custom_id: str, content: str, **body: Any) -> JSON:
    """One batch input line asking gpt-test `content`."""
    messages = [{"role": "user", "content": content}]
    body = {"model": "gpt-test", "messages": messages, **body}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def questions(count: int) -> list[JSON]:
    """`count` input lines, r0 … r{count-1}."""
    return [request(f"r{i}", f"Question number {i} about Lisbon?") for i in range(count)]


def submit(sdk: openai.OpenAI, lines: list[JSON], **options: Any) -> Batch:
    """Upload lines as a batch input file and create a batch from it."""
    upload = sdk.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return sdk.batches.create(
        input_file_id=upload.id, endpoint=CHAT, completion_window="24h", **options
    )


def wait_for(sdk: openai.OpenAI, batch_id: str, *statuses: str) -> Batch:
    """Poll until the batch reaches one of statuses (2 s at most)."""
    deadline = time.monotonic() + 2
    while (batch := sdk.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch
        time.sleep(0.005)
    return batch


def strict(sdk: openai.OpenAI, batch_id: str) -> Batch:
    """The batch as sent, validated by the SDK's model (which only constructs, unchecked)."""
    raw = sdk.batches.with_raw_response.retrieve(batch_id).http_response.json()
    assert set(raw) <= set(Batch.model_fields), set(raw) - set(Batch.model_fields)
    return Batch.model_validate(raw)


def done(batch: Batch) -> int:
    """Lines completed so far."""
    return batch.request_counts.completed if batch.request_counts else 0


def results(sdk: openai.OpenAI, file_id: str | None) -> list[JSON]:
    """The lines of a result file; none without one."""
    return read_lines(sdk.files.content(file_id).text) if file_id else []


def test_files_upload_read_list_and_delete(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    data = jsonl(questions(2)) + '{"custom_id": "é\u2028"}\r\n'.encode()
    upload = sdk.files.create(file=("in.jsonl", data), purpose="batch")
    raw = sdk.files.with_raw_response.retrieve(upload.id).http_response.json()
    assert FileObject.model_validate(raw) == upload
    assert (upload.bytes, upload.filename, upload.purpose) == (len(data), "in.jsonl", "batch")
    assert sdk.files.content(upload.id).content == data
    assert [f.id for f in sdk.files.list(purpose="batch")] == [upload.id]
    assert sdk.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError, match="No such File object"):
        sdk.files.retrieve(upload.id)
    assert fake_llm.requests[0].path == "/v1/files"


def test_uploads_refused_as_openai_refuses_them(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"Must be \.jsonl"):
        sdk.files.create(file=("notes.txt", b"{}\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        sdk.files.create(file=("in.jsonl", b"{}\n"), purpose="nonsense")  # type: ignore[arg-type]
    fake_llm.batch = BatchFaults(max_bytes=10)
    with pytest.raises(openai.BadRequestError, match="limited to 10"):
        sdk.files.create(file=("in.jsonl", b"x" * 11), purpose="batch")
    assert sdk.files.create(file=("in.jsonl", b"x" * 10), purpose="batch").bytes == 10


def test_batch_completes_with_openai_shapes_and_per_line_usage(
    fake_llm: FakeOpenAI, sdk: openai.OpenAI
) -> None:
    fake_llm.count_tokens = len  # billed in characters, to see the server's own count used
    lines = [*questions(2), request("r2", "Another model", model="gpt-other")]  # mixed: fine
    created = submit(sdk, lines, metadata={"run": "exam"})
    assert (created.status, created.metadata, created.request_counts.total) == (
        "validating",
        {"run": "exam"},
        0,
    )
    wait_for(sdk, created.id, "completed")
    batch = strict(sdk, created.id)
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.error_file_id is None and batch.errors is None and batch.model == "gpt-test"
    output = results(sdk, batch.output_file_id)
    assert [line["custom_id"] for line in output] == ["r0", "r1", "r2"]
    for line in output:
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["id"].startswith("batch_req_")
        assert set(line["response"]) == {"status_code", "request_id", "body"}
        assert line["response"]["status_code"] == 200
        ChatCompletion.model_validate(line["response"]["body"])
    billed = [record.usage for record in fake_llm.batch_requests]
    assert [line["response"]["body"]["usage"] for line in output] == billed
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(usage["prompt_tokens"] for usage in billed if usage)
    asked = lines[0]["body"]["messages"][0]["content"]
    said = output[0]["response"]["body"]["choices"][0]["message"]["content"]
    # The server bills the reply text plus " " and the (absent) tool arguments.
    assert billed[0] == {
        "prompt_tokens": len(asked),
        "completion_tokens": len(said) + 1,
        "total_tokens": len(asked) + len(said) + 1,
    }
    assert fake_llm.count() == 0  # batch lines are not sync requests
    output_file = sdk.files.retrieve(batch.output_file_id or "")
    assert output_file.purpose == "batch_output"


def test_a_batch_line_is_byte_for_byte_the_sync_completion(
    fake_llm: FakeOpenAI, sdk: openai.OpenAI
) -> None:
    fake_llm.responder = judges.truthful
    judge = "<ground_truth>\nthe sky is blue\n</ground_truth>\n<answer>\nblue sky\n</answer>"
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "V", "schema": schema}}
    tool = {"type": "function", "function": {"name": "grade", "parameters": schema}}
    lines = [
        request("judge", judge),
        request("schema", "Grade this", response_format=fmt, max_tokens=3),
        request("tool", "Call it", tools=[tool]),
    ]
    batch = wait_for(sdk, submit(sdk, lines).id, "completed")
    text = sdk.files.content(batch.output_file_id or "").text
    for line in lines:
        sync = sdk.chat.completions.with_raw_response.create(**line["body"]).http_response
        assert _timeless(sync.content.decode()) in _timeless(text)
    assert [r.usage for r in fake_llm.batch_requests] == [r.usage for r in fake_llm.requests[-3:]]


def _timeless(text: str) -> str:
    return re.sub(r'"created": \d+', '"created": 0', text)


def test_sync_faults_and_responder_errors_carry_into_batch_lines(
    fake_llm: FakeOpenAI, sdk: openai.OpenAI
) -> None:
    fake_llm.faults = Faults(
        status_if=lambda text: 500 if "broken" in text else None,
        malformed_if=lambda text: "garbled" in text,
    )
    fake_llm.responder = lambda body: Reply(status=503) if "busy" in str(body) else None
    schema_prompt = "Answer as JSON matching:\n```json\n" + json.dumps(
        {"type": "object", "properties": {"a": {"type": "string"}}}
    )
    lines = [
        request("ok", "fine"),
        request("500", "broken"),
        request("bad", f"garbled {schema_prompt}\n```"),
        request("503", "busy"),
    ]
    batch = wait_for(sdk, submit(sdk, lines).id, "completed")
    assert batch.request_counts and batch.request_counts.failed == 2
    output, errors = results(sdk, batch.output_file_id), results(sdk, batch.error_file_id)
    assert [line["custom_id"] for line in output] == ["ok", "bad"]
    assert [line["response"]["status_code"] for line in errors] == [500, 503]
    assert [r.fault for r in fake_llm.batch_requests] == [None, "status_if", "malformed", None]
    sync = sdk.chat.completions.create(**lines[2]["body"])
    assert output[1]["response"]["body"]["choices"][0]["message"]["content"] == (
        sync.choices[0].message.content
    )
    for line, status in zip(errors, (500, 503), strict=True):
        with pytest.raises(openai.APIStatusError) as caught:
            sdk.chat.completions.create(**lines[1 if status == 500 else 3]["body"])
        assert line["response"]["body"] == caught.value.response.json()
        assert line["error"] is None


def test_fail_line_if_and_reverse_output(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(
        fail_line_if=lambda custom_id, body: 429 if custom_id == "r1" else None,
        reverse_output=True,
    )
    batch = wait_for(sdk, submit(sdk, questions(3)).id, "completed")
    assert batch.request_counts and batch.request_counts.model_dump() == {
        "total": 3,
        "completed": 2,
        "failed": 1,
    }
    assert [line["custom_id"] for line in results(sdk, batch.output_file_id)] == ["r2", "r0"]
    (error,) = results(sdk, batch.error_file_id)
    assert error["response"]["status_code"] == 429
    assert error["response"]["body"]["error"]["type"] == "requests"
    assert fake_llm.batch_requests[1].fault == "fail_line_if"


def test_validation_failure_lists_every_bad_line(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    no_id = request("x", "no id")
    del no_id["custom_id"]
    lines = [
        json.dumps(request("a", "fine")),
        "{not json",
        json.dumps(no_id),
        json.dumps(request("a", "same id again")),
        json.dumps({**request("b", "embed me"), "url": "/v1/embeddings"}),
    ]
    upload = sdk.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    created = sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    wait_for(sdk, created.id, "failed")
    batch = strict(sdk, created.id)
    assert batch.errors and batch.errors.object == "list" and batch.errors.data
    found = [(e.code, e.line, e.param) for e in batch.errors.data]
    assert found == [
        ("invalid_json_line", 2, None),
        ("missing_required_parameter", 3, "custom_id"),
        ("duplicate_custom_id", 4, "custom_id"),
        ("url_mismatch", 5, "url"),
    ]
    assert batch.failed_at and batch.output_file_id is None and batch.error_file_id is None
    assert fake_llm.batch_requests == []


@pytest.mark.parametrize(
    ("faults", "count", "code"),
    [
        (BatchFaults(fail_validation="token_limit_exceeded"), 2, "token_limit_exceeded"),
        (BatchFaults(max_lines=2), 3, "too_many_tasks"),
        (BatchFaults(), 0, "empty_file"),
    ],
)
def test_whole_batch_failures(
    fake_llm: FakeOpenAI, sdk: openai.OpenAI, faults: BatchFaults, count: int, code: str
) -> None:
    fake_llm.batch = faults
    batch = wait_for(sdk, submit(sdk, questions(count)).id, "failed")
    assert batch.errors and batch.errors.data
    assert [error.code for error in batch.errors.data] == [code]


def test_create_refusals(sdk: openai.OpenAI) -> None:
    other = sdk.files.create(file=("in.jsonl", jsonl(questions(1))), purpose="user_data")
    good = sdk.files.create(file=("in.jsonl", jsonl(questions(1))), purpose="batch")
    create = sdk.batches.create
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        create(input_file_id=other.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        create(input_file_id="file-none", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        create(input_file_id=good.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="metadata"):
        metadata = {f"k{i}": "v" for i in range(17)}
        create(input_file_id=good.id, endpoint=CHAT, completion_window="24h", metadata=metadata)
    with pytest.raises(openai.BadRequestError, match="input_file_id"):
        sdk.post("/batches", cast_to=object, body={"endpoint": CHAT, "completion_window": "24h"})


def test_expiry_keeps_the_lines_done(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(expire_after=2)
    batch = wait_for(sdk, submit(sdk, questions(5)).id, "expired")
    assert batch.expired_at and batch.completed_at is None
    assert batch.request_counts and batch.request_counts.model_dump() == {
        "total": 5,
        "completed": 2,
        "failed": 0,
    }
    assert [line["custom_id"] for line in results(sdk, batch.output_file_id)] == ["r0", "r1"]
    errors = results(sdk, batch.error_file_id)
    assert [line["custom_id"] for line in errors] == ["r2", "r3", "r4"]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    assert all(line["response"] is None for line in errors)
    assert len(fake_llm.batch_requests) == 2


def test_manual_steps_walk_every_status(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(manual=True)
    batch_id = submit(sdk, questions(2)).id
    seen = []
    for _ in range(4):
        batch = sdk.batches.retrieve(batch_id)
        seen.append((batch.status, done(batch)))
        fake_llm.advance_batches()
    assert seen == [("validating", 0), ("in_progress", 0), ("in_progress", 1), ("finalizing", 2)]
    assert sdk.batches.retrieve(batch_id).status == "completed"


def test_cancel_part_way(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(manual=True)
    batch_id = submit(sdk, questions(5)).id
    fake_llm.advance_batches(3)  # validate, then two lines
    cancelling = sdk.batches.cancel(batch_id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    fake_llm.advance_batches()
    batch = strict(sdk, batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert batch.request_counts and batch.request_counts.completed == 2
    assert len(results(sdk, batch.output_file_id)) == 2
    errors = results(sdk, batch.error_file_id)
    assert [line["error"]["code"] for line in errors] == ["batch_cancelled"] * 3
    assert sdk.batches.cancel(batch_id).status == "cancelled"  # again: no change


def test_cancel_while_lines_run_in_real_time(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(seconds_per_line=0.02)
    batch_id = submit(sdk, questions(40)).id
    while done(sdk.batches.retrieve(batch_id)) < 3:
        time.sleep(0.005)
    sdk.batches.cancel(batch_id)
    batch = wait_for(sdk, batch_id, "cancelled")
    output, errors = results(sdk, batch.output_file_id), results(sdk, batch.error_file_id)
    assert batch.request_counts and batch.request_counts.completed == len(output) < 40
    assert len(output) + len(errors) == 40
    with pytest.raises(openai.ConflictError):
        sdk.batches.cancel(wait_for(sdk, submit(sdk, questions(1)).id, "completed").id)


def test_slow_batch_counts_grow_over_time(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(
        seconds_validating=0.1, seconds_per_line=0.03, seconds_finalizing=0.1
    )
    batch_id = submit(sdk, questions(10)).id
    seen: list[tuple[str, int]] = []
    while not seen or seen[-1][0] != "completed":
        batch = sdk.batches.retrieve(batch_id)
        seen.append((batch.status, done(batch)))
        time.sleep(0.01)
    statuses = list(dict.fromkeys(status for status, _ in seen))
    assert statuses == ["validating", "in_progress", "finalizing", "completed"]
    counts = [count for _, count in seen]
    assert counts == sorted(counts) and len(set(counts)) >= 5 and counts[-1] == 10


def test_retrieve_status_fails_polls(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.batch = BatchFaults(retrieve_status=lambda batch_id, poll: {1: 500, 2: 429}.get(poll))
    batch_id = submit(sdk, questions(1)).id
    with pytest.raises(openai.InternalServerError):
        sdk.batches.retrieve(batch_id)
    with pytest.raises(openai.RateLimitError):
        sdk.batches.retrieve(batch_id)
    assert wait_for(sdk, batch_id, "completed").output_file_id


def test_batches_list_newest_first_in_pages(sdk: openai.OpenAI) -> None:
    made = [submit(sdk, questions(1)).id for _ in range(5)]
    first = sdk.batches.list(limit=2)
    assert [batch.id for batch in first.data] == [made[4], made[3]]
    assert first.has_more
    assert [batch.id for batch in sdk.batches.list(limit=2)] == made[::-1]  # every page
    assert [b.id for b in sdk.batches.list(after=made[2]).data] == [made[1], made[0]]


def test_lines_are_answered_holding_no_lock(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    inside, release = threading.Event(), threading.Event()

    def slow(body: JSON) -> Reply | None:
        if "batched" in str(body):
            inside.set()
            release.wait(2)
        return None

    fake_llm.responder = slow
    batch_id = submit(sdk, [request("a", "batched question")]).id
    assert inside.wait(2)
    started = time.monotonic()
    assert sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert sdk.batches.retrieve(batch_id).status == "in_progress"
    assert time.monotonic() - started < 1
    release.set()
    wait_for(sdk, batch_id, "completed")


def test_stop_is_prompt_with_batches_running() -> None:
    inside = threading.Event()

    def entered(body: JSON) -> None:
        inside.set()  # then the default reply, which runs to hang_seconds without max_tokens

    with FakeOpenAI() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        server.responder = entered
        server.quirks.endless_without_max_tokens = True
        submit(client, questions(1))
        assert inside.wait(2)  # a line is being answered, for 30 s
        server.batch = BatchFaults(seconds_per_line=30)
        wait_for(client, submit(client, questions(2)).id, "in_progress")  # a line is waited for
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 1
    assert not [t for t in threading.enumerate() if t.name.startswith("batch_")]


def test_result_line_helpers_write_both_shapes() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    message = {"role": "assistant", "content": "Hi", "refusal": None}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m"}
    body |= {"choices": [choice], "usage": usage}
    openai_line = json.loads(batch_output_line("q1", body, key="b"))
    assert openai_line["id"].startswith("batch_req_") and openai_line["error"] is None
    assert openai_line["response"]["request_id"].startswith("req_")
    assert openai_line["response"]["body"] == body
    vllm = batch_output_line("q1", vllm_body(body), shape="vllm")
    assert ", " not in vllm and re.match(r'\{"id":"vllm-[0-9a-f]{32}","custom_id":"q1"', vllm)
    parsed = json.loads(vllm)
    assert parsed["response"]["request_id"].startswith("vllm-batch-")
    vllm_choice = parsed["response"]["body"]["choices"][0]
    assert vllm_choice["stop_reason"] is None and vllm_choice["message"]["reasoning"] is None
    assert parsed["response"]["body"]["usage"] == {**usage, "prompt_tokens_details": None}
    ChatCompletion.model_validate(parsed["response"]["body"])
    error = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    failed = json.loads(batch_output_line("q2", error, status_code=400, shape="vllm"))
    assert failed["response"]["body"] is None and failed["error"] == error
    unrun = json.loads(batch_error_line("q3", "batch_expired", "late"))
    assert unrun["response"] is None
    assert unrun["error"] == {"code": "batch_expired", "message": "late"}
    raised = json.loads(batch_error_line("q3", "x", "stream mode", shape="vllm"))
    assert raised["response"]["status_code"] == 400 and raised["error"] == "stream mode"
