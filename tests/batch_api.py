"""The OpenAI Batch API's wire shapes for the test server, and batch result lines to write.

`BatchFaults` are the knobs of FakeOpenAI's Batch API (tests/batch_server.py runs it); the
rest is pure: input validation as OpenAI reports it, error bodies, cursor pages, and the
result lines of OpenAI's Batch API and of `vllm run-batch`, to write results without a server.

How `vllm run-batch` writes results, unlike OpenAI. Read in vllm-project/vllm:
vllm/entrypoints/openai/run_batch.py (commits 0056ae7b and 53159ce0: `run_request`,
`make_error_request_output`, `OrderedStreamingWriter`), vllm/entrypoints/openai/batch/
protocol.py (479eabf2: `BatchRequestOutput`, `BatchResponseData`) and chat_completion/
protocol.py (002032ee: `ChatCompletionResponse`, `ChatMessage`).

- OpenAI: {"id": "batch_req_…", "custom_id", "response": {"status_code", "request_id":
  "req_…", "body"}, "error": null}. Successes go to output_file_id; HTTP failures go to
  error_file_id with the error object as the body; lines never run have "response": null,
  "error": {"code": "batch_expired" | "batch_cancelled", "message"}. Order is not promised.
- vLLM: one `-o` file for every line, in input order, written by pydantic `model_dump_json`
  (compact separators, every optional field present as null). Ids are "vllm-<32 hex>" and
  request ids "vllm-batch-<32 hex>". An HTTP failure has "body": null and the error in
  "error" as {"error": {"message", "type", "param", "code": <HTTP status as int>}}; any
  other failure is status_code 400 with "error" a plain string. A success's body carries
  vLLM's extra fields (`vllm_body`). A line that fails validation aborts the whole run.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, Literal

JSON = dict[str, Any]
Shape = Literal["openai", "vllm"]
ENDPOINTS = ("/v1/chat/completions",)  # what the test server batches
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
UNRUN = {  # why a line never ran, for the error file
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}
FAILURES = {  # messages of whole-batch failures that fail_validation can inject
    "token_limit_exceeded": "Enqueued token limit reached for fake-model in organization "
    "org-test. Limit: 90,000,000 enqueued tokens. Please try again once some in_progress "
    "batches have been completed.",
}
QUEUE_FULL = (  # OpenAI's words when a batch is more than the organisation's queue holds
    "Enqueued token limit reached for {model} in organization org-test. Limit: {limit:,} "
    "enqueued tokens. Please try again once some in_progress batches have been completed."
)


@dataclass
class BatchFaults:
    """The Batch API's knobs: how long each step takes, what goes wrong, and the limits."""

    seconds_validating: float = 0.0
    seconds_per_line: float = 0.0
    seconds_finalizing: float = 0.0
    seconds_cancelling: float = 0.0
    manual: bool = False  # every step waits for server.advance_batches(), not for the clock
    fail_validation: str | None = None  # an error code: the whole batch fails validation
    fail_validation_count: int | None = None  # only the first N batches validated fail (None: all)
    fail_line_if: Callable[[str, str], int | None] | None = None  # (custom_id, body) -> status
    expire_after: int | None = None  # lines run before the batch expires
    retrieve_status: Callable[[str, int], int | None] | None = None  # (batch id, poll) -> status
    reverse_output: bool = False  # OpenAI does not promise input order in result files
    # A gateway's or another server's own ways: (method, path, reply) -> the reply it sends.
    alter: Callable[[str, str, HttpReply], HttpReply] | None = None
    max_lines: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    # The organisation's enqueued-token limit: a batch whose requests' bytes / 4 exceed it
    # fails validation with token_limit_exceeded, naming the limit as OpenAI does.
    queue_tokens: int | None = None
    queue_shared: bool = False  # the limit holds the batches made before one, still in flight


@dataclass
class BatchLine:
    """One batch line as answered, kept apart from the sync `requests`."""

    batch_id: str
    custom_id: str
    body: Any
    status: int
    fault: str | None = None
    usage: dict[str, int] | None = None  # what the line billed, as a sync call would
    at: float = field(default_factory=time.monotonic)
    raw: bytes = b""  # the body as the input file holds it, byte for byte


@dataclass
class HttpReply:
    """What a Batch API endpoint answers: a JSON payload, or raw bytes."""

    status: int
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None


def api_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> HttpReply:
    """An OpenAI-style error reply: {"error": {"message", "type", "param", "code"}}."""
    kind = "requests" if status == 429 else "invalid_request_error"
    kind = "server_error" if status >= 500 else kind
    error = {"message": message, "type": kind, "param": param, "code": code}
    return HttpReply(status, {"error": error})


def missing(name: str) -> HttpReply:
    """The 400 for a required parameter left out."""
    message = f"Missing required parameter: '{name}'."
    return api_error(400, message, name, "missing_required_parameter")


def create_refusal(body: Any) -> HttpReply | None:
    """The 400 a batch create body earns, if any."""
    if not isinstance(body, dict):
        return api_error(400, "The request body is not a valid JSON object.")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not body.get(name):
            return missing(name)
    if body["endpoint"] not in ENDPOINTS:
        return api_error(400, f"Invalid value for 'endpoint': {body['endpoint']}.", "endpoint")
    if body["completion_window"] != "24h":
        message = "Invalid value for 'completion_window': only '24h' is supported."
        return api_error(400, message, "completion_window")
    metadata = body.get("metadata") or {}
    if len(metadata) > 16 or any(len(k) > 64 or len(str(v)) > 512 for k, v in metadata.items()):
        message = "Invalid 'metadata': at most 16 pairs, keys up to 64 and values up to 512."
        return api_error(400, message, "metadata")
    return None


def parse_form(content_type: str, raw: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data body: name -> (filename or None, content)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if boundary is None:
        return {}
    fields = {}
    for part in raw.split(b"--" + boundary.group(1).encode())[1:-1]:
        head, _, content = part.partition(b"\r\n\r\n")
        name = re.search(rb'\bname="([^"]*)"', head)
        filename = re.search(rb'\bfilename="([^"]*)"', head)
        if name is not None:  # the content ends in the CRLF that precedes the boundary
            named = filename.group(1).decode() if filename else None
            fields[name.group(1).decode()] = (named, content.removesuffix(b"\r\n"))
    return fields


def page(objects: list[JSON], after: str | None, limit: int) -> JSON:
    """One page of a cursor-paginated list, as the SDK's CursorPage reads it."""
    ids = [item["id"] for item in objects]
    start = ids.index(after) + 1 if after in ids else 0
    data = objects[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(objects),
    }


def parse_input(data: bytes, endpoint: str, max_lines: int) -> tuple[list[JSON], list[JSON]]:
    """A batch input file's requests, and the errors that fail it (OpenAI's codes, lines from 1)."""
    lines: list[JSON] = []
    errors: list[JSON] = []
    seen: set[str] = set()
    # Split on "\n" only: str.splitlines() would also split at a raw U+2028 inside a string.
    for number, text in enumerate(data.decode(errors="replace").split("\n"), 1):
        if not text.strip():  # the file's last newline, or a blank line
            continue
        request, error = _check_line(text, endpoint, seen)
        if error is not None:
            errors.append({**error, "line": number})
        elif request is not None:
            lines.append(request)
            seen.add(request["custom_id"])
    if not lines and not errors:
        errors.append(batch_error("empty_file", "The batch input file is empty."))
    elif len(lines) + len(errors) > max_lines:
        message = f"The batch input file has more than {max_lines} requests."
        errors.append(batch_error("too_many_tasks", message))
    return lines, errors


def _check_line(text: str, endpoint: str, seen: set[str]) -> tuple[JSON | None, JSON | None]:
    """(request, None) for a valid input line, else (None, the error)."""
    try:
        request = json.loads(text)
    except ValueError:
        request = None
    if not isinstance(request, dict):
        return None, batch_error("invalid_json_line", "This line is not parseable as valid JSON.")
    for name in ("custom_id", "method", "url", "body"):
        if not isinstance(request.get(name), dict if name == "body" else str):
            message = f"Missing required parameter: '{name}'."
            return None, batch_error("missing_required_parameter", message, name)
    if request["url"] != endpoint:
        message = f"The URL '{request['url']}' does not match the batch's endpoint '{endpoint}'."
        return None, batch_error("url_mismatch", message, "url")
    if request["custom_id"] in seen:
        message = "The custom_id for this request is a duplicate of another request."
        return None, batch_error("duplicate_custom_id", message, "custom_id")
    return {**request, RAW_BODY: raw_value(text, "body").encode()}, None


RAW_BODY = "_raw_body"  # where parse_input keeps each line's body as the file holds it


def raw_value(text: str, name: str) -> str:
    """The JSON text of one top-level member of a JSON object, as written (not re-encoded)."""
    decoder, at = json.JSONDecoder(), text.index("{") + 1
    while True:
        at = _skip(text, at)
        key, at = scanstring(text, at + 1)  # past the key's opening quote
        start = _skip(text, _skip(text, at) + 1)  # past the colon
        _, end = decoder.raw_decode(text, start)
        if key == name:
            return text[start:end]
        at = _skip(text, _skip(text, end) + 1)  # past the comma


def _skip(text: str, at: int) -> int:
    """The first position from `at` that is not JSON whitespace."""
    while text[at] in " \t\r\n":
        at += 1
    return at


def batch_error(code: str, message: str, param: str | None = None) -> JSON:
    """One entry of a failed batch's `errors.data`."""
    return {"code": code, "message": message, "param": param, "line": None}


def usage_object(prompt: int, completion: int) -> JSON:
    """A Batch object's usage: the tokens its lines billed."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


# -- result lines ---------------------------------------------------------------------------------


def batch_output_line(
    custom_id: str, body: Any, *, status_code: int = 200, shape: Shape = "openai", key: str = ""
) -> str:
    """One result line as OpenAI's Batch API or `vllm run-batch` writes it; ids hash key."""
    seed = f"{key}:{custom_id}"
    if shape == "vllm":
        failed = status_code != 200
        request_id = "vllm-batch-" + _hex("request:" + seed)
        response = {"status_code": status_code, "request_id": request_id}
        response["body"] = None if failed else body  # vLLM puts a failure's error in "error"
        line = {"id": "vllm-" + _hex(seed), "custom_id": custom_id}
        return _compact({**line, "response": response, "error": body if failed else None})
    response = {"status_code": status_code, "request_id": "req_" + _hex("request:" + seed)}
    line = {"id": "batch_req_" + _hex(seed), "custom_id": custom_id}
    return json.dumps({**line, "response": {**response, "body": body}, "error": None})


def batch_error_line(
    custom_id: str, code: str, message: str, *, shape: Shape = "openai", key: str = ""
) -> str:
    """A line that failed outside HTTP: OpenAI's {code, message}, or vLLM's 400 and message."""
    if shape == "vllm":
        line = json.loads(batch_output_line(custom_id, None, status_code=400, shape=shape, key=key))
        return _compact({**line, "error": message})
    line = json.loads(batch_output_line(custom_id, None, key=key))
    return json.dumps({**line, "response": None, "error": {"code": code, "message": message}})


def vllm_body(completion: JSON) -> JSON:
    """A chat.completion as vLLM serialises it: every optional field it adds, as null."""
    choices = [
        {**_nulls(choice, _VLLM_CHOICE), "message": _nulls(choice["message"], _VLLM_MESSAGE)}
        for choice in completion["choices"]
    ]
    usage = _nulls(completion["usage"], ("prompt_tokens_details",))
    return {**_nulls(completion, _VLLM_RESPONSE), "choices": choices, "usage": usage}


# The optional fields of vLLM's ChatMessage, ChatCompletionResponseChoice and
# ChatCompletionResponse (chat_completion/protocol.py at 002032ee); an empty tool_calls is dropped.
_VLLM_MESSAGE = ("annotations", "audio", "function_call", "reasoning")
_VLLM_CHOICE = ("logprobs", "stop_reason", "token_ids", "routed_experts")
_VLLM_RESPONSE = (
    "service_tier",
    "system_fingerprint",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
)


def _nulls(value: JSON, names: Iterable[str]) -> JSON:
    """value with each of names it lacks set to null."""
    return {**value, **{name: None for name in names if name not in value}}


def read_lines(text: str) -> list[JSON]:
    """The JSON objects of a JSONL text."""
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def jsonl(lines: Iterable[JSON]) -> bytes:
    """A JSONL file of lines."""
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _compact(value: Any) -> str:
    """JSON as pydantic's model_dump_json writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _hex(text: str) -> str:
    """32 hex digits, as uuid4().hex has: stable per text."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]
