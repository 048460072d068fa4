"""The stage runner: concurrent rows, each written the moment it lands, resumable after any crash.

Each row runs on its own with its own error handling (never Runnable.batch, which loses
finished rows when one fails). A row that fails for good is written as an `error` row with
its reason; only AuthError (the key is refused) stops the run, after a few rows confirm it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from inspect import signature
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ragexam.errors import (
    AuthError,
    ConfigError,
    LLMError,
    OutputFileError,
    RagexamError,
    TooManyErrors,
)
from ragexam.io.csvfile import read_columns
from ragexam.io.fingerprint import changed_inputs, stale_rows
from ragexam.io.ledger import Ledger, ShardState
from ragexam.io.manifest import manifest_room, read_manifest, set_run_field, update_manifest
from ragexam.io.rowlog import RowLog
from ragexam.io.runfolder import RunFolder
from ragexam.llm.pacing import Traffic
from ragexam.llm.prices import carried_spend, record_cost
from ragexam.stages import stopping

if TYPE_CHECKING:
    from ragexam.config import Settings
    from ragexam.stages.session import Session

# Columns the runner fills for every stage, after the stage's own.
RUN_COLUMNS = (
    "status",
    "error",
    "model",
    "prompt_hash",
    "input_hash",
    "prompt_tokens",
    "completion_tokens",
    "attempts",
    "latency_s",
    "raw_reply",
)
AUTH_FAILURES_TO_STOP = 3  # calls refused (401, 403, out of quota) in a row: the stage stops
RAW_LIMIT = 2000
REASON_LIMIT = 300  # characters of an error reason the summary counts and shows


class Task(NamedTuple):
    """One row to do: its key, the columns known up front, and what the work needs (a tuple:
    made a million times, in half the time of a frozen dataclass)."""

    key: str
    known: Mapping[str, Any]
    payload: Any = None
    # Columns made from the payload only once the row is written (its input hash: the batch
    # road writes the requests of a million rows without writing one of them).
    late: Callable[[Any], Mapping[str, Any]] | None = None


class Encoded(NamedTuple):
    """An ok row already encoded as its CSV line (the bulk lane's), and its reply's tokens."""

    line: bytes
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Stage:
    """What a stage writes, and the fingerprint (model, prompt, fixed settings) its rows share."""

    name: str
    path: Path
    key: str
    columns: Sequence[str]
    model: str
    prompt_hash: str
    fixed: Mapping[str, Any] = field(default_factory=dict)  # settings every row must share
    # Of those, the ones older versions did not record, with the value their rows were made at.
    legacy: Mapping[str, Any] = field(default_factory=dict)
    # the columns of the rows' values, which every version wrote: a file without one is refused
    required: Sequence[str] = ()

    def all_columns(self) -> list[str]:
        """The output's columns: the key, the stage's own, then the runner's."""
        return [self.key, *self.columns, *RUN_COLUMNS]


@dataclass
class Outcome:
    """What a run did: rows by result, and what the calls cost."""

    done_before: int = 0
    redone: int = 0  # rows that were ok, but made from an input that has changed since
    dropped: int = 0  # tasks that wrote no row: harder questions their verification dropped
    quarantined: int = 0  # unreadable rows moved to FILE.bad-rows
    forced_out: int = 0  # rows of other settings that --force took out, and this run left out
    ok: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    learned_rpm: int | None = None  # the endpoint's rate limit, learned from its 429s
    advised_rpm: int | None = None  # --rpm to pace under it: never below what was admitted
    carried: bool = False  # the limit was learned before this stage, and paced from
    batch: dict[str, Any] | None = None  # on the batch road: its figures (batches, requests...)

    def record(self) -> dict[str, Any]:
        """The figures that go into the manifest."""
        rows = self.ok + self.errors
        return {
            "rows_ok": self.ok,
            "rows_error": self.errors,
            "rows_done_before": self.done_before,
            "rows_redone": self.redone,
            "rows_quarantined": self.quarantined,
            "rows_dropped": self.dropped,
            "rows_forced_out": self.forced_out,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(rows / self.seconds, 2) if self.seconds else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            **({"batch": self.batch} if self.batch is not None else {}),
        }

    @property
    def waiting(self) -> int:
        """Requests still waiting for their batch results (--batch-dir)."""
        return int((self.batch or {}).get("waiting", 0))

    def absorb(self, earlier: Outcome) -> None:
        """Count in what this command's send phase did of the stage (a run that sent its
        batches without waiting): one command, one account of the stage."""
        self.done_before = earlier.done_before  # the rows it wrote are no rows done before
        for name in ("redone", "dropped", "quarantined", "forced_out", "ok", "errors", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(earlier, name))
        self.prompt_tokens += earlier.prompt_tokens
        self.completion_tokens += earlier.completion_tokens
        for reason, count in earlier.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + count


class BatchesSent(Exception):  # no error: a signal to the send phase's caller
    """A stage of a send phase ran as far as sending its batches: run again, it waits."""


@dataclass(frozen=True)
class Sent:
    """What a stage's run in a send phase did: the same command's next run of the stage
    reports it as its own, and does not do again the rows it wrote (ok or not)."""

    outcome: Outcome
    keys: frozenset[str]


@dataclass(frozen=True)
class StageResult:
    """What a stage did, the file it wrote, and the input rows it skipped as errors."""

    outcome: Outcome
    path: Path
    skipped: int = 0
    notes: tuple[str, ...] = ()  # what else to tell of it (the harder questions kept)
    # the keys of the rows this run's inputs hold (None: every row of the file): the error
    # rows of others (questions since taken out of the exam) are not this run's to count
    keys: Collection[str] | None = None


# A row's values; None: the task writes no row (a harder question dropped by its verification)
Work = Callable[[Task], Awaitable[dict[str, Any] | None]]


class Progress(Protocol):
    """Where the runner reports rows as they land (the CLI draws a bar from it)."""

    def start(self, total: int | None, done_before: int) -> None:
        """The run begins: `total` rows to do, if known, beside those already done."""

    def advance(self, ok: bool, rows: int = 1) -> None:
        """Rows landed, one unless said (many: a forked child's, on the batch road; a
        progress whose `advance` takes no count is told them one at a time)."""

    def watch(self, traffic: Traffic) -> None:
        """The counters of the stage's calls (retries, 429s, the current pause), to show."""

    def batches(self, views: Sequence[Any], note: str) -> None:
        """On the batch road: each batch as the endpoint reports it, and what happens now."""


def advance_rows(progress: Progress, ok: bool, rows: int) -> None:
    """`advance` by many rows at once, or a row at a time for a progress written to the
    protocol before it took a count (a user's Observer)."""
    try:
        signature(progress.advance).bind(ok, rows)
    except (TypeError, ValueError):
        for _ in range(rows):
            progress.advance(ok)
        return
    progress.advance(ok, rows)


class Runner:
    """Runs a stage's tasks into its RowLog, skipping rows that are already `ok`."""

    def __init__(
        self,
        stage: Stage,
        *,
        concurrency: int,
        force: bool = False,
        redact: Callable[[str], str] = str,
        progress: Progress | None = None,
        earlier: Sent | None = None,
    ) -> None:
        self.stage = stage
        # without its status, every row reads as not ok: each would be paid for again
        required = (stage.key, "status", *stage.required)
        self.log = RowLog(stage.path, stage.all_columns(), required)
        self.concurrency = concurrency
        self.force = force
        self.redact = redact
        self.progress = progress
        self.outcome = Outcome()
        self._auth_failures = 0
        self._previous_errors: dict[str, Mapping[str, Any]] = {}
        self._started: set[str] = set()
        self._done: set[str] = set()
        self.last_row: dict[str, Any] = {}  # the row written last, as it was written
        self.earlier = earlier  # this command's send phase of the stage, if it had one
        self.sending = False  # a send phase: the batch road sends its batches, waits for none

    def resume(self, inputs: Callable[[], Mapping[str, str]] = dict) -> set[str]:
        """Load the output, keep its `ok` rows that are still current, return their keys.

        `inputs` gives the input hash of every row this run wants; an `ok` row whose input
        has changed is redone. Rows of another model, prompt or settings need --force.
        """
        inputs = cache(inputs)  # asked once at most: generate's reads every chunk of the store
        ok: dict[str, Mapping[str, Any]] = {}
        position: dict[str, int] = {}  # of each key's ok row in the file
        rows = self.log.load(self._resume_columns())
        if not self.log.path.exists():  # a stage with nothing to do still writes its file
            self.log.rewrite([])
        for at, row in enumerate(rows):
            key = row[self.stage.key]
            if row["status"] == "ok":
                ok[key], position[key] = row, at
                self._previous_errors.pop(key, None)
            elif key not in ok:
                self._previous_errors[key] = row
        self.outcome.quarantined = self.log.quarantined
        forced = stale_rows(self.stage, ok, self.force)
        for key in forced:
            del ok[key]
        if forced:  # taken out of the file: those this run does not want (--limit) are gone
            self.outcome.forced_out = len(set(forced) - inputs().keys())
        changed = changed_inputs(ok, inputs) if ok else []
        for key in changed:
            del ok[key]
        self.outcome.redone = len(changed)
        if len(ok) < len(rows):  # only to drop rows: a file of `ok` rows is appended to as it is
            self.log.keep({position[key] for key in ok})  # error rows go; they come back
        self.outcome.done_before = len(ok)
        self._done = set(ok) | (self.earlier.keys if self.earlier is not None else set())
        return set(self._done)

    def finished(self) -> set[str]:
        """The rows this run is done with: `ok` before it, or written in it (ok or not)."""
        return self._done | self._started

    def _resume_columns(self) -> list[str]:
        """What resume reads of an `ok` row: its key, status and fingerprint."""
        fingerprint = ["model", "prompt_hash", "input_hash", *self.stage.fixed]
        return [self.stage.key, "status", *fingerprint]

    async def run(self, tasks: Iterable[Task] | AsyncIterator[Task], work: Work) -> Outcome:
        """Do every task not yet `ok`, `concurrency` at a time, writing rows as they land."""
        started = time.monotonic()
        source = aiter_of(tasks)
        lock = asyncio.Lock()  # an async generator cannot be advanced by two workers at once
        workers = [
            asyncio.create_task(self._worker(source, lock, work)) for _ in range(self.concurrency)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self.finish(started)
        return self.outcome

    def finish(self, started: float) -> None:
        """End the run: its time, the error rows it did not reach put back, the file closed."""
        self.outcome.seconds = time.monotonic() - started
        try:
            self._restore_untouched_errors()
        finally:
            self.log.close()

    async def _worker(self, source: AsyncIterator[Task], lock: asyncio.Lock, work: Work) -> None:
        while True:
            async with lock:
                task = await anext(source, None)
            if task is None:
                return
            self.settle(task, await self.attempt(task, work))

    def settle(self, task: Task, values: dict[str, Any] | Encoded | None) -> None:
        """Write the row of a task that is done, ok or not, from its values or its line
        (None: it writes no row)."""
        if values is None:
            self.outcome.dropped += 1
        elif isinstance(values, Encoded):
            self.log.append_line(values.line)
            self._count(True, values.prompt_tokens, values.completion_tokens)
        else:
            self._record(task, values)
        self._started.add(task.key)  # after the write: Ctrl-C mid-call keeps the old row

    async def attempt(self, task: Task, work: Work) -> dict[str, Any] | None:
        """Do one task: its row's values, an error row's, or None (a harder question its
        verification dropped); what stops the stage is raised."""
        try:
            values = await work(task)
            if values is None:
                return None
        except AuthError as exc:
            self._auth_failures += 1
            if self._auth_failures >= AUTH_FAILURES_TO_STOP:
                raise AuthError(self.redact(str(exc))) from None
            return self._error_row(exc)
        except RagexamError as exc:
            if exc.stops_stage:
                raise  # every row would fail the same way: stop the stage
            return self._error_row(exc)
        self._auth_failures = 0  # a call went through: the refusals stop the stage in a row
        return ok_row(values)

    def _error_row(self, exc: RagexamError) -> dict[str, Any]:
        reason = self.redact(" ".join(str(exc).split()))
        row: dict[str, Any] = {"status": "error", "error": reason}
        if isinstance(exc, LLMError):
            row["attempts"] = exc.attempts
            row["prompt_tokens"], row["completion_tokens"] = exc.tokens
            if exc.raw:
                row["raw_reply"] = self.redact(exc.raw[:RAW_LIMIT])
        return row

    def _record(self, task: Task, values: dict[str, Any]) -> None:
        row = {self.stage.key: task.key, **task.known}
        if task.late is not None:
            row.update(task.late(task.payload))
        row.update(values)
        row.setdefault("model", self.stage.model)
        row.setdefault("prompt_hash", self.stage.prompt_hash)
        self.log.append(row)
        self.last_row = row
        ok = row["status"] == "ok"
        if not ok:
            reason = str(row["error"])[:REASON_LIMIT]  # whole: the summary wraps it, never cuts
            self.outcome.reasons[reason] = self.outcome.reasons.get(reason, 0) + 1
        tokens = (int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0))
        self._count(ok, *tokens)

    def settle_lines(
        self, keys: Sequence[str], lines: Sequence[bytes], tokens: tuple[int, int]
    ) -> None:
        """`settle`, of ok rows already encoded as their lines, in one write and one count:
        their keys, lines, and prompt and completion tokens in all."""
        self.log.append_lines(lines)
        self._count(True, *tokens, rows=len(lines))
        self._started.update(keys)

    def _count(self, ok: bool, prompt_tokens: int, completion_tokens: int, rows: int = 1) -> None:
        if ok:
            self.outcome.ok += rows
        else:
            self.outcome.errors += rows
        self.outcome.prompt_tokens += prompt_tokens
        self.outcome.completion_tokens += completion_tokens
        if self.progress is None:
            return
        if rows == 1:
            self.progress.advance(ok)
        else:
            advance_rows(self.progress, ok, rows)

    def _restore_untouched_errors(self) -> None:
        """Error rows of an earlier run that this run did not reach go back in the file."""
        for key, row in self._previous_errors.items():
            if key not in self._started:
                self.log.append(row)
        self._previous_errors = {}  # put back once; this run did not do them: a rerun retries


def ok_row(values: dict[str, Any]) -> dict[str, Any]:
    """A row's values as an `ok` row's."""
    return {**values, "status": "ok", "error": None}


class Plan(Protocol):
    """What a stage hands the runner: its tasks, the work of one row, and its resources."""

    def tasks(self, done: set[str]) -> tuple[int | None, Iterable[Task] | AsyncIterator[Task]]:
        """How many rows are left (if known) and the tasks, given the keys already done.

        Each task's `known` (or `late`) holds its `input_hash`.
        """
        ...

    def inputs(self) -> Mapping[str, str]:
        """The input hash of every row this run wants, by key."""
        ...

    async def work(self, task: Task) -> dict[str, Any] | None:
        """Do one row; raise a RagexamError to make it an error row (None: no row)."""
        ...

    async def preflight(self) -> None:
        """Check, inside the event loop and before the first row, what would fail every row."""
        ...

    async def aclose(self) -> None:
        """Release connections and clients."""
        ...

    def figures(self) -> dict[str, Any]:
        """What the stage adds to its manifest record when it ends (calls, methods)."""
        ...


# The batch road: it does the plan's rows through the runner, as their results come back.
Road = Callable[[Runner, Plan, "Progress | None"], Awaitable[None]]


@dataclass(frozen=True)
class RunSettings:
    """How the runner runs: the run folder, rows in flight, and what it may redo."""

    out: Path
    concurrency: int
    force: bool = False
    redact: Callable[[str], str] = str
    road: Road | None = None  # the batch road (stages/batch.py), else the sync road
    settings: Settings | None = None  # prices a run that stops (the command prices the rest)


def execute(
    stage: Stage, plan: Plan, record: dict[str, Any], how: RunSettings, session: Session
) -> Outcome:
    """Resume the stage's output, run what is left in one event loop, and keep the manifest.

    The run folder is locked throughout (one writer at a time), and the session's observer
    is shown the rows as they land.
    """
    label = stage.name.replace("_", " ")
    parent = RunFolder(how.out).parent_run()
    if parent is not None:  # a control run's: "gold answer", not a second "answer"
        label = f"{how.out.name.replace('_', '-')} {label}"
    with (
        session.holding(how.out),
        manifest_room(how.out),
        session.observer.progress(label) as progress,
    ):
        if how.road is None:
            _refuse_while_batches_out(stage)
        try:
            return _execute(stage, plan, record, how, progress, session)
        finally:
            if session.endpoints.rates:  # for the next stage's command on this folder
                with suppress(OutputFileError):
                    set_run_field(how.out, "endpoints", session.endpoints.saved())


def _refuse_while_batches_out(stage: Stage) -> None:
    """Refuse the sync road while requests of the stage are out in batches: it would pay
    again for rows whose results are paid for already, and on their way."""
    folder = RunFolder(stage.path.parent)
    ledger = Ledger(folder.batch_ledger(stage.name), folder.batch_tag(stage.name))
    out = ledger.out_elsewhere(None)
    if out:
        raise batches_out(ledger, out)
    if ledger.held():
        raise results_held(ledger, "--batch")


def results_held(ledger: Ledger, road: str) -> ConfigError:
    """The error of a stage run on a road that would not merge the results it holds."""
    return ConfigError(
        f"results of requests of {ledger.tag} are on disk in {ledger.path.parent}, paid for "
        f"and not merged yet: rerun with {road} to merge them (or delete {ledger.path} to "
        "forget them, and pay for their rows again)"
    )


def batches_out(ledger: Ledger, out: list[ShardState]) -> ConfigError:
    """The error of a stage run another way than the one its requests are out by."""
    where = (
        "in a batch of the endpoint's Batch API: rerun with --batch"
        if out[0].mode == "api"
        else f"in {out[0].path.parent}: rerun with --batch-dir {out[0].path.parent.parent}"
    )
    return ConfigError(
        f"{sum(shard.lines for shard in out)} requests of {ledger.tag} are out {where} to "
        f"collect their results (or delete {ledger.path} to forget them, and pay for their "
        "rows again)"
    )


def _execute(
    stage: Stage,
    plan: Plan,
    record: dict[str, Any],
    how: RunSettings,
    progress: Progress | None,
    session: Session,
) -> Outcome:
    earlier = session.sent.pop(stage.path, None)
    runner = Runner(
        stage,
        concurrency=how.concurrency,
        force=how.force,
        redact=how.redact,
        progress=progress,
        earlier=earlier,
    )
    runner.sending = session.sending
    done = runner.resume(plan.inputs)
    total, tasks = plan.tasks(done)
    previous = read_manifest(how.out).get("stages", {}).get(stage.name)
    folder = RunFolder(how.out)
    job = Ledger(folder.batch_ledger(stage.name), folder.batch_tag(stage.name)).job
    # this run goes on with a batch job: one still open, of this model and prompt (another's
    # is left as it is, and this run begins its own)
    ours = (job.get("model"), job.get("prompt_hash")) == (stage.model, stage.prompt_hash)
    job_open = how.road is not None and bool(job) and not job.get("ended") and ours
    record = {**record, **carried_spend(previous if isinstance(previous, dict) else None, job_open)}
    update_manifest(how.out, stage.name, {**record, "status": "running"})

    traffic = _traffic(plan)

    async def main() -> None:
        try:
            await plan.preflight()
            if progress is not None:
                progress.watch(traffic)
                progress.start(total, len(done))
            if how.road is None:
                await runner.run(tasks, plan.work)
            else:
                started = time.monotonic()
                try:
                    await how.road(runner, plan, progress)
                finally:
                    runner.finish(started)
        finally:
            await plan.aclose()

    status = "failed"
    try:
        stopping.run(main())  # asyncio.run, stoppable in a worker thread (Jupyter's Ctrl-C)
        status = "waiting for batch results" if runner.outcome.waiting else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if earlier is not None:
            runner.outcome.absorb(earlier.outcome)
        runner.outcome.learned_rpm = traffic.learned_rpm
        runner.outcome.advised_rpm = traffic.advised_rpm()
        runner.outcome.carried = traffic.carried_rpm is not None
        figures = {**plan.figures(), **runner.outcome.record(), **traffic.record()}
        try:
            final = {**record, **figures, "status": status}
            update_manifest(how.out, stage.name, final, last=True)
            if status in ("failed", "interrupted") and how.settings is not None:
                record_cost(how.out, stage.name, how.settings)  # its calls were paid for too
        except OutputFileError:
            if status == "finished":
                raise  # otherwise the error that stopped the run is the one to show
    llm = getattr(plan, "llm", None)
    unreached = llm.reachability.never_reached() if llm is not None else None
    if unreached is not None:  # a stage too small to meet the first-calls cut-off
        raise unreached
    if session.sending:  # its batches are out: the command runs it again, to wait for them
        session.sent[stage.path] = Sent(runner.outcome, frozenset(runner.finished()))
        if how.settings is not None:  # priced now: the run that waits adds to it, as a rerun
            record_cost(how.out, stage.name, how.settings)
        raise BatchesSent
    return runner.outcome


def _traffic(plan: Plan) -> Traffic:
    """The counters of the plan's chat model, if it has one (a custom RAG has none)."""
    llm = getattr(plan, "llm", None)
    return llm.pacer.traffic if llm is not None else Traffic()


async def aiter_of(tasks: Iterable[Task] | AsyncIterator[Task]) -> AsyncIterator[Task]:
    """The tasks, as an async iterator whatever they came as."""
    if isinstance(tasks, AsyncIterator):
        async for task in tasks:
            yield task
    else:
        for task in tasks:
            yield task


def check_error_rate(
    path: Path, limit: float, keys: Collection[str] | None = None, key: str = "qa_id"
) -> None:
    """Raise TooManyErrors when the output holds more error rows than `limit` allows (of the
    rows whose `key` is among `keys`, when given)."""
    columns = read_columns(path, ["status"], optional=("error", key))  # not a million dicts
    statuses, said = columns["status"], columns.get("error", ())
    rows: Sequence[int] = range(len(statuses))
    if keys is not None and key in columns:
        rows = [at for at, found in enumerate(columns[key]) if found in keys]
    errors = [at for at in rows if statuses[at] != "ok"]
    if not rows or len(errors) / len(rows) <= limit:
        return
    reasons = Counter(" ".join(said[at].split())[:160] for at in errors if said and said[at])
    common = reasons.most_common(1)[0] if reasons else None
    raise TooManyErrors(len(errors), len(rows), limit, path, common)
