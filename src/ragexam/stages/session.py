"""What one command shares across its stages, passed down instead of kept in globals.

A `Session` is made by the caller (the CLI, or the API when none is given) and handed to every
stage a command runs: `ragexam run` hands the same one to generate, answer, judge and stats.
A notebook may share one across calls, so that a large store is copied once:

    with ragexam.Session() as session:
        ragexam.generate("db", session=session)
        ragexam.answer("db", session=session)
It holds the run folders' locks, the store snapshots, what was learned of the endpoint, and
the `Observer` that is told what happens (the CLI prints it; the API's default says nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ragexam.io.lock import Locks
from ragexam.llm.endpoint import EndpointMemory
from ragexam.store.snapshot import Snapshots

if TYPE_CHECKING:
    from ragexam.analysis.calibrate import Calibration
    from ragexam.analysis.compare import CompareResult
    from ragexam.analysis.summary import StatsResult
    from ragexam.analysis.verdict import Verdict
    from ragexam.llm.prices import Price, RunCost
    from ragexam.stages.dryrun import Estimate
    from ragexam.stages.runner import Progress, Sent, StageResult


class Observer:
    """Told what a command does; each method does nothing here. The CLI prints."""

    def progress(self, stage: str) -> AbstractContextManager[Progress | None]:
        """Where a stage reports its rows as they land."""
        return nullcontext()

    def note(self, text: str) -> None:
        """One line worth saying once the stage's bar is gone (a store read from a copy); the
        same line noted again (by a stage run twice, or each run of `run`) is said once."""

    def stage_done(
        self,
        stage: str,
        result: StageResult,
        cost: float | None,
        price: Price | None,
        billed: tuple[int, int] | None = None,
    ) -> None:
        """A stage finished its rows: what it did and what it cost (the tokens it priced:
        `billed`, when not those of its rows)."""

    def estimates(self, estimates: list[Estimate]) -> None:
        """What a dry run would call and cost."""

    def verdict(self, verdict: Verdict) -> None:
        """How the judge did on its known-answer controls."""

    def run_cost(self, cost: RunCost) -> None:
        """What every stage of a run cost in all."""

    def stats(self, result: StatsResult) -> None:
        """The summary, computed and written."""

    def compared(self, result: CompareResult) -> None:
        """Two runs compared."""

    def calibrated(self, result: Calibration) -> None:
        """The judge measured against a person's grades."""

    def template(self, path: Path, count: int) -> None:
        """A labels template written."""


@dataclass
class Session:
    """One command's shared state: locks held, snapshots, the endpoint, and its observer."""

    observer: Observer = field(default_factory=Observer)
    locks: Locks = field(default_factory=Locks)
    snapshots: Snapshots = field(default_factory=Snapshots)
    endpoints: EndpointMemory = field(default_factory=EndpointMemory)
    in_run: bool = False  # the stages belong to one `run`: its verdict is said once, by stats
    # A send phase (`sending_first`): each stage run sends its batches and raises BatchesSent;
    # what it did waits in `sent`, by output, for the run of the stage that waits on them.
    sending: bool = False
    sent: dict[Path, Sent] = field(default_factory=dict)

    @contextmanager
    def sending_first(self) -> Iterator[None]:
        """A send phase: the stages run now send their batches and wait for none, so that
        independent stages' batches run at once (what a stage notes in both phases is said
        once: the observer says a note once). Nested, the outer phase goes on."""
        if self.sending:
            yield
            return
        self.sending = True
        try:
            yield
        finally:
            self.sending = False

    def holding(self, out: Path) -> AbstractContextManager[None]:
        """Hold the run folder's lock for this session (once, however many stages take it)."""
        return self.locks.holding(out)

    def close(self) -> None:
        """Delete the snapshots this session made."""
        self.snapshots.remove()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def session_for(given: Session | None) -> Iterator[Session]:
    """The caller's session, or a new one closed at the end."""
    if given is not None:
        yield given
        return
    made = Session()
    try:
        yield made
    finally:
        made.close()
