"""What the terminal is told as a command runs: the CLI's observer of the API's session."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ragexam.cli.collector import Collector
from ragexam.cli.display import (
    Starting,
    cost_text,
    progress_bar,
    run_cost_line,
    say,
    show_estimates,
    summary_line,
)
from ragexam.io.runfolder import RunFolder
from ragexam.stages.session import Observer, Session

if TYPE_CHECKING:
    from ragexam.analysis.calibrate import Calibration
    from ragexam.analysis.compare import CompareResult
    from ragexam.analysis.summary import StatsResult
    from ragexam.analysis.verdict import Verdict
    from ragexam.llm.prices import Price, RunCost
    from ragexam.stages.dryrun import Estimate
    from ragexam.stages.runner import Progress, StageResult

WIDE = 160  # columns of a table printed to a log, where no terminal sets the width
# What a stage's summary adds when it skipped rows that failed upstream.
SKIPPED = {
    "answer": "{} questions skipped: they are errors in the qa dataset",
    "judge": "{} answers skipped: they are errors in the answers file",
}


class Printer(Observer):
    """Draws each stage's bar, then its summary and cost; the tables of stats and compare."""

    def __init__(self, collector: Collector | None = None) -> None:
        self.notes: list[str] = []
        self.noted: set[str] = set()  # every note of the command: each is said once
        self.collector = collector

    def progress(self, stage: str) -> AbstractContextManager[Progress | None]:
        """A progress bar on stderr (plain lines when it is not a terminal); rows begin, so
        the cycle collector held while the command started runs again."""
        if self.collector is not None:
            self.collector.release()
        return self._bar(stage)

    @contextmanager
    def _bar(self, stage: str) -> Iterator[Progress | None]:
        bar = None
        try:
            with progress_bar(stage) as bar:
                yield bar
        except KeyboardInterrupt:
            self.say_notes()  # stopped: what was noted is said all the same, bar gone
            if bar is not None:  # which stage stopped, and what it had written
                say(bar.stopped_line())
            raise

    def note(self, text: str) -> None:
        """Said once the stage's bar is gone (or it is stopped); not before an error, which
        is one line."""
        if text not in self.noted:
            self.noted.add(text)
            self.notes.append(text)

    def say_notes(self) -> None:
        """Say what was noted, once."""
        while self.notes:
            say(self.notes.pop(0))

    def stage_done(
        self,
        stage: str,
        result: StageResult,
        cost: float | None,
        price: Price | None,
        billed: tuple[int, int] | None = None,
    ) -> None:
        """The stage's summary line and its cost."""
        self.say_notes()
        skipped = SKIPPED.get(stage, "").format(result.skipped) if result.skipped else None
        outcome = result.outcome
        folder = result.path.parent
        if RunFolder(folder).parent_run() is not None:  # "gold answer", not a second "answer"
            stage = f"{folder.name.replace('_', '-')} {stage}"
        if not (outcome.ok or outcome.errors or outcome.quarantined or skipped):
            done = f"{outcome.done_before} rows done before"
            waits = f"{outcome.waiting} requests wait for their results" if outcome.waiting else ""
            what = f"no row to write yet, {waits}" if waits else "nothing to do"
            say(f"{stage.replace('_', ' ')}: {what} ({done}) -> {result.path}", wrap=True)
            return
        summary_line(stage.replace("_", " "), result, skipped)
        for note in result.notes:
            say(f"  {note}")
        if not (outcome.prompt_tokens or outcome.completion_tokens):
            say("  cost: $0: no tokens were billed to ragexam's calls")
        elif price is None:
            say("  cost: unknown: set RAGEXAM_PRICE_INPUT and RAGEXAM_PRICE_OUTPUT (USD/1M tokens)")
        else:
            rows = (outcome.prompt_tokens, outcome.completion_tokens)
            # results no row uses now, a batch job's earlier runs: priced, and said so
            of = (
                f" for {billed[0]:,} in + {billed[1]:,} out billed"
                if billed not in (None, rows)
                else ""
            )
            say(f"  cost: {cost_text(cost)} ({price.short()}){of}", wrap=True)

    def estimates(self, estimates: list[Estimate]) -> None:
        """What a dry run would call and cost."""
        if self.collector is not None:
            self.collector.release()
        self.say_notes()
        show_estimates(estimates)

    def verdict(self, verdict: Verdict) -> None:
        """The judge's known-answer controls, in one line."""
        say(verdict.message(), wrap=True)

    def run_cost(self, cost: RunCost) -> None:
        """What every stage of the run cost in all."""
        say(run_cost_line(cost), wrap=True)

    def stats(self, result: StatsResult) -> None:
        """The worst documents as a table on stdout, then what qualifies them."""
        from ragexam.report.controlcharts import control_line
        from ragexam.report.headline import headline
        from ragexam.report.marked import key_point_line
        from ragexam.report.terminal import kind_table, terminal_table

        self.say_notes()
        Starting.clear()  # the table goes to stdout: no transient line may be drawn over it
        console = Console()
        console.print(terminal_table(result, console.width))
        if not result.by_kind.empty:
            Console().print(kind_table(result.by_kind))
        if line := control_line(result.overall):
            say(line)
        if line := key_point_line(result.overall):
            say(line)
        say(headline(result), wrap=True)
        if result.controls is not None:
            say(result.controls.message())
        regrade = result.stale - result.unanswered
        if regrade:
            say(
                f"Warning: {regrade} grade{' was' if regrade == 1 else 's were'} "
                "made from a question or answer that has changed since; "
                f"{'it counts' if regrade == 1 else 'they count'} as pending: rerun judge"
            )
        if result.unanswered:
            one = result.unanswered == 1
            say(
                f"Warning: {result.unanswered} grade{' is' if one else 's are'} of an answer "
                "gone from answers.csv or failed since, or made for another version of its "
                "question; "
                f"{'it counts' if one else 'they count'} as pending: rerun answer, then judge"
            )
        say(f"report: {result.paths['report']}")

    def compared(self, result: CompareResult) -> None:
        """The paired differences as a table."""
        from ragexam.report.terminal import comparison_table

        Starting.clear()
        for warning in result.warnings:
            say(f"Warning: {warning}")
        wide = None if sys.stdout.isatty() else WIDE  # a log cuts nothing: no terminal to fit
        Console(width=wide).print(comparison_table(result))
        say(f"comparison: {result.path}")
        if result.changes is not None:
            gained = int((result.changes["credit_b"] > result.changes["credit_a"]).sum())
            lost = len(result.changes) - gained
            say(f"key points: {gained} gained, {lost} lost in run B -> {result.changes_path}")

    def calibrated(self, result: Calibration) -> None:
        """The judge against a person's labels, with its one-line reading."""
        from ragexam.report.terminal import calibration_table

        Starting.clear()
        for note in result.notes:
            say(f"Warning: {note}")
        Console().print(calibration_table(result.table))
        say(result.reading)
        say(f"calibration: {result.path}")

    def template(self, path: Path, count: int) -> None:
        """Where the labels template is, and what to do with it."""
        say(
            f"labels template: {count} questions -> {path}; fill in completeness and/or "
            f"conciseness from 0 to 1, then run: ragexam calibrate {path} --out {path.parent}"
        )


@contextmanager
def printing_session(command: str, collector: Collector | None = None) -> Iterator[Session]:
    """A session whose observer prints, with a transient "starting" line until the first bar."""
    printer = Printer(collector)
    session = Session(observer=printer)
    try:
        with Starting.show(command):
            yield session
    finally:
        session.close()  # notes not yet said go unsaid: an error's one line says it all
