"""An OpenAI-compatible HTTP server for offline tests: deterministic replies, injectable faults."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from math import ceil
from typing import Any

from batch_api import BatchFaults, BatchLine
from batch_server import BatchServer
from limits import Bucket, SlidingWindow

JSON = dict[str, Any]
MODEL = "fake-model"
# A ```json fence, as chatty models write them and as prompts embed schemas.
_FENCE = re.compile(r"```json[ \t]*\n(.*?)```", re.DOTALL)
_ERROR_CODES = {401: "invalid_api_key", 404: "unknown_url", 429: "rate_limit_exceeded"}


@dataclass
class Faults:
    """Fault-injection knobs; random faults draw once per request against cumulative rates."""

    rate_429: float = 0.0
    retry_after: str | None = "0"
    rate_500: float = 0.0
    rate_hang: float = 0.0
    hang_seconds: float = 30.0
    rate_truncate: float = 0.0
    rate_malformed: float = 0.0
    max_faults_per_body: int = 2
    malformed_if: Callable[[str], bool] | None = None
    status_if: Callable[[str], int | None] | None = None
    # A 200 whose body is not a completion: (content type, body) for a chat request's text.
    raw_200_if: Callable[[str], tuple[str, str] | None] | None = None
    # An embeddings endpoint of its own ways: (the reply's JSON) -> what it sends (text: raw).
    embeddings_reply: Callable[[JSON], Any] | None = None
    rpm_limit: int | None = None  # a real sliding-window limit on chat calls: this many ...
    rpm_window: float = 60.0  # ... per this many seconds; a 429 says when a slot frees
    tpm_limit: int | None = None  # a sliding-window limit on prompt tokens (count_tokens) ...
    tpm_window: float = 60.0  # ... per this many seconds
    # A token-bucket limit on chat calls, refilled continuously (as OpenAI's limiter is): it
    # holds bucket_size calls and gains bucket_rate a second; a 429 says when the next is in.
    bucket_rate: float | None = None
    bucket_size: int = 1


# What llama-cpp-python's server answers (HTTP 500) to a json_schema response_format.
LLAMA_CPP_JSON_SCHEMA_ERROR = (
    "[{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': \"Input "
    "should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': "
    "\"'text' or 'json_object'\"}}]"
)
MAX_TOKENS_REFUSAL = (
    "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
    "'max_completion_tokens' instead."
)
ENDLESS_WORDS = 4096  # what a reply without max_tokens runs to, after hang_seconds


@dataclass
class Quirks:
    """Behaviours of real servers (llama.cpp and proxies) that ragexam must cope with."""

    json_schema_status: int | None = None  # refuse json_schema response_format with this status
    json_schema_message: str = LLAMA_CPP_JSON_SCHEMA_ERROR
    drop_system: bool = False  # chat templates (gemma) that drop system messages
    endless_without_max_tokens: bool = False  # no max_tokens: generate until the context is full
    models: list[str] | None = None  # what GET /v1/models lists; None: 404, as without a list
    per_token_embeddings: bool = False  # llama.cpp without pooling: one vector per token
    refuse_max_tokens: bool = False  # OpenAI's reasoning models, also behind Azure or a proxy
    echo_schema_in_json_mode: bool = False  # a small model that writes the prompt's schema back
    context_room: int | None = None  # a full context window leaves a reply this many words
    tools_finish_as_tool_calls: bool = False  # llama.cpp: "tool_calls" even when cut at the limit
    words_per_second: float | None = None  # a CPU server: one reply at a time, written at this
    # speed, and written to the end even for a caller that gave up waiting
    # the chat models it serves; another is answered 404 model_not_found, as OpenAI does (or,
    # without the code, in vLLM's words)
    serves: frozenset[str] | None = None
    unknown_model_code: str | None = "model_not_found"


@dataclass
class Reply:
    """What a chat completion answers: assistant text or tool arguments, or an HTTP error."""

    status: int = 200
    content: str | None = None
    tool_args: str | None = None
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)
    error_message: str | None = None


@dataclass
class Recorded:
    """One request as received (header names lower-cased) and how it was answered."""

    path: str
    body: Any
    headers: dict[str, str]
    status: int = 0  # 0 while the reply is still pending (e.g. during a hang)
    fault: str | None = None
    at: float = field(default_factory=time.monotonic)  # when it arrived
    usage: dict[str, int] | None = None  # what a chat completion billed (its `usage`)
    query: str = ""  # the URL's query string, without the "?"
    raw: bytes = b""  # the body as sent, byte for byte


@dataclass
class _Out:
    status: int
    payload: Any
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as is instead of the JSON payload


class FakeOpenAI:
    """An OpenAI-compatible server on 127.0.0.1 with deterministic replies and injectable faults."""

    def __init__(
        self,
        *,
        latency: float = 0.0,
        seed: int = 0,
        embedding_dim: int = 64,
        api_key: str | None = None,
    ) -> None:
        self.latency = latency
        self.seed = seed
        self.embedding_dim = embedding_dim
        self.api_key = api_key
        self.faults = Faults()
        self.quirks = Quirks()
        self.listings: list[Recorded] = []  # GET /v1/models, kept apart from the API calls
        self.responder: Callable[[JSON], Reply | None] | None = None
        self.embed: Callable[[str], list[float]] | None = None
        self.count_tokens: Callable[[str], int] = _word_count  # how usage is billed
        self.requests: list[Recorded] = []
        self.batch = BatchFaults()  # the Batch API's knobs, read as each batch moves on
        self.batches = BatchServer(self)  # /v1/files and /v1/batches: tests/batch_server.py
        self._lock = threading.Lock()
        self._slot = threading.Lock()  # the one slot of a CPU server (Quirks.words_per_second)
        self._attempts: dict[str, int] = {}
        self._faulted: dict[str, int] = {}
        self._limits: dict[tuple[Any, ...], SlidingWindow | Bucket] = {}  # by kind and size
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.connections = 0  # connections accepted since start, for the benchmarks

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to give clients, e.g. http://127.0.0.1:PORT/v1."""
        if self._server is None:
            raise RuntimeError("FakeOpenAI is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> FakeOpenAI:
        """Bind a free port and serve from a daemon thread; returns self."""
        if self._server is None:
            self._stopping.clear()
            self._server = _Server(("127.0.0.1", 0), partial(_Handler, fake=self))
            # A short poll interval keeps stop() fast.
            target = partial(self._server.serve_forever, poll_interval=0.05)
            self._thread = threading.Thread(target=target, name="fake-openai", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: wake hung replies, drop open keep-alive connections, free the port."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        self.batches.stop()
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # handler threads blocked reading keep-alive sockets wake up and exit
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def batch_requests(self) -> list[BatchLine]:
        """Every batch line answered so far, apart from the sync `requests`."""
        return self.batches.requests

    def advance_batches(self, steps: int = 1) -> None:
        """Move each unfinished batch on by `steps` steps (with `batch.manual`), and wait."""
        self.batches.advance(steps)

    def count(self, path_suffix: str = "/chat/completions") -> int:
        """Number of requests received whose path ends with path_suffix."""
        with self._lock:
            return sum(rec.path.endswith(path_suffix) for rec in self.requests)

    def reset(self) -> None:
        """Forget requests, faults, overrides and attempt memory; latency back to 0."""
        with self._lock:
            self.requests.clear()
            self._attempts.clear()
            self._faulted.clear()
            self.listings.clear()
            self._limits.clear()
        self.batches.reset()
        self.faults = Faults()
        self.quirks = Quirks()
        self.batch = BatchFaults()
        self.responder = None
        self.embed = None
        self.latency = 0.0

    # -- request handling (runs on handler threads) --------------------------------------------

    def _respond(
        self, method: str, path: str, headers: dict[str, str], raw: bytes, query: str = ""
    ) -> _Out | None:
        """Answer one request and record it; None means the server is stopping: send nothing."""
        rec = Recorded(path=path, body=_parse_json(raw), headers=headers, query=query, raw=raw)
        with self._lock:
            (self.listings if method == "GET" else self.requests).append(rec)
        try:
            out = self._route(method, rec, raw)
        except Exception as exc:  # a broken responder/embed should fail the test, not hang it
            out = _error(500, f"fake server crashed: {exc!r}")
        rec.status = out.status
        # A rate limiter refuses at the door, without inference.
        if rec.fault not in ("rpm_limit", "tpm_limit", "bucket_limit"):
            self._stopping.wait(self.latency)
        return None if self._stopping.is_set() else out

    def _route(self, method: str, rec: Recorded, raw: bytes) -> _Out:
        token = rec.headers.get("authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and token != self.api_key:
            # The key is echoed verbatim, as OpenAI does, so tests can check clients redact it.
            return _error(401, f"Incorrect API key provided: {token}.")
        if method == "GET" and rec.path == "/v1/models" and self.quirks.models is not None:
            cards = [
                {"id": name, "object": "model", "created": 0, "owned_by": "ragexam-tests"}
                for name in self.quirks.models
            ]
            return _Out(200, {"object": "list", "data": cards})
        if rec.path.startswith(("/v1/files", "/v1/batches")):
            got = self.batches.route(method, rec, raw)
            return _Out(got.status, got.payload, got.headers, got.raw)
        if method != "POST" or rec.path not in ("/v1/chat/completions", "/v1/embeddings"):
            return _error(404, f"Unknown request URL: {method} {rec.path}")
        return self._call(rec)

    def _call(self, rec: Recorded, *, batch: bool = False) -> _Out:
        """Answer a chat or embeddings body: a sync request's, or a batch line's."""
        if not isinstance(rec.body, dict):
            return _error(400, "The request body is not a valid JSON object.")
        if rec.body.get("stream"):
            return _error(400, "streaming not supported by the test server")
        if rec.path == "/v1/chat/completions":
            return self._chat(rec.body, rec, batch=batch)
        return self._embeddings(rec.body, rec)

    def answer_line(self, url: str, body: Any) -> tuple[Recorded, Any]:
        """A batch line answered as a sync call to url would be: (its record, JSON or raw text)."""
        rec = Recorded(path=url, body=body, headers={})
        try:
            out = self._call(rec, batch=True)
        except Exception as exc:  # as in _respond: a broken responder fails the line
            out = _error(500, f"fake server crashed: {exc!r}")
        rec.status = out.status
        return rec, out.payload if out.raw is None else _json_or_text(out.raw.decode())

    def _chat(self, body: JSON, rec: Recorded, *, batch: bool = False) -> _Out:
        if self.quirks.serves is not None and body.get("model") not in self.quirks.serves:
            message = (
                f"The model `{body.get('model')}` does not exist or you do not have access to it."
            )
            out = _error(404, message)
            out.payload["error"]["code"] = self.quirks.unknown_model_code
            return out
        status = self.quirks.json_schema_status
        if status is not None and (body.get("response_format") or {}).get("type") == "json_schema":
            return _error(status, self.quirks.json_schema_message)
        if self.quirks.refuse_max_tokens and "max_tokens" in body:
            return _error(400, MAX_TOKENS_REFUSAL)
        if self.quirks.drop_system:  # the model never sees them, nor are they counted
            kept = [m for m in body.get("messages") or [] if m.get("role") != "system"]
            body = {**body, "messages": kept}
        messages = body.get("messages") or []
        text, key = _messages_text(messages), _body_key(messages)
        failure = self._inject(rec, text, key, chat=True, batch=batch)
        if failure is not None:
            return failure
        raw = self.faults.raw_200_if(_messages_text(messages)) if self.faults.raw_200_if else None
        if raw is not None:
            rec.fault = "raw_200"
            return _Out(200, None, {"Content-Type": raw[0]}, raw=raw[1].encode())
        reply = (self.responder(body) if self.responder else None) or _default_reply(body)
        echoed = _prompt_schema(messages) if self.quirks.echo_schema_in_json_mode else None
        if echoed is not None and (body.get("response_format") or {}).get("type") == "json_object":
            reply = Reply(content=json.dumps(echoed))
        if reply.status != 200:
            return _error(reply.status, reply.error_message or "error", headers=reply.headers)
        reply = self._bounded(body, _spoil(reply, rec.fault))
        completion = _completion(body, reply, self.count_tokens)
        rec.usage = completion["usage"]
        if self.quirks.words_per_second:
            with self._slot:  # one slot: a caller that gave up still holds it till the end
                self._stopping.wait(rec.usage["completion_tokens"] / self.quirks.words_per_second)
        return _Out(200, completion, dict(reply.headers))

    def _bounded(self, body: JSON, reply: Reply) -> Reply:
        """Honour max_tokens (as words); without it an endless server runs to its context."""
        if self.quirks.endless_without_max_tokens and body.get("max_tokens") is None:
            self._stopping.wait(self.faults.hang_seconds)  # only max_tokens counts, as llama.cpp
            return replace(reply, content="word " * ENDLESS_WORDS, finish_reason="length")
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if self.quirks.context_room is not None and isinstance(limit, int):  # llama.cpp: n_ctx
            limit = min(limit, self.quirks.context_room)  # shrinks the reply, and says nothing
        if isinstance(limit, int) and reply.content and _word_count(reply.content) > limit:
            cut = " ".join(reply.content.split()[:limit])
            return replace(reply, content=cut, finish_reason="length")
        if isinstance(limit, int) and reply.tool_args and _word_count(reply.tool_args) > limit:
            cut = " ".join(reply.tool_args.split()[:limit])
            finish = "tool_calls" if self.quirks.tools_finish_as_tool_calls else "length"
            return replace(reply, tool_args=cut, finish_reason=finish)
        return reply

    def _embeddings(self, body: JSON, rec: Recorded) -> _Out:
        texts = _embedding_inputs(body.get("input"))
        if texts is None:
            return _error(400, "'input' must be a string or a list of strings or token lists.")
        failure = self._inject(rec, "\n".join(texts), _body_key(body["input"]), chat=False)
        if failure is not None:
            return failure
        embed = self.embed or partial(_hashed_embedding, dim=self.embedding_dim)
        b64 = body.get("encoding_format") == "base64"
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(embed(text), b64)}
            for i, text in enumerate(texts)
        ]
        if self.quirks.per_token_embeddings:  # llama.cpp without pooling: a vector per token
            for item, text in zip(data, texts, strict=True):
                item["embedding"] = [list(map(float, embed(word))) for word in text.split()]
        tokens = _word_count(" ".join(texts))
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        reply = {"object": "list", "data": data, "model": _model(body), "usage": usage}
        if self.faults.embeddings_reply is not None:
            sent = self.faults.embeddings_reply(reply)
            if isinstance(sent, str):
                return _Out(200, None, {"Content-Type": "text/html"}, raw=sent.encode())
            return _Out(200, sent)
        return _Out(200, reply)

    def _inject(
        self, rec: Recorded, text: str, key: str, *, chat: bool, batch: bool = False
    ) -> _Out | None:
        """Set rec.fault and return the error reply it calls for; a hang only delays."""
        faults = self.faults
        limited = chat and not batch  # a batch paces its own lines: the sync limits see none
        wait = self._admit(("rpm", faults.rpm_limit, faults.rpm_window)) if limited else None
        if wait is not None:
            return _refused(rec, "rpm_limit", wait, "requests")
        wait = self._admit(("bucket", faults.bucket_rate, faults.bucket_size)) if limited else None
        if wait is not None:
            return _refused(rec, "bucket_limit", wait, "requests")
        tokens = self.count_tokens(text) if limited and faults.tpm_limit else 0
        wait = self._admit(("tpm", faults.tpm_limit, faults.tpm_window), tokens) if tokens else None
        if wait is not None:
            return _refused(rec, "tpm_limit", wait, "tokens")
        status = faults.status_if(text) if faults.status_if else None
        if status is not None:
            rec.fault = "status_if"
            return _error(status, f"Injected HTTP {status} (status_if).")
        if chat and faults.malformed_if is not None and faults.malformed_if(text):
            rec.fault = "malformed"  # forced: outside the random draw and its cap
        else:
            rec.fault = self._draw_fault(key, chat=chat)
        if rec.fault == "429":
            headers = {} if faults.retry_after is None else {"Retry-After": faults.retry_after}
            return _error(429, "Rate limit reached (injected).", headers=headers)
        if rec.fault == "500":
            return _error(500, "The server had an error (injected).")
        if rec.fault == "hang" and not batch:  # no client waits on a batch line, so none times out
            self._stopping.wait(faults.hang_seconds)  # stop() sets the event: no long wait
        return None

    def _admit(self, limit: tuple[Any, ...], cost: int = 1) -> float | None:
        """Take a call (or its tokens) under one of the faults' limits, if it is set; else the
        seconds until it would fit (limits.py)."""
        kind, first, second = limit  # rpm/tpm: the limit and its window; bucket: rate and size
        if not first:
            return None
        with self._lock:
            if limit not in self._limits:
                made = Bucket(first, second) if kind == "bucket" else SlidingWindow(first, second)
                self._limits[limit] = made
            return self._limits[limit].admit(time.monotonic(), cost)

    def _draw_fault(self, key: str, *, chat: bool) -> str | None:
        """This attempt's random fault: reproducible per (seed, body, attempt), capped per body."""
        faults = self.faults
        bands = [("429", faults.rate_429), ("500", faults.rate_500), ("hang", faults.rate_hang)]
        if chat:
            bands += [("truncate", faults.rate_truncate), ("malformed", faults.rate_malformed)]
        with self._lock:
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
            if self._faulted.get(key, 0) >= faults.max_faults_per_body:
                return None
            draw = random.Random(f"{self.seed}:{key}:{attempt}").random()
            edge = 0.0
            for name, rate in bands:
                edge += rate
                if draw < edge:
                    self._faulted[key] = self._faulted.get(key, 0) + 1
                    return name
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # stop() must never wait for a handler thread
    request_queue_size = 1024  # the default backlog of 5 resets connections under bursts

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (timeouts, stop()) are routine here; anything else is a real bug.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real clients pool connections

    def __init__(self, *args: Any, fake: FakeOpenAI, **kwargs: Any) -> None:
        self.fake = fake
        super().__init__(*args, **kwargs)

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as two writes; without NODELAY, Nagle plus delayed ACK
        # would add ~40 ms to every reply.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.fake._lock:
            self.fake._conns.add(self.connection)
            self.fake.connections += 1

    def finish(self) -> None:
        with self.fake._lock:
            self.fake._conns.discard(self.connection)
        with suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean; fake.requests is the log

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        path, _, query = self.path.partition("?")
        out = self.fake._respond(self.command, path, headers, raw, query)
        if out is None:
            self.close_connection = True
            return
        data = json.dumps(out.payload).encode() if out.raw is None else out.raw
        self.send_response(out.status)
        self.send_header("Content-Type", out.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(data)))
        for name, value in out.headers.items():
            if name != "Content-Type":
                self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


# -- pure helpers ---------------------------------------------------------------------------------


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> _Out:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    kind = "requests" if status == 429 else "invalid_request_error"
    kind = "server_error" if status >= 500 else kind
    error = {"message": message, "type": kind, "param": None, "code": _ERROR_CODES.get(status)}
    return _Out(status, {"error": error}, dict(headers or {}))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _body_key(value: Any) -> str:
    """The attempt-memory key: sha256 of canonical JSON, so retries of one body share it."""
    return _sha(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # multi-part content: keep the text parts
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _refused(rec: Recorded, fault: str, wait: float, what: str) -> _Out:
    """A rate limit's 429, saying when a slot frees."""
    rec.fault = fault
    headers = {"retry-after-ms": str(round(wait * 1000)), "retry-after": str(ceil(wait))}
    return _error(429, f"Rate limit reached for {what} ({fault}).", headers=headers)


def _messages_text(messages: list[JSON]) -> str:
    return "\n".join(_content_text(message.get("content")) for message in messages)


def _last_user_words(messages: list[JSON]) -> list[str]:
    users = [message for message in messages if message.get("role") == "user"] or messages
    return _content_text(users[-1].get("content")).split() if users else []


def _word_count(text: str) -> int:
    return max(1, len(text.split()))


def _json_or_text(raw: str) -> Any:
    """A raw 200 as a batch result line holds it: JSON as JSON (an API's body is an object)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _model(body: JSON) -> str:
    return str(body.get("model") or MODEL)


# -- default replies ------------------------------------------------------------------------------


def _default_reply(body: JSON) -> Reply:
    """The reply a cooperative model would give: schema-shaped JSON, a tool call, or a sentence."""
    messages = body.get("messages") or []
    key, words = _body_key(messages), _last_user_words(messages)
    fake = partial(_fake, path=key, words=words, quote=_quote(messages))
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema", {})
        return Reply(content=json.dumps(fake(schema, schema)))
    tool = _pick_tool(body)
    if tool is not None:
        schema = tool.get("parameters") or {}
        args = json.dumps(fake(schema, schema))
        return Reply(tool_args=args, finish_reason="tool_calls")
    schema = _prompt_schema(messages)
    if schema is None:
        return Reply(content=f"Reply {key[:8]}: " + " ".join(words[:12]))
    data = json.dumps(fake(schema, schema), indent=2)
    if response_format.get("type") == "json_object":
        return Reply(content=data)
    return Reply(content=f"Here is the JSON you asked for.\n```json\n{data}\n```")


def _pick_tool(body: JSON) -> JSON | None:
    """The function to call: the one tool_choice names, else the first; None without tools."""
    tools = [tool.get("function") or {} for tool in body.get("tools") or []]
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    wanted = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    return next((tool for tool in tools if tool.get("name") == wanted), tools[0])


def _prompt_schema(messages: list[JSON]) -> JSON | None:
    """The first ```json fence in the prompt that holds a JSON schema with properties."""
    for match in _FENCE.finditer(_messages_text(messages)):
        found = _parse_json(match.group(1).encode())
        if isinstance(found, dict) and "properties" in found:
            return found
    return None


def _quote(messages: list[JSON]) -> str:
    """The first words of the <answer> the last user message delimits: what a cooperative
    judge quotes as its evidence."""
    users = [message for message in messages if message.get("role") == "user"]
    text = _content_text(users[-1].get("content")) if users else ""
    found = re.search(r"<answer>\n(.*?)\n</answer>", text, re.DOTALL)
    return " ".join(found.group(1).split()[:3]) if found else ""


def _fake(schema: Any, root: JSON, path: str, words: list[str], quote: str = "") -> Any:
    """A deterministic instance of schema; path seeds the values and ends in the property name.

    A string property named `evidence` quotes the answer the prompt delimits, if it has one.
    """
    node = _resolve(schema, root)
    if path.count(".") > 12:  # stop recursive schemas; null is the least wrong value
        return None
    digest = _sha(path)
    pick = int(digest[:12], 16)
    if "const" in node:
        return node["const"]
    if node.get("enum"):
        return node["enum"][pick % len(node["enum"])]
    kind = _kind(node)
    if kind == "object":
        properties = node.get("properties") or {}
        return {
            name: _fake(sub, root, f"{path}.{name}", words, quote)
            for name, sub in properties.items()
        }
    if kind == "array":
        count = max(1, int(node.get("minItems", 1)))
        return [_fake(node.get("items") or {}, root, path, words, quote) for _ in range(count)]
    name = path.rsplit(".", 1)[-1]
    if kind == "string" and name == "evidence" and quote:
        return quote
    return _scalar(kind, node, name, digest, words)


def _resolve(node: Any, root: JSON) -> JSON:
    """Follow $ref (JSON pointers into root) and take the first non-null anyOf/oneOf branch."""
    while isinstance(node, dict):
        if "$ref" in node:
            target: Any = root
            for part in str(node["$ref"]).removeprefix("#/").split("/"):
                target = target[part]
            node = target
        elif "anyOf" in node or "oneOf" in node:
            options = node.get("anyOf") or node.get("oneOf") or [{}]
            node = next((o for o in options if o.get("type") != "null"), options[0])
        else:
            return node
    return {}


def _kind(node: JSON) -> str:
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in node else "array" if "items" in node else "string"
    return str(kind)


def _scalar(kind: str, node: JSON, name: str, digest: str, words: list[str]) -> Any:
    pick = int(digest[12:24], 16)
    if kind == "integer":
        low, high = _bounds(node, span=10, step=1)
        return int(low) + pick % (int(high) - int(low) + 1)
    if kind == "number":
        low, high = _bounds(node, span=1, step=0)
        fraction = 0.05 + 0.9 * (pick % 1001) / 1000  # interior, so exclusive bounds hold too
        return min(max(round(low + fraction * (high - low), 2), low), high)
    if kind == "boolean":
        return pick % 2 == 0
    if kind == "null":
        return None
    text = " ".join([name, digest[:8], *words[:4]])
    return text[: int(node.get("maxLength", len(text)))]


def _bounds(node: JSON, *, span: float, step: float) -> tuple[float, float]:
    """A numeric schema's [low, high]; exclusive bounds move inwards by step."""
    low = node.get("minimum", node.get("exclusiveMinimum", -step) + step)
    high = node.get("maximum", node.get("exclusiveMaximum", low + span + step) - step)
    return float(low), max(float(low), float(high))


# -- faults and response bodies -------------------------------------------------------------------


def _spoil(reply: Reply, fault: str | None) -> Reply:
    """Apply a content fault: truncate (half, finish_reason "length") or malformed JSON."""
    if fault == "truncate":
        cut = _half
    elif fault == "malformed":
        cut = _mangle
    else:
        return reply
    finish = "length" if fault == "truncate" else reply.finish_reason
    content = None if reply.content is None else cut(reply.content)
    tool_args = None if reply.tool_args is None else cut(reply.tool_args)
    return replace(reply, content=content, tool_args=tool_args, finish_reason=finish)


def _half(text: str) -> str:
    return text[: len(text) // 2]


def _mangle(text: str) -> str:
    """Break JSON past repair: cut it and append junk that no JSON text can contain."""
    fence = _FENCE.search(text)
    if fence:  # spoil the JSON inside the fence, so fence-extracting clients see broken JSON
        return text[: fence.start(1)] + _mangle(fence.group(1)) + text[fence.end(1) :]
    # Whether the cut lands inside a string or not, ' ",,}' leaves invalid JSON.
    return text[: max(1, len(text) * 2 // 3)] + ' ",,}'


def _completion(body: JSON, reply: Reply, count: Callable[[str], int] = _word_count) -> JSON:
    """A chat.completion object carrying reply, with usage counted by `count` (words)."""
    message: JSON = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_args is not None:
        name = (_pick_tool(body) or {}).get("name", "tool")
        function = {"name": name, "arguments": reply.tool_args}
        call_id = "call_" + _sha(reply.tool_args)[:12]
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    prompt = count(_messages_text(body.get("messages") or []))
    completion = count(f"{reply.content or ''} {reply.tool_args or ''}")
    total = prompt + completion
    choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
    return {
        "id": "chatcmpl-" + _body_key(body)[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": _model(body),
        "choices": [choice],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total},
    }


# -- embeddings -----------------------------------------------------------------------------------


def _embedding_inputs(value: Any) -> list[str] | None:
    """The texts to embed: a string, strings, or token lists (embedded as their str())."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(item, int) for item in value):  # one token list
        return [str(value)]
    return [item if isinstance(item, str) else str(item) for item in value]


@lru_cache(maxsize=65536)
def _word_slot(word: str, dim: int) -> tuple[int, float]:
    number = int(_sha(word)[:16], 16)
    return number % dim, 1.0 if number >> 63 else -1.0


def hashed_embedding(text: str, dim: int = 64) -> list[float]:
    """The vector this server embeds `text` as by default: stores built with it match."""
    return _hashed_embedding(text, dim=dim)


def _hashed_embedding(text: str, *, dim: int) -> list[float]:
    """Signed hashed bag of words, L2-normalised: shared words mean higher cosine similarity."""
    vector = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        slot, sign = _word_slot(word, dim)
        vector[slot] += sign
    norm = sum(x * x for x in vector) ** 0.5
    if norm == 0:  # no words: any unit vector beats a zero one (cosine would divide by zero)
        return [1.0] + [0.0] * (dim - 1)
    return [x / norm for x in vector]


def _encode(vector: list[float], b64: bool) -> list[float] | str:
    """float32 either way, so the float and base64 encodings decode to identical vectors."""
    packed = struct.pack(f"<{len(vector)}f", *vector)
    if b64:
        return base64.b64encode(packed).decode("ascii")
    return list(struct.unpack(f"<{len(vector)}f", packed))
