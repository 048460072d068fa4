"""What the terminal shows while a stage runs and when it ends: a progress bar, a summary."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.status import Status
from rich.text import Text

from ragexam.cli.batches import CountColumn, batch_line, batch_summary, batch_times
from ragexam.report.text import printable

if TYPE_CHECKING:
    from ragexam.llm.batchapi import BatchView
    from ragexam.llm.pacing import Traffic
    from ragexam.llm.prices import RunCost
    from ragexam.stages.dryrun import Estimate
    from ragexam.stages.runner import StageResult

err = Console(stderr=True)
PLAIN_EVERY = 10.0  # seconds between plain progress lines when stderr is not a terminal


def say(text: str, wrap: bool = False) -> None:
    """One plain line on stderr (no markup, no highlighting, no escapes); word-wrapped if asked,
    on a terminal: a log keeps each line whole, for grep, at any width."""
    soft = not (wrap and err.is_terminal)
    err.print(printable(text), markup=False, highlight=False, soft_wrap=soft)


class Starting:
    """A transient line on a terminal saying what happens before the first bar appears."""

    status: Status | None = None

    @classmethod
    @contextmanager
    def show(cls, command: str) -> Iterator[None]:
        """Show it while the command prepares; the first bar, or the command's end, clears it."""
        cls.clear()
        if err.is_terminal:
            doing = STARTING.get(command, READING)
            cls.status = err.status(f"{command}: {doing}", spinner="dots")
            cls.status.start()
        try:
            yield
        finally:
            cls.clear()

    @classmethod
    def clear(cls) -> None:
        """Remove the line, if it is showing."""
        status, cls.status = cls.status, None
        if status is not None:
            status.stop()


READING = "loading libraries, reading the run folder…"  # what stats, compare and calibrate do
STARTING = {
    name: "loading libraries, opening the store, checking the endpoint…"
    for name in ("run", "generate", "answer")
} | {"judge": "loading libraries, reading the run folder, checking the endpoint…"}


class _SayWarnings(logging.Handler):
    """Shows the core's warnings (the `ragexam` logger) as one `Warning:` line each."""

    def emit(self, record: logging.LogRecord) -> None:
        """One line on stderr."""
        say(f"Warning: {' '.join(record.getMessage().split())}")


def show_warnings() -> None:
    """Route the `ragexam` logger's warnings to the terminal, once per process."""
    logger = logging.getLogger("ragexam")
    if not any(isinstance(handler, _SayWarnings) for handler in logger.handlers):
        logger.addHandler(_SayWarnings(logging.WARNING))
        logger.propagate = False  # not twice through a root handler


class RateColumn(ProgressColumn):
    """Rows per second over the last few seconds ("now"), once there is a speed to show."""

    def render(self, task: Task) -> Text:
        """The current speed."""
        return Text(f"{task.speed:.1f} rows/s now" if task.speed else "- rows/s now")


def traffic_text(traffic: Traffic | None) -> str:
    """Retries, 429s and the current pause, e.g. `2 retries, 15 429s, pausing 4s`."""
    if traffic is None:
        return ""
    text = f"{traffic.retries} retries, {traffic.rate_limited} 429s"
    pause = traffic.pause()
    return f"{text}, pausing {pause:.0f}s" if pause >= 0.5 else text


class TrafficColumn(ProgressColumn):
    """What the calls meet: retries, 429s, and the longest wait under way; for a batch, its
    age and the endpoint's deadline; on the batch road, what the stage does now."""

    def __init__(self, progress: BarProgress) -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: Task) -> Text:
        """The traffic counters (or the batch's times), read live."""
        view = task.fields.get("batch")
        if view is not None:
            return Text(batch_times(view), style="cyan")
        if self.progress.note:
            return Text(self.progress.note, style="cyan")
        return Text(traffic_text(self.progress.traffic), style="yellow")


class BarProgress:
    """A rich progress bar on stderr: rows done, errors, rows/s, retries, 429s, the pause.

    It appears only when the run starts, so a fail-fast error stays one line. When stderr
    is not a terminal (CI logs), a plain line is printed every PLAIN_EVERY seconds instead.
    """

    def __init__(self, label: str) -> None:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            CountColumn(),
            RateColumn(),
            TrafficColumn(self),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.bar = Progress(*columns, console=err)
        self.label, self.errors, self.started = label, 0, False
        self.task = self.bar.add_task(label, errors=0, start=False)
        self.traffic: Traffic | None = None
        self.note = ""  # on the batch road: what the stage does now
        self.views: dict[str, BatchView] = {}
        self._batch_tasks: dict[str, TaskID] = {}
        self._stop = threading.Event()
        self._began = time.monotonic()

    def watch(self, traffic: Traffic) -> None:
        """Show these counters of the stage's calls."""
        self.traffic = traffic

    def batches(self, views: Sequence[BatchView], note: str) -> None:
        """A line per batch in flight (its state, requests answered and failed, its times)."""
        self.note = note
        for view in views:
            self.views[view.id] = view
            description = f"  {view.id[:18]} {view.status}"
            done, total = view.completed + view.failed, view.total or None
            if view.id not in self._batch_tasks:
                self._batch_tasks[view.id] = self.bar.add_task(
                    description, total=total, completed=done, batch=view, errors=view.failed
                )
            task = self._batch_tasks[view.id]
            self.bar.update(task, description=description, completed=done, total=total)
            self.bar.update(task, batch=view, errors=view.failed)

    def stop(self) -> None:
        """Take the bar down, or end the plain lines."""
        self._stop.set()
        if self.started:  # stopping a bar that never started prints a blank line
            self.bar.stop()

    def _plain_lines(self) -> None:
        while not self._stop.wait(PLAIN_EVERY):
            say(self.plain_line())

    def plain_line(self) -> str:
        """One line of progress for logs."""
        task = self.bar.tasks[0]
        done, total = int(task.completed), "?" if task.total is None else int(task.total)
        rate = done / max(time.monotonic() - self._began, 1e-9)
        parts = [f"{done}/{total} rows", f"{self.errors} errors", f"{rate:.1f} rows/s"]
        parts += [traffic_text(self.traffic)] if self.traffic and not self.note else []
        parts += [self.note] if self.note else []
        ended = [view for view in self.views.values() if view.ended]
        live = [batch_line(view) for view in self.views.values() if not view.ended]
        parts += [f"{len(ended)} batches ended"] if ended else []
        return "; ".join([f"{self.label}: {', '.join(parts)}", *live])

    def start(self, total: int | None, done_before: int) -> None:
        """Show the bar; rows already done are mentioned, not counted."""
        note = f"{self.label} ({done_before} already done)" if done_before else self.label
        Starting.clear()
        self.bar.update(self.task, total=total, description=note)
        self.bar.start_task(self.task)
        self._began = time.monotonic()
        if not err.is_terminal:
            threading.Thread(target=self._plain_lines, name="progress", daemon=True).start()
            return
        self.bar.start()
        self.started = True

    def advance(self, ok: bool, rows: int = 1) -> None:
        """More rows, one unless said."""
        self.errors += 0 if ok else rows
        self.bar.update(self.task, advance=rows, errors=self.errors)

    def stopped_line(self) -> str:
        """What the stage had done when it was stopped: the rows this run wrote."""
        done = int(self.bar.tasks[0].completed)
        errors = f", {self.errors} of them error rows" if self.errors else ""
        return (
            f"{self.label} stopped: {done} row{'' if done == 1 else 's'} written this run{errors}"
        )


@contextmanager
def progress_bar(label: str) -> Iterator[BarProgress]:
    """A bar that lives while one stage runs."""
    progress = BarProgress(label)
    try:
        yield progress
    finally:
        progress.stop()


def summary_line(stage: str, result: StageResult, skipped_note: str | None = None) -> None:
    """What was done, at what speed and token cost, where it is, and the commonest errors."""
    outcome = result.outcome
    rate = (outcome.ok + outcome.errors) / outcome.seconds if outcome.seconds else 0.0
    say(
        f"{stage}: {outcome.ok} ok, {outcome.errors} errors this run ({outcome.done_before} "
        f"done before) -> {result.path}",
        wrap=True,
    )
    say(
        f"  {outcome.seconds:.1f}s in all, setup included: {rate:.1f} rows/s overall; tokens "
        f"{outcome.prompt_tokens:,} in + {outcome.completion_tokens:,} out",
        wrap=True,
    )
    if outcome.learned_rpm and outcome.carried:
        say(
            f"  paced from the first call under the rate limit learned before: "
            f"~{outcome.learned_rpm:,} calls/min",
            wrap=True,
        )
    elif outcome.learned_rpm:
        say(
            f"  rate limit learned from the endpoint's 429s: ~{outcome.learned_rpm:,} calls/min "
            f"(--rpm {outcome.advised_rpm or outcome.learned_rpm} paces under it from the "
            "first call)",
            wrap=True,
        )
    if outcome.batch:
        say(f"  {batch_summary(outcome.batch)}", wrap=True)
    if outcome.redone:
        say(f"  {outcome.redone} rows redone: their input changed since they were made")
    if outcome.forced_out:
        say(
            f"  {outcome.forced_out} rows made with other settings were taken out by --force, "
            "and this run does not make them again (--limit leaves them out): rerun without "
            "--limit to make them",
            wrap=True,
        )
    if outcome.quarantined:
        bad = result.path.with_name(result.path.name + ".bad-rows")
        say(f"  {outcome.quarantined} unreadable rows moved to {bad} (line numbers kept)")
    groups = _alike(outcome.reasons)
    for count, reason, kinds in groups[:3]:
        alike = f" (and alike, but for their numbers: {kinds} variants)" if kinds > 1 else ""
        say(f"  {count} x {reason}{alike}", wrap=True)
    rest = sum(count for count, _, _ in groups[3:])
    if rest:
        say(f"  {rest} more, for other reasons: see the error column of {result.path}", wrap=True)
    if skipped_note:
        say(f"  {skipped_note}")


def _alike(reasons: Mapping[str, int]) -> list[tuple[int, str, int]]:
    """Error reasons grouped by their words, numbers aside ("cut off at 13 tokens" and "at 14
    tokens" are one reason), most frequent first: (rows, the most frequent wording, wordings)."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for reason, count in reasons.items():
        groups.setdefault(re.sub(r"\d+(\.\d+)?", "#", reason), []).append((count, reason))
    found = [
        (sum(count for count, _ in group), max(group)[1], len(group)) for group in groups.values()
    ]
    return sorted(found, key=lambda item: -item[0])


def cost_text(cost: float | None) -> str:
    """Dollars as people read them, or "unknown" (never $0 for a price nobody knows)."""
    if cost is None:
        return "unknown"
    return f"${cost:,.2f}" if cost >= 1 else f"${cost:.4f}"


def run_cost_line(cost: RunCost) -> str:
    """The run's total over every stage, or "unknown" with the priced part labelled as such."""
    runs = sorted({name.split("/")[0] for name in cost.stages if "/" in name})
    within = f" ({' and '.join(runs)} runs included)" if runs else ""
    if cost.total is not None:
        return f"run cost: {cost_text(cost.total)}, {len(cost.stages)} stages{within}"
    if cost.earlier and set(cost.earlier) == set(cost.unpriced):  # priced now, not then
        return (
            f"run cost: unknown: earlier runs of {', '.join(cost.earlier)} had no price, so "
            "the folder's total cannot be known (each stage's cost line above is this run's)"
        )
    unpriced = ", ".join(cost.unpriced)
    if len(cost.unpriced) == len(cost.stages):
        return f"run cost: unknown: no price for {unpriced}; set RAGEXAM_PRICE_INPUT/OUTPUT"
    return (
        f"run cost: unknown: no price for {unpriced}; "
        f"the priced stages alone: {cost_text(cost.priced)}"
    )


def show_estimates(estimates: list[Estimate]) -> None:
    """What --dry-run found, a line per stage, and the total (at the batch rate beside the
    sync one, with --batch)."""
    for e in estimates:
        cost = cost_text(e.cost_usd)
        if e.batched:
            cost = f"{cost_text(e.batch_cost_usd)} in batches ({cost} sync)"
        out = f"; {e.out} more wait on requests out in batches: not sent again" if e.out else ""
        say(
            f"{e.stage}: {e.rows} rows to do, {e.calls} calls, ~{e.input_tokens:,} tokens in + "
            f"~{e.output_tokens:,} out, {cost} ({e.model}){out}"
        )
    if len(estimates) > 1:
        total = cost_text(_sum(e.priced for e in estimates))
        if any(e.batched for e in estimates):
            total = f"{total} in batches ({cost_text(_sum(e.cost_usd for e in estimates))} sync)"
        say(f"total: {sum(e.calls for e in estimates)} calls, {total}")
    say("dry run: no call was made")


def _sum(costs: Iterable[float | None]) -> float | None:
    """The total, or None when any is unknown."""
    known = list(costs)
    return None if None in known else sum(cost or 0.0 for cost in known)
