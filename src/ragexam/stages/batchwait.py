"""--batch: shards go to the endpoint's Batch API; ragexam waits, reattaching after any crash.

A shard's file is uploaded and its batch created, each step recorded in the ledger as soon as
it is done. A rerun resumes from the ledger: a shard uploaded but not recorded as submitted is
looked for among the endpoint's batches before a batch is made of it, so no row is paid twice.

When a batch ends, its output and error files are downloaded, and every request it left
without a result line gets one that says why (expired, cancelled, refused): the next pass
retries those within the retry budget, or writes the row as an error with that reason. A batch
refused because the queue is full (token_limit_exceeded) is submitted again later, after a
pause that doubles up to MAX_PAUSES polls, at no cost to its rows; refused RESUBMITS times in
one run (while no other batch of ours is in flight), the run stops (exit 4), its requests kept
for the rerun. A shard more than the queue ever holds (a low tier's enqueued-token limit is
below one shard of judge requests) is dropped, and its rows go out again in smaller shards.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ragexam.errors import ConfigError, EndpointError
from ragexam.io.batchfiles import read_ids, refused_line, scan_results, unrun_line
from ragexam.io.ledger import ShardState
from ragexam.llm.batchapi import TERMINAL, BatchApi, BatchView

if TYPE_CHECKING:
    from ragexam.stages.batch import BatchRoad

logger = logging.getLogger("ragexam")
# The states of OpenAI's Batch object; another one is waited on, once said.
KNOWN = ("validating", "in_progress", "finalizing", "cancelling", *TERMINAL)

QUEUE_FULL = "token_limit_exceeded"  # the Batch API's "try again once some batches are done"
FIRST_POLL = 0.5  # seconds before the first look at a new batch; doubled up to the poll setting
POLL_FAILURES = 10  # looks in a row that fail before the wait stops (a rerun reattaches)
RESUBMITS = 20  # a shard refused for a full queue this many times in one run: the run stops
MAX_PAUSES = 20  # the longest wait before a shard refused for a full queue goes out, in polls


async def api_rounds(road: BatchRoad, wait: bool = True) -> None:
    """Rounds until no shard waits: merge and send, submit, wait for a batch to end (or,
    without `wait`, one round: its batches made, their requests counted as waiting)."""
    api = BatchApi(road.mode.settings)
    waiter = Waiter(road, api)
    first = road.runner.earlier is None  # else this command's send phase just made the pass
    try:
        while True:
            fresh = [path for shard in road.ledger.shards.values() for path in shard.results]
            fresh = [path for path in fresh if path not in road.ledger.merged]
            await waiter.whole(fresh)
            if first or fresh or road.unsent:  # no new result, no row can move on: no pass
                await road.round(road.files / "requests", fresh)
                first = road.unsent = False
            await waiter.submit()
            if not road.ledger.waiting():
                return
            if not wait:
                road.waiting = len(road.out)
                return
            await waiter.wait()
    finally:
        await api.aclose()


class Waiter:
    """Submits a stage's shards and waits on their batches."""

    def __init__(self, road: BatchRoad, api: BatchApi) -> None:
        self.road, self.api = road, api
        self.poll = road.mode.settings.batch_poll
        self.unsure = {  # a batch may have been made before its id was recorded
            s.name for s in road.ledger.waiting() if s.file_id and not s.batch_id and not s.refused
        }
        self.refusals = 0  # refusals while no other batch of ours ran, in this run
        self.waits: dict[str, int] = {}  # refusals of each shard, each pausing longer
        self.given_up: EndpointError | None = None  # the queue stayed full: the run stops
        self.pause_until = 0.0  # after a full queue, no submission before this
        self.unknown: set[str] = set()  # states met that OpenAI's Batch API does not have

    async def submit(self) -> None:
        """Upload and submit every waiting shard that has no batch yet."""
        if time.monotonic() < self.pause_until:
            return
        for shard in self.road.ledger.waiting():
            if shard.batch_id is None:
                await self._submit(shard)

    async def _submit(self, shard: ShardState) -> None:
        ledger = self.road.ledger
        if shard.file_id is None:
            self.road.note(f"uploading {shard.name} ({shard.lines} requests)")
            ledger.record("uploaded", name=shard.name, file_id=await self.api.upload(shard.path))
        assert shard.file_id is not None
        skip = frozenset(shard.refused_ids)  # the queue's refusals: no batch of its requests
        unsure = shard.name in self.unsure
        found = await self.api.find(shard.file_id, skip) if unsure else None
        self.unsure.discard(shard.name)  # a crash after create, before the ledger knew
        if found is None:
            if shard.refused:  # from here a batch may exist unrecorded: a rerun looks it up
                ledger.record("making", name=shard.name)
            metadata = {"ragexam_shard": shard.name}
            found = await self.api.create(shard.file_id, shard.url, metadata, skip)
        self.road.batches += 1  # made now, or by a run killed before it recorded the batch
        # with the job's totals (the batch made counts), should the run be killed now
        job = self.road.totals(made=found.created_at)
        made = {"batch_id": found.id, "at": found.created_at, "where": self.api.where}
        ledger.record("submitted", name=shard.name, job=job, **made)
        self.road.submitted.append(shard.name)

    async def wait(self) -> None:
        """Look at the batches in flight until one ends; collect what each ended one left."""
        delay, failures = min(FIRST_POLL, self.poll), 0
        beside = _beside(sum(shard.waiting for shard in self.road.siblings()))
        while True:
            shards = [s for s in self.road.ledger.waiting() if s.batch_id]
            if not shards:  # every shard waits to be submitted again: wait out the pause
                await asyncio.sleep(max(self.pause_until - time.monotonic(), 0.0))
                return
            try:
                views = [await self.api.retrieve(str(s.batch_id)) for s in shards]
            except EndpointError as exc:
                if getattr(exc, "status", None) == 404:  # no such batch here: made elsewhere?
                    self._check_where(shards)
                failures += 1
                if failures >= POLL_FAILURES and getattr(exc, "status", None) == 404:
                    ledger = self.road.ledger.path
                    raise EndpointError(
                        f"{exc} ({failures} looks in a row): this endpoint knows no batch "
                        f"this folder recorded (made with another key or project, or deleted "
                        f"there?): rerun with the key that made it to collect its results, "
                        f"or delete {ledger} to forget them and send their rows again (paid "
                        "again)"
                    ) from None
                if failures >= POLL_FAILURES:
                    raise EndpointError(
                        f"{exc} ({failures} looks in a row): the batches go on at the "
                        "endpoint, paid for; the same command collects them once it answers"
                    ) from None
                views = []
            else:
                failures = 0
            self._say_unknown(views)
            ended = [(s, v) for s, v in zip(shards, views, strict=False) if v.ended]
            self.road.note(_waiting(views, shards) + beside, views)
            if ended:
                for shard, view in ended:
                    await self.collect(shard, view, running=len(views) > len(ended))
                if self.given_up is not None:  # once every ended batch is recorded as it is
                    raise self.given_up
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.poll)

    def _check_where(self, shards: list[ShardState]) -> None:
        """Stop at once when the batches were made at another endpoint than this run's: no
        look here can find them."""
        elsewhere = [s for s in shards if s.where and s.where != self.api.where]
        if elsewhere:
            shard = elsewhere[0]
            raise ConfigError(
                f"batch {shard.batch_id} of {self.road.tag} was made at {shard.where}, and this "
                f"run's endpoint is {self.api.where}: set OPENAI_BASE_URL back to collect its "
                "results (they are paid for)"
            )

    def _say_unknown(self, views: list[BatchView]) -> None:
        """Say once of each state the Batch API does not have that ragexam waits it out (a log
        of a background run would otherwise show a wait with no end in sight)."""
        for view in views:
            if view.status not in KNOWN and view.status not in self.unknown:
                self.unknown.add(view.status)
                logger.warning(
                    f"batch {view.id} is {view.status!r}, a state OpenAI's Batch API does not "
                    f"have: ragexam waits until it is one of {', '.join(TERMINAL)} (Ctrl-C "
                    "leaves the batch running; the same command reattaches to it)"
                )

    async def collect(self, shard: ShardState, view: BatchView, running: bool = False) -> None:
        """The results an ended batch left, one line for every request it was sent."""
        full = view.status == "failed" and any(code == QUEUE_FULL for code, _, _ in view.errors)
        if full:
            ledger = self.road.ledger
            ledger.record("resubmit", name=shard.name, reason=QUEUE_FULL)
            again = self.waits.get(shard.name, 0) > 0  # refused before in this run
            running = running or await self._crowded(view)
            # while batches of ours filled the queue, it is theirs to clear: not cut
            lines = None if running else fitting(shard, view, alone=True, again=again)
            if lines is not None:  # more than the queue ever holds: in smaller batches
                self.road.split(shard, lines)
            self._refused_again(shard, view, counted=not running)
            return
        self.road.note(f"downloading the results of {view.id}")
        folder, files, sources = self.road.files, [], []
        for kind, file_id in (("output", view.output_file_id), ("errors", view.error_file_id)):
            if file_id:
                files.append(folder / f"{view.id}.{kind}.jsonl")
                await self.api.download(file_id, files[-1])
                sources.append([files[-1], file_id, files[-1].stat().st_size])
        rest = _unanswered(shard, files)
        if rest:
            files.append(_write_unanswered(folder / f"{view.id}.unrun.jsonl", rest, view))
        # when it ended, not when this run saw it: a rerun may collect it a day later
        at = view.ended_at if view.ended_at and view.ended_at >= view.created_at else now()
        self.road.ledger.record(
            "ended", name=shard.name, status=view.status, files=files, at=at, sources=sources
        )

    async def whole(self, files: list[Path]) -> None:
        """Download again a result file, not merged yet, that is gone or not whole on disk (a
        hand's `rm`, a disk restored from a backup): its rows would else be asked, and paid
        for, again, and the job billed for less than the endpoint billed."""
        for shard in self.road.ledger.shards.values():
            for path, (file_id, size) in shard.sources.items():
                if path not in files or (path.exists() and path.stat().st_size == size):
                    continue
                what = "is gone" if not path.exists() else "is not whole"
                try:
                    await self.api.download(file_id, path)
                except EndpointError as exc:
                    if getattr(exc, "status", None) != 404:
                        raise
                    path.unlink(missing_ok=True)  # never half a file merged
                    logger.warning(
                        f"{self.road.tag}: {path} {what}, and the endpoint no longer has it "
                        f"({exc}): its rows are asked again"
                    )
                    continue
                logger.warning(
                    f"{self.road.tag}: {path} {what}: downloaded again from the endpoint"
                )

    async def _crowded(self, refused: BatchView) -> bool:
        """Whether a batch of another stage of this run (or of its control runs) was in the
        queue when this one was refused: sent at once, they share it."""
        at = refused.ended_at or time.time()
        for shard in self.road.siblings():
            if shard.refused or (shard.submitted_at or 0) > at or shard.batch_id is None:
                continue
            ended = shard.ended_at
            if ended is None and shard.waiting:  # its stage has not collected it yet: look
                try:
                    view = await self.api.retrieve(shard.batch_id)
                except EndpointError:
                    continue
                if view.status == "failed" and any(c == QUEUE_FULL for c, _, _ in view.errors):
                    continue  # refused too: it held no place in the queue
                if not view.ended:
                    return True  # in the queue now: no end in sight for this one's refusals
                ended = view.ended_at  # None: an endpoint that gives no times, ended long ago
            if ended is not None and ended >= at:
                return True
        return False

    def _refused_again(self, shard: ShardState, view: BatchView, counted: bool) -> None:
        """Pause before a shard refused for a full queue goes out again (longer each time), or
        stop the run when the queue stayed full: the rows are not at fault, and stay to do.
        A refusal while batches of ours are in flight is not `counted`: ours fill the queue,
        and free it as they end."""
        self.refusals += counted  # over the run: a shard cut smaller counts on
        waits = self.waits[shard.name] = self.waits.get(shard.name, 0) + 1
        if self.refusals >= RESUBMITS and self.given_up is None:
            self.given_up = EndpointError(
                f"the endpoint's Batch API refused batch {view.id} of {shard.name}: the "
                f"organisation's queue of batches is full ({QUEUE_FULL}), {self.refusals} times "
                f"in this run with no other batch of ours in it; rerun later: its "
                f"{shard.lines} requests are kept, and sent then"
            )
        pause = self.poll * min(2 ** (waits - 1), MAX_PAUSES)  # 10 minutes at most, by default
        self.pause_until = time.monotonic() + pause


def fitting(shard: ShardState, view: BatchView, alone: bool, again: bool = False) -> int | None:
    """How many of a refused shard's requests a batch may hold for the queue ever to take it;
    None when the shard fits, and the queue is only full for now.

    OpenAI's refusal names the limit ("Limit: 2,000,000 enqueued tokens", a low tier's, below
    one shard of judge requests), Azure's too ("the configured limit of 30K"): a shard over it
    is cut to fit, its tokens estimated from its bytes. Without a limit to read, or refused
    `again` though the estimate says it fits, a shard the queue refused while it held no
    other batch of ours is halved."""
    said = " ".join(message for code, message, _ in view.errors if code == QUEUE_FULL)
    found = _LIMIT.search(said)
    halved = max(shard.lines // 2, 1) if alone and shard.lines > 1 else None
    if found is None:
        return halved
    number, scale, unit = found.groups()
    limit = float(number.replace(",", "")) * {"k": 1e3, "m": 1e6}.get(scale.lower(), 1)
    if (unit or "").lower().startswith("request"):
        need = float(shard.lines)
    elif shard.path.exists():
        need = shard.path.stat().st_size / BYTES_PER_TOKEN
    else:  # its file tidied away: only the lines are known
        return halved
    if shard.lines == 1:
        return None
    if need <= limit:  # it should fit: the queue is full for now, unless refused alone again
        return halved if again else None
    return max(int(shard.lines * limit / need * FILL), 1)


# "Limit: 2,000,000 enqueued tokens" (OpenAI), "the configured limit of 30K" (Azure)
_LIMIT = re.compile(
    r"limit(?::| of)\s*([\d][\d,]*(?:\.\d+)?)\s*([km]?)\b\s*(?:enqueued\s+)?(tokens|requests)?",
    re.IGNORECASE,
)
BYTES_PER_TOKEN = 3.0  # a request line's bytes per prompt token, rounded down: JSON's overhead
FILL = 0.8  # of the limit a batch of a cut shard fills: the estimate is rough


def _unanswered(shard: ShardState, files: list[Path]) -> list[str]:
    """The custom_ids of the shard that no result file answers."""
    answered = {identifier for path in files for identifier, _, _ in scan_results(path)}
    return [identifier for identifier in read_ids(shard.ids) if identifier not in answered]


def _write_unanswered(path: Path, identifiers: list[str], view: BatchView) -> Path:
    """Result lines for requests a batch left unanswered, saying why."""
    with path.open("wb") as handle:
        for identifier in identifiers:
            handle.write(_why(identifier, view))
    return path


def _why(identifier: str, view: BatchView) -> bytes:
    """Why a request of this batch has no result: a refusal is final, the rest are retried."""
    if view.status == "failed":
        said = "; ".join(f"{code}: {message}" for code, message, _ in view.errors) or "no reason"
        return refused_line(identifier, 400, f"the Batch API refused batch {view.id}: {said}")
    if view.status in ("expired", "cancelled"):
        message = f"batch {view.id} {view.status} before this request ran"
        return unrun_line(identifier, f"batch_{view.status}", message)
    return unrun_line(identifier, "no_result", f"batch {view.id} gave no result for this request")


def _waiting(views: list[BatchView], shards: list[ShardState]) -> str:
    """One line on the batches in flight."""
    if not views:
        return f"waiting on {len(shards)} batches"
    done = sum(view.completed + view.failed for view in views)
    total = sum(view.total for view in views)
    return f"{len(views)} batches in flight, {done}/{total} requests answered"


def _beside(batches: int) -> str:
    """What the line on the batches in flight adds of the batches other stages of the run sent
    at once (out of sight while this stage's are waited on)."""
    if not batches:
        return ""
    one = batches == 1
    return (
        f"; {batches} batch{'' if one else 'es'} of the run's other stages out beside, "
        f"collected next"
    )


def now() -> float:
    """Seconds since the epoch, as batches are stamped."""
    return time.time()
