"""The batch road: a stage's calls go out as batch files, and its rows are written as results
come back, beside the sync road and through the same runner, plan and LLM client.

`--batch` sends the shards through the endpoint's Batch API and waits for them (batchwait.py);
`--batch-dir DIR` writes them under DIR/requests/ for any engine that reads the format (vLLM's
`run-batch`), merges what it finds under DIR/results/, and says how many requests still wait.
Each round is a pass over the rows (replay.py) that writes the rows whose results are in and
sends the calls of the others: a re-ask, a retry of a failed line, the next sample, each goes
out in a later round, within the same retry budget as on the sync road.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import openai

from ragexam.config import Settings
from ragexam.errors import ConfigError, EndpointError, OutputFileError
from ragexam.io.batchfiles import parse_custom_id, read_ids
from ragexam.io.ledger import Ledger, ShardState
from ragexam.io.runfolder import RunFolder
from ragexam.llm.transport import routable
from ragexam.options import Given
from ragexam.stages.batchwait import api_rounds
from ragexam.stages.replay import Pass, ResultIndex, outstanding, results_of, token
from ragexam.stages.runner import Plan, Progress, Runner, RunSettings

MAX_ROUNDS = 200  # passes in one run: far above what retries and samples need; a loop is a bug
COUNTED = (  # the road's counts, summed over the runs of a batch job
    *("rounds", "requests", "results_merged", "requests_rendered", "results_read"),
    *("shards", "batches", "runs"),
)


@dataclass(frozen=True)
class BatchMode:
    """Where the batch road sends its requests: a folder, or (None) the endpoint's Batch API."""

    folder: Path | None
    settings: Settings


def run_settings(given: Given, settings: Settings) -> RunSettings:
    """How a stage runs: its run folder and concurrency, and the batch road when asked."""
    calls = given.calls
    road = None
    if calls.batch or calls.batch_dir is not None:
        if not routable():
            raise ConfigError(
                f"--batch and --batch-dir need openai 2.47 or later; this environment has "
                f"openai {openai.__version__}, whose HTTP client cannot hand ragexam its "
                "requests to write: pip install -U 'openai>=2.47'"
            )
        road = partial(drive, BatchMode(calls.batch_dir, settings))
    return RunSettings(given.out, settings.concurrency, calls.force, settings.redact, road)


async def drive(mode: BatchMode, runner: Runner, plan: Plan, progress: Progress | None) -> None:
    """Do the plan's rows on the batch road, until every row is written (or waits, in a dir)."""
    if getattr(plan, "llm", None) is None:
        raise ConfigError("this stage makes no chat call of ragexam's own: it cannot be batched")
    road = BatchRoad(mode, runner, plan, progress)
    stopped = True
    try:
        if mode.folder is not None:
            await road.files_round(mode.folder)
        else:
            await api_rounds(road)
        stopped = False
    finally:
        runner.outcome.batch = road.record()
        # stopped (Ctrl-C, a full disk...): the error that stopped the road is the one to show
        with suppress(OutputFileError) if stopped else nullcontext():
            road.close_job()


class BatchRoad:
    """A stage on the batch road: its ledger, its files, and what it did this run."""

    def __init__(
        self, mode: BatchMode, runner: Runner, plan: Plan, progress: Progress | None
    ) -> None:
        self.mode, self.runner, self.plan, self.progress = mode, runner, plan, progress
        folder = RunFolder(runner.stage.path.parent)
        self.tag = folder.batch_tag(runner.stage.name)
        self.ledger = Ledger(folder.batch_ledger(runner.stage.name), self.tag)
        self.files = folder.batch_files(runner.stage.name)
        self.kind = "dir" if mode.folder is not None else "api"
        self._check_elsewhere()
        done = runner.finished()  # rows written since their requests went out: wait no more
        self.out = {
            key: request for key, request in outstanding(self.ledger).items() if key not in done
        }
        runner.log.hold()  # a row lost to a kill is merged again: its results stay till then
        self.before = self._job_so_far()
        self.rounds = self.sent = self.merged = self.batches = 0
        self.direct = [0, 0]  # first requests rendered, and first results read, directly
        self.shards: list[str] = []  # written this run
        self.waiting = 0

    def _job_so_far(self) -> dict[str, int]:
        """What the runs before this one did of the batch job this run goes on with: the
        stage's record covers the job, from the run that wrote its first requests to the one
        that merged its last results. Its model's calls and tokens start from them. Nothing,
        when the last run ended the job, or made it with another model or prompt (priced
        apart, those would be priced as this one)."""
        job, stage = self.ledger.job, self.runner.stage
        same = (job.get("model"), job.get("prompt_hash")) == (stage.model, stage.prompt_hash)
        before = {
            name: value
            for name, value in job.items()
            if same and not job.get("ended") and type(value) is int
        }
        llm = self.plan.llm  # type: ignore[attr-defined]  # drive checked it has one
        llm.pacer.traffic.calls += before.get("calls", 0)
        llm.tokens[0] += before.get("prompt", 0)
        llm.tokens[1] += before.get("completion", 0)
        return before

    def close_job(self) -> None:
        """Record the batch job's totals so far, for the run that goes on with it (after each
        round, and on the way out)."""
        llm = self.plan.llm  # type: ignore[attr-defined]
        totals, stage = self.record(), self.runner.stage
        counts = {name: totals[name] for name in COUNTED}
        counts |= {"calls": llm.calls, "prompt": llm.tokens[0], "completion": llm.tokens[1]}
        ended = not self.out and self.ledger.carry is None  # nothing out, nothing carried
        made = {"model": stage.model, "prompt_hash": stage.prompt_hash}
        self.ledger.record("job", **counts, **made, ended=ended)

    def _check_elsewhere(self) -> None:
        """Refuse to run while requests of the stage are out by the other way."""
        other = [shard for shard in self.ledger.waiting() if shard.mode != self.kind]
        if not other:
            return
        where = (
            "in a batch of the endpoint's Batch API: rerun with --batch"
            if other[0].mode == "api"
            else f"in {other[0].path.parent}: rerun with --batch-dir {other[0].path.parent.parent}"
        )
        raise ConfigError(
            f"{sum(shard.lines for shard in other)} requests of {self.tag} are out {where} to "
            f"collect their results (or delete {self.ledger.path} to forget them, unpaid or not)"
        )

    async def round(self, requests: Path, fresh: list[Path]) -> Pass:
        """One pass: merge these result files (and the carried ones), send what is left."""
        if self.rounds >= MAX_ROUNDS:
            raise EndpointError(
                f"{self.tag}: rows still wait after {self.rounds} rounds of batches in one "
                "run; rerun the command to go on"
            )
        self.rounds += 1
        self.note("merging results and writing requests")
        done = self.runner.finished()
        index = ResultIndex(self.tag, results_of(self.ledger, fresh), done)
        folders = (requests, self.files)
        passed = Pass(self.runner, self.plan, self.ledger, index, self.out, folders, self.kind)
        try:
            await passed.run(done)
        finally:
            self.merged += index.fresh  # the new results read: a rerun reads the others
        self.sent += passed.sent
        self.direct = [self.direct[0] + passed.rendered, self.direct[1] + passed.read]
        self.shards += [shard.name for shard in passed.shards]
        self.close_job()  # killed while it waits on the batches of this round: the job is kept
        self.tidy()
        return passed

    def tidy(self) -> None:
        """Delete ragexam's own files that nothing needs any more: spent results, and the
        requests of shards whose results are in (the ledger keeps what they were)."""
        spent = [path for path in self.ledger.merged if path.is_relative_to(self.files)]
        for shard in self.ledger.shards.values():
            if shard.resolved:
                spent += [shard.ids] + ([shard.path] if shard.mode == "api" else [])
        for path in spent:
            path.unlink(missing_ok=True)

    async def files_round(self, folder: Path) -> None:
        """--batch-dir: merge DIR/results, write DIR/requests, and count what still waits."""
        self.plan_calls_nothing()
        new = self._new_results(folder)
        await self.round(folder / "requests", new)
        if self.out:  # where the engine writes its results: `vllm run-batch -o` makes no folder
            (folder / "results").mkdir(parents=True, exist_ok=True)
        for path in new:
            size, mtime = _identity(path)
            self.ledger.record("seen", file=path, size=size, mtime_ns=mtime)
        self.resolve(folder / "requests" / "done")
        self.waiting = len(self.out)

    def _new_results(self, folder: Path) -> list[Path]:
        """The files of DIR/results not merged yet, as they are now."""
        results = folder.resolve() / "results"
        found = sorted(p for p in results.glob("*") if p.is_file()) if results.is_dir() else []
        return [path for path in found if self.ledger.seen.get(path) != _identity(path)]

    def plan_calls_nothing(self) -> None:
        """--batch-dir calls no endpoint: not even to look the model up."""
        llm = getattr(self.plan, "llm", None)
        if llm is not None:
            llm.model_check.done = True

    def resolve(self, done: Path) -> None:
        """Shards none of whose requests is still out: recorded, and their file moved aside."""
        for shard in self.ledger.waiting():
            if any(self.out.get(key) == request for key, request in _requests(shard)):
                continue
            self.ledger.record("resolved", name=shard.name)
            if shard.path.exists():
                done.mkdir(parents=True, exist_ok=True)
                shutil.move(str(shard.path), str(done / shard.path.name))

    def note(self, text: str, views: list[Any] | None = None) -> None:
        """Tell the progress display what happens now."""
        if self.progress is not None:
            self.progress.batches(views or [], f"{self.tag}: {text}")

    def record(self) -> dict[str, Any]:
        """The road's figures, for the manifest and the summary: the batch job's so far."""
        shards = self.ledger.shards.values()
        started = [s.submitted_at for s in shards if s.submitted_at and s.name in self.shards]
        ended = [s.ended_at for s in shards if s.ended_at and s.name in self.shards]
        this_run = {
            "runs": 1,
            "rounds": self.rounds,
            "requests": self.sent,
            "results_merged": self.merged,
            # of those, rendered from the first call's form and read without replaying the work
            "requests_rendered": self.direct[0],
            "results_read": self.direct[1],
            "shards": len(self.shards),
            "batches": self.batches,
        }
        return {
            "mode": "dir" if self.mode.folder is not None else "api",
            "folder": str(self.mode.folder) if self.mode.folder is not None else None,
            **{name: count + self.before.get(name, 0) for name, count in this_run.items()},
            "seconds": round(max(ended) - min(started), 3) if started and ended else None,
            "waiting": self.waiting,
        }


def _requests(shard: ShardState) -> Iterator[tuple[str, int]]:
    """(key, request) of each line of a shard."""
    for identifier in read_ids(shard.ids):
        parsed = parse_custom_id(identifier)
        if parsed is not None:
            yield parsed[3], token(parsed[1], parsed[2])


def _identity(path: Path) -> tuple[int, int]:
    """What says a result file is the one already merged: its size and modification time."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns
