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

import logging
import math
import re
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import openai

from ragexam.config import Settings
from ragexam.errors import ConfigError, EndpointError
from ragexam.io.atomic import write_error
from ragexam.io.batchfiles import Shard
from ragexam.io.ledger import Ledger, ShardState
from ragexam.io.runfolder import RunFolder, file_identity
from ragexam.llm.transport import routable
from ragexam.options import Given
from ragexam.stages.batchwait import QUEUE_FULL, api_rounds
from ragexam.stages.replay import Pass, ResultIndex, outstanding, requests_of, results_of
from ragexam.stages.runner import (
    Plan,
    Progress,
    Runner,
    RunSettings,
    batches_out,
    results_held,
)

logger = logging.getLogger("ragexam")
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
    return RunSettings(
        given.out, settings.concurrency, calls.force, settings.redact, road, settings
    )


async def drive(mode: BatchMode, runner: Runner, plan: Plan, progress: Progress | None) -> None:
    """Do the plan's rows on the batch road, until every row is written (or waits, in a dir)."""
    if getattr(plan, "llm", None) is None:
        raise ConfigError("this stage makes no chat call of ragexam's own: it cannot be batched")
    road = BatchRoad(mode, runner, plan, progress)
    try:
        if mode.folder is not None:
            await road.files_round(mode.folder)
        else:  # in a send phase: as far as its batches are made (a later run waits)
            await api_rounds(road, wait=not runner.sending)
        road.close_job()  # a stopped run records nothing more: a rerun goes on from its events
    finally:
        runner.outcome.batch = road.record()


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
        self.rounds = self.sent = self.merged = self.batches = self.written = 0
        self.direct = [0, 0]  # first requests rendered, and first results read, directly
        self.shards: list[str] = []  # written this run
        self.submitted: list[str] = []  # shards whose batch this run made (or found)
        self.waiting = 0
        self.shard_lines: int | None = None  # requests a shard holds at most, once a full
        # queue refused one: halved each time (None: as many as the Batch API takes)
        self.unsent = False  # rows whose shard was dropped: a pass must send them again
        self.dropped = 0  # requests of shards dropped this run: sent again, not counted twice
        # this run counts among the job's (not when it only shows an ended one, nor when it
        # waits on the batches this command's send phase made: one command, one run)
        self.runs = int(runner.earlier is None)
        self.recorded = False  # the ledger's job counts this run: it recorded the job's totals
        self.before: dict[str, Any] = {}
        self.ended: dict[str, Any] = {}  # the job the last run ended, for a run with no work
        job = self.ledger.job  # what the requests out were made with, to say what changed
        self.asked_with = (job.get("model"), job.get("prompt_hash"))
        llm = plan.llm  # type: ignore[attr-defined]  # drive checked it has one
        llm.choice.batched = True  # its replies are read all at once: a switch waits for more
        self.method = llm.method  # the structured-output method the run began with
        self._job_so_far()

    def _job_so_far(self) -> None:
        """What the runs before this one did of the batch job this run goes on with: the
        stage's record covers the job, from the run that wrote its first requests to the one
        that merged its last results. Its model's calls and tokens start from them. Nothing,
        when the last run ended the job, or made it with another model or prompt (priced
        apart, those would be priced as this one). A run that goes on with a job counts
        among its runs from the start, should it be stopped before it records any work."""
        job, stage = self.ledger.job, self.runner.stage
        if (job.get("model"), job.get("prompt_hash")) != (stage.model, stage.prompt_hash):
            return
        figures = {
            name: value
            for name, value in job.items()
            if type(value) is int or name in ("began", "elsewhere")
        }
        if job.get("ended"):
            self.ended = figures
            return
        self._go_on(figures)
        self.ledger.record("job", **self.totals())

    def _go_on(self, before: dict[str, Any]) -> None:
        """Count the runs before this one of the job in its figures."""
        self.before = before
        llm = self.plan.llm  # type: ignore[attr-defined]  # drive checked it has one
        llm.pacer.traffic.calls += before.get("calls", 0)
        llm.tokens[0] += before.get("prompt", 0)
        llm.tokens[1] += before.get("completion", 0)
        elsewhere = before.get("elsewhere")
        for model, spent in (elsewhere if isinstance(elsewhere, dict) else {}).items():
            account = llm.elsewhere.setdefault(model, [0, 0, 0])
            for index, count in enumerate(spent[:3] if isinstance(spent, list) else []):
                account[index] += int(count)

    def totals(self, carried: bool | None = None, made: float | None = None) -> dict[str, Any]:
        """The batch job's totals so far, as the ledger keeps them for the run that goes on
        with it: they ride on the event of each step that changes them (a batch made, a pass
        merged), so that a kill leaves the step and its totals recorded, or neither. Ended:
        nothing out, and no result carried (`carried`: the pass about to record its own;
        `made`: when the batch about to be recorded was made)."""
        llm = self.plan.llm  # type: ignore[attr-defined]
        record, stage = self.record(), self.runner.stage
        counts = {name: record[name] for name in COUNTED}
        counts |= {"calls": llm.calls, "prompt": llm.tokens[0], "completion": llm.tokens[1]}
        if llm.elsewhere:  # results of a job of another model, billed at its price
            counts["elsewhere"] = {model: list(spent) for model, spent in llm.elsewhere.items()}
        carried = self.ledger.carry is not None if carried is None else carried
        started = self._span()[0] + ([made] if made is not None else [])
        began = {"began": min(started)} if started else {}
        by = {"model": stage.model, "prompt_hash": stage.prompt_hash}
        self.recorded = True  # each caller records them
        return {**counts, **began, **by, "ended": not self.out and not carried}

    def _with_shard(self, passed: Pass, shard: Shard) -> dict[str, Any]:
        """What a `shard` event records beside the shard: the job's totals as a kill right
        after it leaves them, with the shard's requests in (and the run and pass that wrote
        it). Only those: the pass's other figures (results merged, rows written, their calls
        and tokens) are recorded once it merges, beside the rows they made."""
        if self.recorded:
            job = dict(self.ledger.job)
        else:  # this run's first step recorded: the first of a job (going on, it records one)
            stage = self.runner.stage
            job = {**dict.fromkeys(COUNTED, 0), "calls": 0, "prompt": 0, "completion": 0}
            job |= {"runs": 1, "model": stage.model, "prompt_hash": stage.prompt_hash}
            self.recorded = True
        first = len(passed.shards) == 1  # the pass's first shard: the pass counts as a round
        for name, more in (("requests", shard.lines), ("shards", 1), ("rounds", int(first))):
            job[name] = int(job.get(name) or 0) + more  # an older ledger's job may lack one
        return {"job": {**job, "ended": False}}

    def close_job(self) -> None:
        """Record the batch job's totals at the end of a run: whether the job ended. A run
        that found nothing to do (a rerun of a finished stage, as the --batch-dir loop of
        `run` makes) shows the job the last run ended: the stage's record stays its cost."""
        idle = not (self.sent or self.merged or self.batches or self.written)
        if idle and self.ended and not self.before:
            self.runs = self.rounds = 0
            self._go_on(self.ended)
        self.ledger.record("job", **self.totals())

    def _check_elsewhere(self) -> None:
        """Refuse to run while requests of the stage are out by the other way."""
        other = self.ledger.out_elsewhere(self.kind)
        if other:
            raise batches_out(self.ledger, other)
        if self.mode.folder is not None:  # out in another --batch-dir: its results come there
            here = (self.mode.folder / "requests").resolve()
            away = [s for s in self.ledger.waiting() if s.path.parent.resolve() != here]
            if away:
                raise batches_out(self.ledger, away)
        unmerged = [path for path in self.ledger.held() if path != self.ledger.carry]
        if self.kind == "dir" and unmerged:  # a Batch API's results: only --batch merges them
            raise results_held(self.ledger, "--batch")

    async def round(
        self, requests: Path, fresh: list[Path], seen: list[list[Any]] | None = None
    ) -> Pass:
        """One pass: merge these result files (and the carried ones), send what is left.
        `seen`: the --batch-dir files read, as they were before the pass read them."""
        if self.rounds >= MAX_ROUNDS:
            raise EndpointError(
                f"{self.tag}: rows still wait after {self.rounds} rounds of batches in one "
                "run; rerun the command to go on"
            )
        self.rounds += 1
        self.note("merging results and writing requests")
        done = self.runner.finished()
        index = ResultIndex(self.tag, results_of(self.ledger, fresh), done, self.ledger.merged)
        folders = (requests, self.files)
        passed = Pass(self.runner, self.plan, self.ledger, index, self.out, folders, self.kind)
        passed.commit = partial(self._commit, seen or [])
        passed.max_lines = self.shard_lines
        passed.asked_of = self._other_model()
        passed.with_shard = self._with_shard
        try:
            await passed.run(done)
        finally:
            self._count(passed)  # a pass stopped midway: what it did, for this run's record
        self.plan.llm.choice.pass_ended()  # type: ignore[attr-defined]  # every result read
        failures = passed.index.failures
        if failures:  # else a loop of reruns says only that requests wait, again and again
            count, (reason, most) = failures.total(), failures.most_common(1)[0]
            logger.warning(
                f"{self.tag}: {count} result{'' if count == 1 else 's'} merged "
                f"{'was a failure' if count == 1 else 'were failures'} (most often, {most}: "
                f"{reason}); each row asks again while its retries last, then is an error row"
            )
        for path in passed.index.foreign:  # in the results folder, but no result of anyone's
            logger.warning(
                f"{self.tag}: {path} holds no line naming a request (custom_id): it is no "
                "batch result file, and is not read"
            )
        for (path, whole), lines in passed.index.unread.items():  # given, not merged
            one = lines == 1
            what = (
                f"{'has' if one else 'have'} a custom_id of this stage but no `response` nor "
                "`error` (a request file, or another shape than OpenAI's or vLLM's output)"
                if whole
                else f"{'names' if one else 'name'} a request of this stage but "
                f"{'is' if one else 'are'} not whole JSON (cut short: the engine stopped "
                "while writing?)"
            )
            logger.warning(
                f"{self.tag}: {lines} line{'' if one else 's'} of {path} {what}: not merged, "
                f"{'its row still waits' if one else 'their rows still wait'}"
            )
        if passed.unused:  # asked again, rightly, but a user wonders why results went unused
            one = passed.unused == 1
            logger.warning(
                f"{self.tag}: {passed.unused} row{'' if one else 's'} "
                f"{'has' if one else 'have'} results for requests {'it' if one else 'they'} no "
                f"longer make{'s' if one else ''} ({self._what_changed()}): asked again"
            )
        self.tidy()
        return passed

    def _other_model(self) -> str | None:
        """The model whose results no row uses were asked of, when it is not this run's: that
        of shards still out or not merged (a job of another model), else the last job's."""
        model, ledger = self.runner.stage.model, self.ledger
        for shard in ledger.shards.values():
            pending = shard.waiting or any(path not in ledger.merged for path in shard.results)
            if pending and shard.model is not None and shard.model != model:
                return shard.model
        asked = self.asked_with[0]
        return asked if asked is not None and asked != model else None

    def _what_changed(self) -> str:
        """Why results answer requests rows no longer make: the model or prompt the requests
        out were made with, when this run's differ; else what else may have changed."""
        model, prompt = self._other_model(), self.asked_with[1]
        stage = self.runner.stage
        if model is not None:
            return f"they were asked of the model {model}; this run asks {stage.model}"
        method = self.plan.llm.method  # type: ignore[attr-defined]
        if method != self.method:
            return (
                f"the structured-output method went from {self.method.value} to "
                f"{method.value}: replies under {self.method.value} failed validation"
            )
        if prompt is not None and prompt != stage.prompt_hash:
            return f"they were asked with prompt {prompt}; this run's is {stage.prompt_hash}"
        return (
            "an input or a setting such as OPENAI_BASE_URL or the reply bound changed since "
            "they were asked"
        )

    def _commit(self, seen: list[list[Any]], passed: Pass) -> dict[str, Any]:
        """What the pass's `merged` event records beside its files: the files of --batch-dir
        read, and the job's totals, the pass's counted in."""
        self._count(passed)
        return {"seen": seen, "job": self.totals(carried=passed.carried)}

    def _count(self, passed: Pass) -> None:
        """Count a pass's figures in this run's, once."""
        if passed.counted:
            return
        passed.counted = True
        self.merged += passed.index.fresh  # the new results read: a rerun reads the others
        self.sent += passed.sent
        self.written += passed.written
        self.direct = [self.direct[0] + passed.rendered, self.direct[1] + passed.read]
        self.shards += [shard.name for shard in passed.shards]

    def siblings(self) -> list[ShardState]:
        """The shards the other stages of this run and its control runs made batches of: sent
        at once, they share the organisation's queue with this stage's."""
        folder = RunFolder(self.runner.stage.path.parent)
        ledgers = [Ledger(path, path.stem) for path in folder.batch_ledgers()]
        return [
            shard
            for ledger in ledgers
            if ledger.path != self.ledger.path
            for shard in ledger.shards.values()
            if shard.batch_id is not None and shard.mode == "api"
        ]

    def split(self, shard: ShardState, lines: int) -> None:
        """Drop a shard the Batch API's queue can never hold: its rows go out again, by the
        next pass, in shards of at most `lines` requests."""
        self.dropped += shard.lines
        self.ledger.record("dropped", name=shard.name, job=self.totals())
        for key, request in requests_of(shard):
            if self.out.get(key) == request:
                del self.out[key]
        self.shard_lines = min(self.shard_lines or lines, lines)
        self.unsent = True
        logger.warning(
            f"{self.tag}: the Batch API's queue refused a batch of {shard.lines:,} requests "
            f"({QUEUE_FULL}), more than the organisation's queue holds: its requests go out "
            f"again in batches of at most {self.shard_lines:,}"
        )

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
        self._check_ours(folder)
        new = self._new_results(folder)
        # as they are before the pass reads them: lines the engine adds meanwhile are read next run
        seen = [[path, *file_identity(path)] for path in new]
        await self.round(folder / "requests", new, seen)
        if self.out:  # where the engine writes its results: `vllm run-batch -o` makes no folder
            try:
                (folder / "results").mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise write_error(folder / "results", exc) from None
        self.resolve(folder / "requests" / "done")
        self.waiting = len(self.out)

    def _check_ours(self, folder: Path) -> None:
        """Refuse a --batch-dir that holds request files of this stage's name which this run
        folder never wrote: another run folder's. Two run folders sharing one DIR wrote over
        each other's requests, and each merged (and billed) the other's results. A file a
        crash left before it was recorded is ours: its ids are in our own folder."""
        pattern = re.compile(rf"{re.escape(self.tag)}-\d{{6}}\.jsonl")
        requests = folder / "requests"
        for place in (requests, requests / "done"):
            names = sorted(p.name for p in place.iterdir()) if place.is_dir() else []
            for name in filter(pattern.fullmatch, names):
                shard = name.removesuffix(".jsonl")
                if (
                    shard not in self.ledger.shards
                    and not (self.files / "ids" / f"{shard}.ids").exists()
                ):
                    raise ConfigError(
                        f"--batch-dir {folder} holds {place / name}, a request file of "
                        f"{self.tag} that this run folder did not write (another run "
                        "folder's?): give each run folder a --batch-dir of its own"
                    )

    def _new_results(self, folder: Path) -> list[Path]:
        """The files of DIR/results not merged yet, as they are now."""
        results = folder.resolve() / "results"
        # in subfolders too: an engine's output spread over machines comes back in folders
        found = sorted(p for p in results.rglob("*") if p.is_file()) if results.is_dir() else []
        return [path for path in found if self.ledger.seen.get(path) != file_identity(path)]

    def plan_calls_nothing(self) -> None:
        """--batch-dir calls no endpoint: not even to look the model up."""
        llm = getattr(self.plan, "llm", None)
        if llm is not None:
            llm.model_check.done = True

    def resolve(self, done: Path) -> None:
        """Shards none of whose requests is still out: recorded, and their file moved aside."""
        for shard in self.ledger.waiting():
            out = self.out  # none out: every shard is resolved, without reading its requests
            if out and any(out.get(key) == request for key, request in requests_of(shard)):
                continue
            if shard.path.exists():  # moved first: a kill between leaves it to resolve again
                try:
                    done.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(shard.path), str(done / shard.path.name))
                except OSError as exc:
                    raise write_error(done / shard.path.name, exc) from None
            self.ledger.record("resolved", name=shard.name)

    def note(self, text: str, views: list[Any] | None = None) -> None:
        """Tell the progress display what happens now."""
        if self.progress is not None:
            self.progress.batches(views or [], f"{self.tag}: {text}")

    def _span(self) -> tuple[list[float], list[float]]:
        """When the job's batches were made, and when they ended: those of the shards written
        this run, and of those made since the job's first batch (an earlier run's)."""
        began = _at(self.before.get("began"))
        since = math.inf if began is None else began
        ours = [
            shard
            for shard in self.ledger.shards.values()
            if shard.submitted_at is not None
            and (
                shard.name in self.shards
                or shard.name in self.submitted
                or shard.submitted_at >= since
            )
        ]
        started = [shard.submitted_at for shard in ours if shard.submitted_at is not None]
        return started, [shard.ended_at for shard in ours if shard.ended_at is not None]

    def record(self) -> dict[str, Any]:
        """The road's figures, for the manifest and the summary: the batch job's so far."""
        started, ended = self._span()
        this_run = {
            "runs": self.runs,
            "rounds": self.rounds,
            "requests": self.sent - self.dropped,
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
            # nothing done this run: the record is the job the last run ended, again
            "idle": not (self.sent or self.merged or self.batches or self.written),
            "waiting": self.waiting,
        }


def _at(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
