"""What the terminal shows while a stage runs and when it ends: a progress bar, a summary."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.status import Status
from rich.text import Text

if TYPE_CHECKING:
    from ragexam.dryrun import Estimate
    from ragexam.runner import StageResult

err = Console(stderr=True)
# C0 and C1 control characters, DEL included; tab and newline are kept.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text with control characters (terminal escapes among them) shown as '?'."""
    return _CONTROL.sub("?", text)


def say(text: str, wrap: bool = False) -> None:
    """One plain line on stderr (no markup, no highlighting, no escapes); word-wrapped if asked."""
    err.print(printable(text), markup=False, highlight=False, soft_wrap=not wrap)


class Starting:
    """A transient line on a terminal saying what happens before the first bar appears."""

    status: Status | None = None

    @classmethod
    @contextmanager
    def show(cls, command: str) -> Iterator[None]:
        """Show it while the command prepares; the first bar, or the command's end, clears it."""
        cls.clear()
        if err.is_terminal:
            cls.status = err.status(f"{command}: {STARTING}", spinner="dots")
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


STARTING = "loading libraries, opening the store, checking the endpoint…"


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


class BarProgress:
    """A rich progress bar on stderr: rows done, errors, rows per second.

    It appears only when the run starts, so a fail-fast error stays one line.
    """

    def __init__(self, label: str) -> None:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[errors]} errors"),
            RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.bar = Progress(*columns, console=err)
        self.label, self.errors, self.started = label, 0, False
        self.task = self.bar.add_task(label, errors=0, start=False)

    def start(self, total: int | None, done_before: int) -> None:
        """Show the bar; rows already done are mentioned, not counted."""
        note = f"{self.label} ({done_before} already done)" if done_before else self.label
        Starting.clear()
        self.bar.update(self.task, total=total, description=note)
        self.bar.start_task(self.task)
        self.bar.start()
        self.started = True

    def advance(self, ok: bool) -> None:
        """One more row."""
        self.errors += not ok
        self.bar.update(self.task, advance=1, errors=self.errors)


@contextmanager
def progress_bar(label: str) -> Iterator[BarProgress]:
    """A bar that lives while one stage runs."""
    progress = BarProgress(label)
    try:
        yield progress
    finally:
        if progress.started:  # stopping a bar that never started prints a blank line
            progress.bar.stop()


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
    if outcome.redone:
        say(f"  {outcome.redone} rows redone: their input changed since they were made")
    if outcome.quarantined:
        bad = result.path.with_name(result.path.name + ".bad-rows")
        say(f"  {outcome.quarantined} unreadable rows moved to {bad} (line numbers kept)")
    for reason, count in sorted(outcome.reasons.items(), key=lambda item: -item[1])[:3]:
        say(f"  {count} x {reason}")
    if skipped_note:
        say(f"  {skipped_note}")


def cost_text(cost: float | None) -> str:
    """Dollars as people read them, or "unknown" (never $0 for a price nobody knows)."""
    if cost is None:
        return "unknown"
    return f"${cost:,.2f}" if cost >= 1 else f"${cost:.4f}"


def show_estimates(estimates: list[Estimate]) -> None:
    """What --dry-run found, a line per stage, and the total."""
    for e in estimates:
        say(
            f"{e.stage}: {e.rows} rows to do, {e.calls} calls, ~{e.input_tokens:,} tokens in + "
            f"~{e.output_tokens:,} out, {cost_text(e.cost_usd)} ({e.model})"
        )
    costs = [e.cost_usd for e in estimates]
    if len(estimates) > 1:
        total = None if None in costs else sum(c or 0.0 for c in costs)
        say(f"total: {sum(e.calls for e in estimates)} calls, {cost_text(total)}")
    say("dry run: no call was made")
