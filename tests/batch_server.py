"""FakeOpenAI's Batch API: /v1/files and /v1/batches, with a worker thread per batch.

A batch walks validating -> in_progress -> finalizing -> completed (or fails validation,
expires or is cancelled), one step at a time: validating, each line, finalizing and
cancelling are steps, timed by `server.batch` (BatchFaults) or granted one by one by
`server.advance_batches()`. Each line's body is answered by `FakeOpenAI.answer_line`, the sync
chat path with its responder, quirks, faults and usage, so its completion is the sync one.
Lines never run are not counted in request_counts; they go to the error file.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from batch_api import (
    FAILURES,
    JSON,
    PURPOSES,
    QUEUE_FULL,
    RAW_BODY,
    UNRUN,
    BatchLine,
    HttpReply,
    api_error,
    batch_error,
    batch_error_line,
    batch_output_line,
    create_refusal,
    missing,
    page,
    parse_form,
    parse_input,
    usage_object,
)

if TYPE_CHECKING:
    from openai_server import FakeOpenAI, Recorded

DAY = 24 * 3600
TERMINAL = ("completed", "failed", "expired", "cancelled")
STAMPS = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))

    def object(self) -> JSON:
        """OpenAI's FileObject."""
        expires = self.created_at + 30 * DAY if self.purpose.startswith("batch") else None
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": expires,
            "status_details": None,
        }


@dataclass
class _Batch:
    id: str
    endpoint: str
    input_file_id: str
    input: bytes  # read at create: deleting the file later changes nothing
    metadata: dict[str, str] | None
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "validating"
    at: dict[str, int] = field(default_factory=dict)  # status -> when it began
    errors: list[JSON] | None = None
    lines: list[JSON] = field(default_factory=list)  # the valid input lines
    ok: list[str] = field(default_factory=list)  # result lines, in the order run
    failed: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=lambda: [0, 0])  # prompt, completion billed
    files: dict[str, str | None] = field(default_factory=dict)  # output/error -> file id
    credits: int = 0  # steps granted by advance_batches() and not yet taken
    idle: bool = False  # waiting to take a step
    polls: int = 0

    @property
    def ran(self) -> int:
        """Lines run so far."""
        return len(self.ok) + len(self.failed)

    def enter(self, status: str) -> None:
        """Move to status, stamping when."""
        self.status = status
        self.at[status] = int(time.time())

    def object(self) -> JSON:
        """OpenAI's Batch object, in the order of OpenAI's reference."""
        counts = {"total": len(self.lines), "completed": len(self.ok), "failed": len(self.failed)}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": "24h",
            "status": self.status,
            "output_file_id": self.files.get("output"),
            "error_file_id": self.files.get("error"),
            "created_at": self.created_at,
            **{f"{name}_at": self.at.get(name) for name in STAMPS},
            "expires_at": self.created_at + DAY,
            "request_counts": counts,
            "metadata": self.metadata,
            "model": self.lines[0]["body"].get("model") if self.lines else None,
            "usage": usage_object(*self.tokens),
        }


class BatchServer:
    """Files and batches held in memory; each batch runs on a worker thread of its own."""

    def __init__(self, server: FakeOpenAI) -> None:
        self.server = server
        self.requests: list[BatchLine] = []
        self._files: dict[str, _File] = {}
        self._batches: dict[str, _Batch] = {}
        self._threads: list[threading.Thread] = []
        self._changed = threading.Condition()  # its own lock, never held while lines are answered
        self._stopping = threading.Event()
        self._made = 0  # ids made so far: ids are deterministic per server seed
        self._failed_validation = 0  # batches that met fail_validation

    # -- lifecycle (test threads) ---------------------------------------------------------------

    def stop(self) -> None:
        """Stop every worker: each ends at its next step, or as its line's answer returns."""
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout=5)

    def reset(self) -> None:
        """Stop the workers and forget every file, batch and line."""
        self.stop()
        with self._changed:
            self._files.clear()
            self._batches.clear()
            self.requests.clear()
            self._made = 0
            self._failed_validation = 0
        self._stopping.clear()

    def advance(self, steps: int) -> None:
        """Grant each unfinished batch `steps` steps and wait until it has taken them."""
        if not self.server.batch.manual:
            raise RuntimeError("advance_batches() needs server.batch.manual = True")
        deadline = time.monotonic() + 10
        with self._changed:
            live = [batch for batch in self._batches.values() if batch.status not in TERMINAL]
            for batch in live:
                batch.credits += steps
            self._changed.notify_all()
            while not all(_settled(batch) for batch in live):
                if not self._changed.wait(deadline - time.monotonic()):
                    raise TimeoutError(f"batches did not take {steps} steps within 10 s")

    def shard_of(self, batch_id: str) -> str:
        """The ragexam shard a batch was made of (its metadata), for hooks that pick batches."""
        with self._changed:
            return str((self._batches[batch_id].metadata or {}).get("ragexam_shard", ""))

    # -- HTTP (handler threads) -----------------------------------------------------------------

    def route(self, method: str, rec: Recorded, raw: bytes) -> HttpReply:
        """Answer one /v1/files or /v1/batches request (as `alter` changes it)."""
        reply = self._route(method, rec, raw)
        alter = self.server.batch.alter
        return reply if alter is None else alter(method, rec.path, reply)

    def _route(self, method: str, rec: Recorded, raw: bytes) -> HttpReply:
        query = {name: values[-1] for name, values in parse_qs(rec.query).items()}
        match method, rec.path.removeprefix("/v1/").split("/"):
            case "POST", ["files"]:
                return self._upload(rec.headers.get("content-type", ""), raw)
            case "GET", ["files"]:
                return self._list(self._files, query, 10_000)
            case "GET", ["files", file_id, *content] if content in ([], ["content"]):
                return self._file(file_id, content=bool(content))
            case "DELETE", ["files", file_id]:
                return self._delete(file_id)
            case "POST", ["batches"]:
                return self._create(rec.body)
            case "GET", ["batches"]:
                return self._list(self._batches, query, 20)
            case "GET", ["batches", batch_id]:
                return self._retrieve(batch_id)
            case "POST", ["batches", batch_id, "cancel"]:
                return self._cancel(batch_id)
        return api_error(404, f"Unknown request URL: {method} {rec.path}")

    def _upload(self, content_type: str, raw: bytes) -> HttpReply:
        form = parse_form(content_type, raw)
        filename, data = form.get("file", (None, b""))
        purpose = form.get("purpose", (None, b""))[1].decode()
        if filename is None or not purpose:
            return missing("file" if filename is None else "purpose")
        if purpose not in PURPOSES:
            return api_error(400, f"Invalid value for 'purpose': '{purpose}'.", "purpose")
        if purpose == "batch" and not filename.endswith(".jsonl"):
            return api_error(400, "Invalid file format for Batch API. Must be .jsonl")
        limit = self.server.batch.max_bytes
        if purpose == "batch" and len(data) > limit:
            return api_error(400, f"File is {len(data)} bytes; batch input is limited to {limit}.")
        with self._changed:
            return HttpReply(200, self._store(filename, purpose, data).object())

    def _file(self, file_id: str, *, content: bool) -> HttpReply:
        with self._changed:
            found = self._files.get(file_id)
        if found is None:
            return api_error(404, f"No such File object: {file_id}", "id")
        if content:
            return HttpReply(
                200, raw=found.data, headers={"Content-Type": "application/octet-stream"}
            )
        return HttpReply(200, found.object())

    def _delete(self, file_id: str) -> HttpReply:
        with self._changed:
            found = self._files.pop(file_id, None)
        if found is None:
            return api_error(404, f"No such File object: {file_id}", "id")
        return HttpReply(200, {"id": file_id, "object": "file", "deleted": True})

    def _list(self, table: dict[str, Any], query: dict[str, str], limit: int) -> HttpReply:
        asked = query.get("limit", str(limit))
        if not asked.isdigit() or int(asked) < 1:
            return api_error(400, f"Invalid 'limit': {asked}.", "limit")
        with self._changed:
            objects = [item.object() for item in reversed(table.values())]  # newest first
        if "purpose" in query:
            objects = [item for item in objects if item["purpose"] == query["purpose"]]
        if query.get("order") == "asc":
            objects.reverse()
        return HttpReply(200, page(objects, query.get("after"), int(asked)))

    def _create(self, body: Any) -> HttpReply:
        refusal = create_refusal(body)
        if refusal is not None:
            return refusal
        file_id = body["input_file_id"]
        with self._changed:
            source = self._files.get(file_id)
            if source is None:
                return api_error(404, f"No such File object: {file_id}", "input_file_id")
            if source.purpose != "batch":
                message = f"The input file must have purpose 'batch', not '{source.purpose}'."
                return api_error(400, message, "input_file_id")
            batch = _Batch(
                self._id("batch_"), body["endpoint"], file_id, source.data, body.get("metadata")
            )
            self._batches[batch.id] = batch
            worker = threading.Thread(target=self._run, args=(batch,), name=batch.id, daemon=True)
            self._threads.append(worker)
            reply = HttpReply(200, batch.object())
        worker.start()
        return reply

    def _retrieve(self, batch_id: str) -> HttpReply:
        with self._changed:
            batch = self._batches.get(batch_id)
            if batch is None:
                return api_error(404, f"No batch found with id '{batch_id}'.", "batch_id")
            batch.polls += 1
            polls, reply = batch.polls, HttpReply(200, batch.object())
        hook = self.server.batch.retrieve_status
        status = hook(batch_id, polls) if hook else None
        if status is not None:
            return api_error(status, f"Injected HTTP {status} (retrieve_status).")
        return reply

    def _cancel(self, batch_id: str) -> HttpReply:
        with self._changed:
            batch = self._batches.get(batch_id)
            if batch is None:
                return api_error(404, f"No batch found with id '{batch_id}'.", "batch_id")
            if batch.status in ("completed", "failed", "expired"):
                return api_error(409, f"Cannot cancel a batch with status '{batch.status}'.")
            if batch.status not in ("cancelling", "cancelled"):
                batch.enter("cancelling")
                self._changed.notify_all()  # a worker waiting out a step turns to cancelling
            return HttpReply(200, batch.object())

    # -- the worker (one thread per batch) ------------------------------------------------------

    def _run(self, batch: _Batch) -> None:
        """Take the batch's steps until it ends or the server stops."""
        steps: dict[str, Callable[[_Batch], None]] = {
            "validate": self._validate,
            "line": self._line,
            "complete": partial(self._close, status="completed"),
            "cancel": partial(self._close, status="cancelled", unrun="batch_cancelled"),
            "expire": partial(self._close, status="expired", unrun="batch_expired"),
        }
        while not self._stopping.is_set():
            with self._changed:
                self._changed.notify_all()  # advance() watches for the step just taken
                step = self._next(batch)
            if step is None:
                return
            if step == "expire" or self._wait(batch, step):  # expiry is the clock, not a step
                steps[step](batch)

    def _next(self, batch: _Batch) -> str | None:
        """The batch's next step, or None once it has ended."""
        if batch.status in TERMINAL:
            return None
        named = {"cancelling": "cancel", "validating": "validate", "finalizing": "complete"}
        if batch.status in named:
            return named[batch.status]
        expire_after = self.server.batch.expire_after
        return "expire" if expire_after is not None and batch.ran >= expire_after else "line"

    def _wait(self, batch: _Batch, step: str) -> bool:
        """Wait out the step's time, or for advance() to grant it; False: choose again."""
        knobs = self.server.batch
        seconds = {"validate": knobs.seconds_validating, "line": knobs.seconds_per_line}
        seconds |= {"complete": knobs.seconds_finalizing, "cancel": knobs.seconds_cancelling}
        deadline = time.monotonic() + seconds[step]
        with self._changed:
            while not self._stopping.is_set():
                manual = self.server.batch.manual
                if step != "cancel" and batch.status == "cancelling":
                    return False
                if manual and batch.credits > 0:
                    batch.credits, batch.idle = batch.credits - 1, False
                    return True
                left = deadline - time.monotonic()
                if not manual and left <= 0:
                    return True
                if not batch.idle:  # notify once: workers waking each other would spin
                    batch.idle = True
                    self._changed.notify_all()
                self._changed.wait(0.05 if manual else left)  # a test may switch manual off
        return False

    def _validate(self, batch: _Batch) -> None:
        knobs = self.server.batch
        lines, errors = parse_input(batch.input, batch.endpoint, knobs.max_lines)
        if knobs.fail_validation is not None and self._fails_validation():
            code = knobs.fail_validation
            errors = [batch_error(code, FAILURES.get(code, f"Injected failure ({code})."))]
        elif knobs.queue_tokens is not None and self._queued(batch) / 4 > knobs.queue_tokens:
            model = lines[0]["body"].get("model") if lines else "fake-model"
            said = QUEUE_FULL.format(model=model, limit=knobs.queue_tokens)
            errors = [batch_error("token_limit_exceeded", said)]
        with self._changed:
            if errors:
                batch.errors = errors
                batch.enter("failed")
                return
            batch.lines = lines
            if batch.status != "cancelling":
                batch.enter("in_progress")

    def _queued(self, batch: _Batch) -> int:
        """The bytes the queue would hold with this batch in: its own, and with `queue_shared`
        those of the batches made before it and not ended (OpenAI counts every batch in flight)."""
        with self._changed:
            made = list(self._batches.values())
        earlier = made[: made.index(batch)] if self.server.batch.queue_shared else []
        return len(batch.input) + sum(len(b.input) for b in earlier if b.status not in TERMINAL)

    def _fails_validation(self) -> bool:
        """Whether this batch is one fail_validation fails (all, or the first count)."""
        count = self.server.batch.fail_validation_count
        with self._changed:
            self._failed_validation += 1
            return count is None or self._failed_validation <= count

    def _line(self, batch: _Batch) -> None:
        """Answer the next line, holding no lock, and keep its result line."""
        line = batch.lines[batch.ran]  # only this thread adds lines run
        record, reply = self._answer(batch.id, line)
        result = batch_output_line(
            line["custom_id"], reply, status_code=record.status, key=batch.id
        )
        usage = record.usage or {}
        with self._changed:
            (batch.ok if record.status == 200 else batch.failed).append(result)
            self.requests.append(record)
            batch.tokens[0] += usage.get("prompt_tokens", 0)
            batch.tokens[1] += usage.get("completion_tokens", 0)
            if batch.ran == len(batch.lines) and batch.status == "in_progress":
                batch.enter("finalizing")

    def _answer(self, batch_id: str, line: JSON) -> tuple[BatchLine, Any]:
        """A line's record and reply: fail_line_if's error, or the sync path's answer."""
        custom_id, body = line["custom_id"], line["body"]
        hook = self.server.batch.fail_line_if
        status = hook(custom_id, json.dumps(body, ensure_ascii=False)) if hook else None
        if status is not None:
            reply = api_error(status, f"Injected HTTP {status} (fail_line_if).").payload
            raw = line.get(RAW_BODY, b"")
            return BatchLine(batch_id, custom_id, body, status, "fail_line_if", raw=raw), reply
        rec, reply = self.server.answer_line(line["url"], body)
        raw = line.get(RAW_BODY, b"")
        record = BatchLine(batch_id, custom_id, body, rec.status, rec.fault, rec.usage, raw=raw)
        return record, reply

    def _close(self, batch: _Batch, status: str, unrun: str | None = None) -> None:
        """End the batch: its output and error files, with the lines never run as `unrun`."""
        with self._changed:
            rest = batch.lines[batch.ran :]
            never = [_unrun(x["custom_id"], unrun, batch.id) for x in rest] if unrun else []
            order = reversed if self.server.batch.reverse_output else list
            batch.files["output"] = self._results(batch.id, "output", order(batch.ok))
            batch.files["error"] = self._results(batch.id, "error", order([*batch.failed, *never]))
            batch.enter(status)

    # -- with the lock held ---------------------------------------------------------------------

    def _store(self, filename: str, purpose: str, data: bytes) -> _File:
        made = _File(self._id("file-"), filename, purpose, data)
        self._files[made.id] = made
        return made

    def _results(self, batch_id: str, kind: str, lines: Iterable[str]) -> str | None:
        """The id of a new result file of lines, or None for no lines (as OpenAI)."""
        text = "".join(line + "\n" for line in lines)
        if not text:
            return None
        return self._store(f"{batch_id}_{kind}.jsonl", "batch_output", text.encode()).id

    def _id(self, prefix: str) -> str:
        self._made += 1
        digest = hashlib.sha256(f"{self.server.seed}:{self._made}".encode()).hexdigest()
        return prefix + digest[: 24 if prefix == "file-" else 32]


def _unrun(custom_id: str, code: str, batch_id: str) -> str:
    """The error-file line of a line never run: code is batch_expired or batch_cancelled."""
    return batch_error_line(custom_id, code, UNRUN[code], key=batch_id)


def _settled(batch: _Batch) -> bool:
    """Whether the batch has taken every step granted, or ended."""
    return batch.status in TERMINAL or (batch.idle and batch.credits == 0)
