"""Batch files: request shards streamed to disk, and result lines in OpenAI's or vLLM's shape.

A request line is OpenAI's batch input: `{"custom_id", "method", "url", "body"}`, the body the
exact bytes the sync path sends. A shard holds at most MAX_LINES requests and MAX_BYTES bytes,
and is written under a `.part` name, then renamed, so a reader never sees half of one.

A custom_id is `TAG~N~DIGEST~KEY`: the stage's tag, the row's call number, the digest of the
request's body, and the row's key (last, so that a key may hold any character). A result is
only ever merged into the call of the row whose body has that digest now.

Result lines come in two shapes (tests/batch_api.py records both): OpenAI's, whose failures
carry their HTTP body or, for lines never run, `"response": null` and an error code; and
vLLM's, one file in input order, a failure's body null and its error an object or a string.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import orjson

from ragexam.io.atomic import write_error

MAX_LINES = 50_000  # OpenAI's limits per batch input file
MAX_BYTES = 200 * 1024 * 1024
BUFFER = 1 << 20
WINDOW = 1 << 20  # the most a result file is read at once (Spans)
UNRUN = 0  # the status of a line that never ran (expired, cancelled, a batch that failed)
_CUSTOM_ID = b'"custom_id"'


def custom_id(tag: str, call: int, digest: str, key: str) -> str:
    """The id of one request: which stage, call and body it is, for which row."""
    return f"{tag}~{call}~{digest}~{key}"


def parse_custom_id(text: str) -> tuple[str, int, str, str] | None:
    """(tag, call, digest, key) of a custom_id of ours, else None."""
    parts = text.split("~", 3)
    if len(parts) != 4 or not (parts[1].isascii() and parts[1].isdigit()):  # not "²"
        return None
    return parts[0], int(parts[1]), parts[2], parts[3]


def request_line(identifier: str, url: str, body: bytes) -> bytes:
    """One batch input line, the body embedded byte for byte."""
    head = f'{{"custom_id":{encode_basestring(identifier)},"method":"POST","url":'
    return b"".join((head.encode(), encode_basestring(url).encode(), b',"body":', body, b"}\n"))


@dataclass(frozen=True)
class Shard:
    """A finished shard: its name, file, the file of its custom_ids, and its size."""

    name: str
    path: Path
    ids: Path
    lines: int
    size: int


class ShardWriter:
    """Streams request lines into shard files of at most MAX_LINES lines and MAX_BYTES bytes.

    Each finished shard is handed to `done` (which records it) before the next one begins.
    Its bytes go to disk from another thread, a chunk at a time: the kernel may hold a write
    back (at a million rows, 2.9 GB of requests), and the rows' work goes on meanwhile.
    """

    def __init__(
        self,
        folder: Path,
        ids_folder: Path,
        names: Iterator[str],
        done: Callable[[Shard], None],
    ) -> None:
        self.folder, self.ids_folder, self.names, self.done = folder, ids_folder, names, done
        self.max_lines, self.max_bytes = MAX_LINES, MAX_BYTES
        self.lines = 0  # requests written in all
        self._file: _Behind | None = None
        self._ids: Any = None
        self._name = ""
        self._count = self._size = 0

    def write(self, identifier: str, line: bytes) -> None:
        """Add one request line, starting a new shard when this one is full."""
        if self._file is not None and (
            self._count >= self.max_lines or self._size + len(line) > self.max_bytes
        ):
            self.close()
        if self._file is None:
            self._open()
            assert self._file is not None
        try:
            self._file.write(line)
            self._ids.write(identifier + "\n")
        except OSError as exc:  # a full disk: the shard is dropped, unrecorded, as a kill's
            final = self.folder / f"{self._name}.jsonl"
            raise write_error(final, exc, "; make room and rerun the same command") from None
        self._count += 1
        self._size += len(line)
        self.lines += 1

    def _open(self) -> None:
        self._name = next(self.names)
        path = self.folder / f"{self._name}.jsonl"
        try:
            for folder in (self.folder, self.ids_folder):
                folder.mkdir(parents=True, exist_ok=True)
            self._file = _Behind(self._part(path))
            ids = self._part(self.ids_folder / f"{self._name}.ids")
            self._ids = ids.open("w", encoding="utf-8", buffering=BUFFER)
        except OSError as exc:  # a folder made read-only, or full, since the run began
            self.abandon()
            raise write_error(path, exc) from None
        self._count = self._size = 0

    @staticmethod
    def _part(path: Path) -> Path:
        return path.with_name(path.name + ".part")

    def close(self) -> None:
        """Finish the shard being written: on disk, under its name, then recorded."""
        if self._file is None:
            return
        path = self.folder / f"{self._name}.jsonl"
        ids = self.ids_folder / f"{self._name}.ids"
        pairs = ((self._ids, ids), (self._file, path))
        for handle, final in pairs:  # both whole on disk before either takes its name
            try:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
            except OSError as exc:
                raise write_error(final, exc, "; make room and rerun the same command") from None
        for _, final in pairs:
            try:
                self._part(final).replace(final)
            except OSError as exc:
                raise write_error(final, exc, "; make room and rerun the same command") from None
        self._file = self._ids = None
        self.done(Shard(self._name, path, ids, self._count, self._size))

    def abandon(self) -> None:
        """Drop the shard being written (a crash leaves the same: a `.part` file, unrecorded)."""
        for handle in (self._file, self._ids):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
        self._file = self._ids = None


class _Behind:
    """A file written from another thread, BUFFER bytes at a time, at most AHEAD chunks ahead
    of the disk; a write that failed is raised by the next call here."""

    AHEAD = 8

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ragexam-shard")
        self._chunk: list[bytes] = []
        self._size = 0
        self._sent: deque[Future[None]] = deque()

    def write(self, data: bytes) -> None:
        """Add bytes; a full chunk goes to disk from the other thread."""
        self._chunk.append(data)
        self._size += len(data)
        if self._size >= BUFFER:
            self._send()

    def _send(self) -> None:
        if self._chunk:
            self._sent.append(self._pool.submit(write_all, self._fd, b"".join(self._chunk)))
            self._chunk, self._size = [], 0
        while self._sent and (len(self._sent) > self.AHEAD or self._sent[0].done()):
            self._sent.popleft().result()  # a failed write (no space) raises its OSError here

    def flush(self) -> None:
        """Every byte written to the file."""
        self._send()
        while self._sent:
            self._sent.popleft().result()

    def fileno(self) -> int:
        """The file's descriptor."""
        return self._fd

    def close(self) -> None:
        """Close the file (what was not flushed is dropped); again, nothing more."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._sent.clear()
        fd, self._fd = self._fd, -1
        if fd >= 0:  # never a number the system has since given another file
            os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to a file descriptor (os.write may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_ids(path: Path) -> Iterator[str]:
    """The custom_ids of a shard."""
    with path.open(encoding="utf-8") as handle:
        lines = handle.read().split("\n")  # at once: a shard's are a few MB
    for line in lines:
        if line.strip():
            yield line


# -- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One request's result: its HTTP status (UNRUN when it never ran) and body, or why not."""

    custom_id: str
    status: int
    body: Any
    reason: str = ""


class Spans:
    """Spans of one file, read through a window that doubles (to WINDOW) while the spans come
    in order, as a result file's lines mostly do: one read for up to a thousand lines, not one
    each. Spans out of order shrink it back to one read a span."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._data, self._start, self._size, self._used = b"", 0, 0, False

    def read(self, offset: int, length: int) -> bytes:
        """The bytes of a span (fewer at the end of the file)."""
        at = offset - self._start
        if at >= 0 and at + length <= len(self._data):
            self._used = True
            return self._data[at : at + length]
        onward = self._used or at == len(self._data)  # the window served, or ends right here
        self._size = min(max(self._size * 2, 1 << 12), WINDOW) if onward else self._size // 4
        self._data = os.pread(self._fd, max(length, self._size), offset)
        self._start, self._used = offset, False
        return self._data[:length]

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def scan_results(path: Path) -> Iterator[tuple[str, int, int]]:
    """(custom_id, offset, length) of every line of a result file that names one."""
    offset = 0
    with path.open("rb", buffering=BUFFER) as handle:
        for line in handle:
            found = _find_custom_id(line)
            if found is not None:
                yield found, offset, len(line)
            offset += len(line)


def _find_custom_id(line: bytes) -> str | None:
    """The custom_id of a result line, read without parsing the whole line."""
    at = line.find(_CUSTOM_ID)
    if at < 0:
        return None
    start = line.find(b'"', line.find(b":", at + len(_CUSTOM_ID)) + 1)
    if start < 0:
        return None
    end = line.find(b'"', start + 1)
    if end > 0 and b"\\" not in line[start:end]:  # no escape: as scanstring reads it, faster
        plain = line[start + 1 : end].decode("utf-8", errors="replace")
        if plain.isprintable():  # no control character, which scanstring refuses
            return plain
    try:
        text = line[start:].decode("utf-8", errors="replace")
        value, _ = scanstring(text, 1)
    except ValueError:
        return None
    return str(value)


def parse_answer(line: bytes) -> Answer | None:
    """A result line, in either shape, as an Answer; None for a line that is not one."""
    # orjson reads a line in a third of the time. It differs from json only on lines no
    # endpoint writes: an integer past 64 bits may be a float, and it nests 1,024 levels deep
    # where Python's recursion stops near 1,000. What it refuses, json reads or refuses.
    try:
        data = orjson.loads(line.removeprefix(codecs.BOM_UTF8))
    except orjson.JSONDecodeError:  # NaN, a lone surrogate, deeper nesting, or not JSON
        try:
            # UTF-8, the format's (a bad byte: not a line), its file perhaps begun with a BOM
            data = json.loads(line.decode().removeprefix("\ufeff"))
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
            return None
    if not isinstance(data, dict) or not isinstance(data.get("custom_id"), str):
        return None
    if "response" not in data and "error" not in data:  # a request line, or another shape
        return None
    response, error = data.get("response"), data.get("error")
    if not isinstance(response, dict):  # never ran: OpenAI's {"code", "message"}
        return Answer(data["custom_id"], UNRUN, None, _reason(error))
    status = response.get("status_code")
    status = status if isinstance(status, int) else 500
    body = response.get("body")
    if status != 200 and body is None:  # vLLM: the error is beside the response
        body = error if isinstance(error, dict) else {"error": {"message": _reason(error)}}
    return Answer(data["custom_id"], status, body)


def plain_result(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """(custom_id, body) of a result line in the commonest shape, a 200 whose body is an
    object, read as parse_answer reads it; None for any other line (parse_answer reads it)."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict:
        return None
    identifier, response = data.get("custom_id"), data.get("response")
    if type(identifier) is not str or type(response) is not dict:
        return None
    status, body = response.get("status_code"), response.get("body")
    if type(status) is not int or status != 200 or type(body) is not dict:
        return None
    return identifier, body


def whole_json(line: bytes) -> bool:
    """Whether a line is whole JSON: one cut short (a machine stopped while writing it) is not."""
    try:
        json.loads(line.decode("utf-8", errors="replace").removeprefix("\ufeff"))
    except (ValueError, RecursionError):
        return False
    return True


def failure_of(answer: Answer) -> str:
    """A failed result's reason, short: "HTTP 500: server exploded", or why it never ran."""
    if answer.status == UNRUN:
        return answer.reason or "never ran"
    body = answer.body if isinstance(answer.body, dict) else {}
    said = " ".join(_reason(body).split()) if "error" in body else ""
    return f"HTTP {answer.status}" + (f": {said[:120]}" if said else "")


def _reason(error: Any) -> str:
    if isinstance(error, dict):
        nested = error.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else error
        code, message = inner.get("code"), inner.get("message")
        return " ".join(str(part) for part in (f"{code}:" if code else "", message) if part)
    return str(error or "the batch gave no result for this request")


def unrun_line(identifier: str, code: str, message: str) -> bytes:
    """A result line for a request that never ran, as OpenAI's error file has it."""
    line = {"custom_id": identifier, "response": None, "error": {"code": code, "message": message}}
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"


def refused_line(identifier: str, status: int, message: str) -> bytes:
    """A result line for a request the endpoint refused with an HTTP status."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    response = {"status_code": status, "body": {"error": error}}
    line = {"custom_id": identifier, "response": response, "error": None}
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"
