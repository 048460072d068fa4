"""The batch ledger: what a stage has sent and received on the batch road, one event a line.

Every event is appended and flushed to disk before the step that depends on it: a shard is
recorded once written, its batch the moment the endpoint made it. A process killed at any
point leaves a ledger that says what exists: a rerun reattaches to the batches in flight and
never sends their rows again. A torn last line (a kill mid-write) is ignored.

Paths inside the run folder are recorded relative to it, so that the folder may be moved or
named otherwise on the next run; others (a --batch-dir) are recorded resolved.

    shard      a request file written: its name, path, custom_ids file, lines, bytes, mode,
               the model its requests ask, and the batch job's totals with its requests in
    uploaded   its file is at the endpoint (file_id)
    submitted  its batch exists (batch_id)
    resubmit   its batch was refused for now (the queue was full): submit the file again
    making     a refused shard's batch is about to be made again (a kill leaves it to look up)
    ended      its batch ended (status), its results are on disk (files)
    resolved   every line has a result: its rows are no longer in flight
    dropped    never sent (not uploaded, or its batch refused): another road took its rows;
               the batch job's totals without its requests
    merged     one pass done: the result files whose lines are spent (rows were written from
               them), the file of results carried to a later pass, the --batch-dir files
               merged as they were (size, mtime), and the batch job's totals, all in one
               event, so that a kill leaves all of them recorded or none
    job        the batch job's totals (they ride on `shard`, `submitted` and `merged` too)

Older ledgers have `carry` and `seen` as events of their own: they are read as before.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragexam.io.atomic import write_error


@dataclass
class ShardState:
    """One shard, as far as it has gone."""

    name: str
    path: Path
    ids: Path
    lines: int
    url: str = "/v1/chat/completions"  # the endpoint of every request it holds
    mode: str = "api"  # sent through the endpoint's Batch API ("api") or to a folder ("dir")
    file_id: str | None = None
    batch_id: str | None = None
    submitted_at: float | None = None
    status: str | None = None  # the batch's status when it ended
    ended_at: float | None = None
    results: list[Path] = field(default_factory=list)
    # the downloaded ones: where each came from, and its size (to download a damaged one again)
    sources: dict[Path, tuple[str, int]] = field(default_factory=dict)
    resolved: bool = False
    refused: bool = False  # its last batch was refused (a full queue), none made since
    refused_ids: set[str] = field(default_factory=set)  # the batches the queue refused
    where: str | None = None  # the endpoint its batch was made at
    model: str | None = None  # the model its requests ask (None in older ledgers)

    @property
    def sent(self) -> bool:
        """Its requests may be at the endpoint or an engine: a shard written to a folder, or
        uploaded and not refused (a batch may have been made before its id was recorded).
        One never uploaded, or refused, is out nowhere: another road may take its rows."""
        return self.mode == "dir" or (self.file_id is not None and not self.refused)

    @property
    def waiting(self) -> bool:
        """Its rows are in flight: no result has come back for them yet."""
        return not self.resolved


class Ledger:
    """A stage's batch ledger: its shards and result files, replayed from its events."""

    def __init__(self, path: Path, tag: str) -> None:
        self.path, self.tag = path, tag
        self.root = path.parent.parent  # the run folder: OUT/batches/TAG.jsonl
        self.shards: dict[str, ShardState] = {}
        self.merged: set[Path] = set()
        self.carry: Path | None = None
        self.seen: dict[Path, tuple[int, int]] = {}
        self.count = 0  # shards ever written: names are numbered on
        self.job: dict[str, Any] = {}  # the batch job's totals, as its last run left them
        for event in self._events():
            self._apply(event)

    def _events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        events = []
        for line in self.path.read_bytes().split(b"\n"):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if isinstance(event, dict):
                events.append(event)
        return events

    def record(self, event: str, **values: Any) -> None:
        """Append one event, on disk before this returns."""
        entry = {"event": event, **{name: self._out(value) for name, value in values.items()}}
        # ASCII: a path's undecodable bytes (surrogates) are escaped, and read back the same
        data = (json.dumps(entry, default=str) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.path.open("ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise write_error(self.path, exc, "; make room and rerun the same command") from None
        self._apply(entry)

    def _out(self, value: Any) -> Any:
        """A value as recorded: a path inside the run folder relative to it."""
        if isinstance(value, list):
            return [self._out(item) for item in value]
        if not isinstance(value, Path):
            return value
        full = value.resolve()
        root = self.root.resolve()
        return str(full.relative_to(root)) if full.is_relative_to(root) else str(full)

    def file(self, recorded: str) -> Path:
        """A recorded path, as a path to open."""
        path = Path(recorded)
        return path if path.is_absolute() else self.root / path

    def _apply(self, event: dict[str, Any]) -> None:
        kind, name = event.get("event"), event.get("name", "")
        shard = self.shards.get(name)
        if kind == "shard":
            path, ids = self.file(event["path"]), self.file(event["ids"])
            url = str(event.get("url") or "/v1/chat/completions")
            mode = str(event.get("mode") or "api")
            self.shards[name] = ShardState(name, path, ids, int(event["lines"]), url, mode)
            self.shards[name].model = event.get("model")
            self.count += 1
        elif shard is not None and kind in SHARD_EVENTS:
            SHARD_EVENTS[kind](self, shard, event)
        elif kind == "merged":
            self.merged.update(self.file(item) for item in event["files"])
            for file, size, mtime in event.get("seen", []):
                self.seen[self.file(file)] = (int(size), int(mtime))
            if "carry" in event:
                self.carry = self.file(event["carry"]) if event["carry"] else None
        elif kind == "carry":  # older ledgers: an event of its own
            self.carry = self.file(event["file"]) if event.get("file") else None
        elif kind == "seen":  # older ledgers: an event of its own
            self.seen[self.file(event["file"])] = (int(event["size"]), int(event["mtime_ns"]))
        if kind == "job":
            self.job = {name: value for name, value in event.items() if name != "event"}
        elif isinstance(event.get("job"), dict):
            self.job = event["job"]

    def next_name(self) -> str:
        """The name of the next shard: `judge-000001`, numbered on across reruns.

        A name is taken when its shard is recorded: a shard a crash left unrecorded (a `.part`
        file) is written again under the same name.
        """
        return f"{self.tag}-{self.count + 1:06d}"

    def waiting(self) -> list[ShardState]:
        """The shards whose rows are in flight."""
        return [shard for shard in self.shards.values() if shard.waiting]

    def out_elsewhere(self, mode: str | None) -> list[ShardState]:
        """The waiting shards of another road than `mode` (None: the sync road) whose requests
        were sent; those never sent are dropped, their rows left to the road that runs now."""
        other = [shard for shard in self.waiting() if shard.mode != mode]
        for shard in other:
            if not shard.sent:
                self.record("dropped", name=shard.name, **self._unsent(shard))
        return [shard for shard in other if shard.sent]

    def _unsent(self, shard: ShardState) -> dict[str, Any]:
        """The batch job's totals without a shard dropped unsent: its `shard` event counted
        its requests as sent (nothing, for a job that does not count them)."""
        sent = self.job.get("requests")
        if type(sent) is not int:
            return {}
        return {"job": {**self.job, "requests": max(0, sent - shard.lines)}}

    def held(self) -> list[Path]:
        """Result files on disk, paid for and not merged yet: a batch's, downloaded by a run
        stopped before it merged them, and the results carried to a later pass."""
        unmerged = [
            path
            for shard in self.shards.values()
            for path in shard.results
            if path not in self.merged and path.exists()
        ]
        return unmerged + ([self.carry] if self.carry is not None and self.carry.exists() else [])


def _uploaded(ledger: Ledger, shard: ShardState, event: dict[str, Any]) -> None:
    shard.file_id = event["file_id"]


def _submitted(ledger: Ledger, shard: ShardState, event: dict[str, Any]) -> None:
    at = float(event.get("at") or time.time())
    shard.batch_id, shard.refused = event["batch_id"], False
    shard.where = event.get("where") or shard.where
    # made again after the queue refused it: its batch's time runs from the first, refusals in
    shard.submitted_at = at if shard.submitted_at is None else min(shard.submitted_at, at)


def _resubmit(ledger: Ledger, shard: ShardState, event: dict[str, Any]) -> None:
    if shard.batch_id:
        shard.refused_ids.add(shard.batch_id)
    shard.batch_id, shard.refused = None, True


def _making(ledger: Ledger, shard: ShardState, event: dict[str, Any]) -> None:
    shard.refused = False  # a batch may exist from here, made before its id is recorded


def _ended(ledger: Ledger, shard: ShardState, event: dict[str, Any]) -> None:
    shard.status, shard.ended_at = event["status"], float(event.get("at") or time.time())
    shard.results = [ledger.file(item) for item in event.get("files", [])]
    shard.sources = {
        ledger.file(str(path)): (str(file_id), int(size))
        for path, file_id, size in event.get("sources", [])
    }
    shard.resolved = True


def _resolved(ledger: Ledger, shard: ShardState, event: dict[str, Any]) -> None:
    shard.resolved = True


SHARD_EVENTS = {
    "uploaded": _uploaded,
    "submitted": _submitted,
    "resubmit": _resubmit,
    "making": _making,
    "ended": _ended,
    "resolved": _resolved,
    "dropped": _resolved,  # never sent: another road took its rows
}
