"""One pass of the batch road over a stage's rows: each is done as far as its results reach.

Every row still to do is run through the stage's own work, its calls answered from the results
come back for it (llm/deferred.py). A row whose calls are all answered is written, ok or error,
exactly as the sync road writes it. A row that reaches a call without a result stops there:
its request goes into a shard, unless that very request is already out. The results a waiting
row went through are carried to the next pass; every other result is spent.

A row's work is run again from its start at each pass, up to its first call without a
result. So a stage's work must change nothing outside its row before its last call: what it
keeps across rows (generate's questions seen, for its duplicate flag) it keeps once the row
is done.

Memory stays flat at a million rows: the index holds keys and file offsets, never results,
and a row's results are read from disk when its turn comes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, KeysView
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from ragexam.io.atomic import write_error
from ragexam.io.batchfiles import (
    Answer,
    Shard,
    ShardWriter,
    Spans,
    custom_id,
    failure_of,
    parse_answer,
    parse_custom_id,
    read_ids,
    request_line,
    scan_results,
    whole_json,
)
from ragexam.io.ledger import Ledger, ShardState
from ragexam.llm.client import LLM, Reply
from ragexam.llm.deferred import Deferred, Known, RowCalls, calls_of
from ragexam.llm.prompts import Call
from ragexam.stages.bulk import Bulk, Lane
from ragexam.stages.forked import (
    FRESH,
    SENT,
    SHARD,
    Child,
    Made,
    Make,
    children_for,
    shared,
    shares,
)
from ragexam.stages.packed import split
from ragexam.stages.runner import Encoded, Plan, Runner, Task, ok_row

_OFFSET_BITS, _LENGTH_BITS = 40, 32  # a location: file number, offset and length in one int
ADOPTED = 1024  # a child's lines written at once


def token(call: int, digest: str) -> int:
    """One request of a row, in an int: which call, with which body."""
    return (int(digest, 16) << 16) | (call & 0xFFFF)


def outstanding(ledger: Ledger, shards: list[ShardState] | None = None) -> dict[str, int]:
    """The request each row has out, by its key, from the shards still waiting (or these)."""
    out: dict[str, int] = {}
    for shard in ledger.waiting() if shards is None else shards:
        out.update(requests_of(shard))
    return out


def requests_of(shard: ShardState) -> Iterator[tuple[str, int]]:
    """(key, request) of each line of a shard: the custom_ids of ours in its ids file, each
    read as parse_custom_id reads it (a million of them at once, as `token`s)."""
    for identifier in read_ids(shard.ids):
        parts = identifier.split("~", 3)
        if len(parts) == 4 and parts[1].isascii() and parts[1].isdigit():
            yield parts[3], (int(parts[2], 16) << 16) | (int(parts[1]) & 0xFFFF)


class ResultIndex:
    """Where the results of each row are, in the files being merged: keys and offsets only.

    A line of a file never recorded spent whose row is written already was read by a run
    stopped (a kill, Ctrl-C) after it wrote the row, before it recorded the file spent: it is
    `late`, to be billed by this run, whose record covers the job.
    """

    def __init__(
        self, tag: str, files: list[tuple[Path, bool]], done: set[str], spent: set[Path]
    ) -> None:
        self.files = files  # (path, fresh): fresh files are new to this run, carried ones not
        self.fresh = 0  # results of fresh files taken (each request once): new to this run
        self._where: dict[str, int | list[int]] = {}
        self._late: dict[str, int] = {}  # custom_id: location
        self._spans: list[Spans] = []
        # lines of ours that are not results, by file, and whether they are whole JSON
        self.unread: Counter[tuple[Path, bool]] = Counter()
        self.foreign: list[Path] = []  # files with no line naming a request: not results
        self.failures: Counter[str] = Counter()  # results that are failures, by their reason
        for number, (path, fresh) in enumerate(files):
            self._spans.append(Spans(path))
            self._scan(tag, number, path, done, fresh and path not in spent)
        if self._late:
            self._not_merged_before(spent)

    def _scan(self, tag: str, number: int, path: Path, done: set[str], unspent: bool) -> None:
        named = False
        where, base = self._where, number << (_OFFSET_BITS + _LENGTH_BITS)
        for identifier, offset, length in scan_results(path):
            named = True
            parsed = parse_custom_id(identifier)
            if parsed is None or parsed[0] != tag:
                continue  # another stage's
            key, location = parsed[3], base | (offset << _LENGTH_BITS) | length
            if key in done:  # a row already written
                if unspent:
                    self._late.setdefault(identifier, location)
                continue
            known = where.get(key)
            if known is None:
                where[key] = location
            elif isinstance(known, list):
                known.append(location)
            else:
                where[key] = [known, location]
        if not named and path.stat().st_size:  # garbage, a binary, another tool's file
            self.foreign.append(path)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __len__(self) -> int:
        """The rows with results here, not yet taken."""
        return len(self._where)

    def missing(self, keys: KeysView[str]) -> set[str]:
        """The keys with no result here."""
        return keys - self._where.keys()

    def lone(self, key: str) -> bool:
        """Whether the row has exactly one result here."""
        return type(self._where.get(key)) is int

    def keys(self) -> Iterator[str]:
        """The rows with results."""
        return iter(self._where)

    def take(self, key: str) -> dict[str, list[Known]]:
        """A row's results by body digest, in the order asked, read from disk (and forgotten
        here); a request answered twice (a result file merged twice, a file of --batch-dir's
        read again once its engine wrote more) counts once, as the copy carried, if any."""
        found = self._where.pop(key, None)
        if found is None:
            return {}
        if not isinstance(found, list):  # one result: the common case, read and done
            item = self._read(found)
            if item is None:
                return {}
            self.fresh += item[1].fresh
            return {item[0]: [item[1]]}
        by_call: dict[tuple[int, str], Known] = {}
        for location in found:
            if (item := self._read(location)) is not None:
                had = by_call.setdefault((item[1].call, item[0]), item[1])
                if had.fresh and not item[1].fresh:  # billed when carried: not billed again
                    by_call[item[1].call, item[0]] = item[1]
        known: dict[str, list[Known]] = {}
        for (_, digest), result in sorted(by_call.items()):
            known.setdefault(digest, []).append(result)
            self.fresh += result.fresh
        return known

    def _not_merged_before(self, spent: set[Path]) -> None:
        """Drop the late results that a spent file still on disk answers too: a copy of a
        result merged (and billed) before, such as a --batch-dir file run again under
        another name, is no result of a stopped run's. Read only when there are late ones."""
        for path in spent:
            if path.is_file():
                for identifier, _, _ in scan_results(path):
                    self._late.pop(identifier, None)

    def late(self) -> Iterator[Answer]:
        """The late results, each request once (counted in `fresh`)."""
        late, self._late = self._late, {}
        for location in late.values():
            item = self._read(location)
            if item is not None:
                self.fresh += 1
                yield item[1].answer

    def single(self, key: str) -> tuple[bytes, bool] | None:
        """The row's result line, and whether it is fresh, when it has exactly one (left in
        the index: `spend` takes it, once it is written)."""
        found = self._where.get(key)
        if type(found) is not int:
            return None
        return self._line(found), self.files[found >> (_OFFSET_BITS + _LENGTH_BITS)][1]

    def spend(self, key: str, fresh: bool) -> None:
        """Take a row's one result out, written from the line `single` gave."""
        del self._where[key]
        self.fresh += fresh

    def _line(self, location: int) -> bytes:
        number = location >> (_OFFSET_BITS + _LENGTH_BITS)
        offset = (location >> _LENGTH_BITS) & ((1 << _OFFSET_BITS) - 1)
        return self._spans[number].read(offset, location & ((1 << _LENGTH_BITS) - 1))

    def _read(self, location: int) -> tuple[str, Known] | None:
        """(the digest it was asked with, the result) of the line at a location."""
        number = location >> (_OFFSET_BITS + _LENGTH_BITS)
        line = self._line(location)
        answer = parse_answer(line)
        parsed = parse_custom_id(answer.custom_id) if answer else None
        if answer is None or parsed is None:
            self.unread[self.files[number][0], whole_json(line)] += 1
            return None
        # said after the pass (its rows ask again, or end in error): once, as it comes in, and
        # not again when a row that waits on its retry carries it to the next pass
        if answer.status != 200 and self.files[number][1]:
            self.failures[failure_of(answer)] += 1
        return parsed[2], Known(answer, parsed[1], self.files[number][1], line)

    def close(self) -> None:
        """Close the files."""
        for spans in self._spans:
            spans.close()
        self._spans = []


@runtime_checkable
class Opens(Protocol):
    """A plan whose rows begin with one structured call that may be all they need (the judge's).

    The batch road makes such a row's first request, and reads its first result, from the
    call's values, without running the row's work: its request is rendered from a form
    learned from (and checked against) the very stack the work goes through (llm/requests.py),
    and its result is read as the work would read it. Anything else goes the whole way.
    """

    llm: LLM

    def opening(self, task: Task) -> Call | None:
        """The row's first call, as its work makes it; None: the row fails before any call."""
        ...

    def answered(self, task: Task, reply: Reply[Any]) -> dict[str, Any] | None:
        """The row's values when its first call's valid reply is all its work needs."""
        ...


class Pass:
    """One pass over the rows still to do: write those that are done, send the rest's calls."""

    def __init__(
        self,
        runner: Runner,
        plan: Plan,
        ledger: Ledger,
        index: ResultIndex,
        out: dict[str, int],
        folders: tuple[Path, Path],  # where request shards go, and where ragexam keeps its files
        mode: str,  # "api" or "dir", recorded with each shard
    ) -> None:
        self.runner, self.plan, self.ledger, self.index, self.out = runner, plan, ledger, index, out
        self.requests, self.files = folders
        self.mode = mode
        self.sent = 0  # requests written to shards
        self.written = 0  # rows written
        self.rendered = self.read = 0  # first requests rendered, first results read, directly
        self.unused = 0  # rows whose results answer requests they no longer make: asked again
        self.shards: list[Shard] = []
        self._writers: dict[str, ShardWriter] = {}
        self._open = ""  # the URL whose shard may be open: one at a time
        self._carry: IO[bytes] | None = None
        self._carry_path = self.files / f"carry-{time.time_ns()}.jsonl"  # never the one read
        self.opens = plan if isinstance(plan, Opens) else None
        self.llm: LLM = plan.llm  # type: ignore[attr-defined]  # drive checked it has one
        rows = plan.bulk() if self.opens is not None and isinstance(plan, Bulk) else None
        self.lane = Lane(rows, runner, self.llm, ledger.tag) if rows is not None else None
        # what the `merged` event records beside the files (the road's: its job's totals)
        self.commit: Callable[[Pass], dict[str, Any]] = lambda _: {}
        # and what each `shard` event records beside the shard (the job's totals, it in)
        self.with_shard: Callable[[Pass, Shard], dict[str, Any]] = lambda *_: {}
        self.max_lines: int | None = None  # requests a shard holds at most, if fewer than it may
        # the model the results no row uses were asked of, when not this run's: billed at its price
        self.asked_of: str | None = None
        self.counted = False  # the road counted the pass's figures in its own
        self._rows_done = 0
        self._url: str | None = None  # of a request rendered from its form in this pass

    @property
    def carried(self) -> bool:
        """Whether the pass carries results to the next."""
        return self._carry is not None

    async def run(self, done: set[str]) -> None:
        """Go through every row not done, nor waiting on a request already out."""
        idle = self.index.missing(self.out.keys())  # out, and nothing back yet
        count, tasks = self.plan.tasks(done | idle if idle else done)
        for folder in (self.requests, self.files / "ids"):  # a killed run's children's
            for stale in folder.glob(".forked-*"):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            for answer in self.index.late():
                self.llm.billed(answer, self.asked_of)
            if isinstance(tasks, AsyncIterator):
                async for task in tasks:
                    await self._one(task)
            else:  # the rows of a million-row judge: no coroutine for a row done directly
                await self._rows(iter(tasks), count)
            self._keep_the_rest()
            for writer in self._writers.values():
                writer.close()
        except BaseException:
            for writer in self._writers.values():
                writer.abandon()  # the rows of a shard not recorded are sent by the next pass
            raise
        finally:
            self.index.close()
        self._retire()

    async def _one(self, task: Task) -> None:
        handled, known = self._directly(task)
        if not handled:
            await self._row(task, known)
        # the event loop runs now and then: rows done directly await nothing, and a Ctrl-C
        # (a cancel of the stage's task) takes effect within a thousand of them
        self._rows_done += 1
        if not self._rows_done & 1023:
            await asyncio.sleep(0)

    async def _rows(self, tasks: Iterator[Task], count: int | None) -> None:
        """Do the rows; once the bulk lane reads rows, with many left, the last ones are read
        by forked children, a share each (forked.py), while this process does the first."""
        left, children, asked = count, 0, False
        for task in tasks:
            await self._one(task)
            left = None if left is None else left - 1
            if not asked and left is not None and self._fast():
                children, asked = children_for(left), True  # once: fewer rows are left later
                if children:
                    break
        else:
            return
        assert self.opens is not None and left is not None
        (head, packed), *parts = split(tasks, shares(left, children))
        own: Iterator[Task] = packed.rows() if packed is not None else iter(head)
        del head  # let go before the fork: a task let go after it writes into what it held
        await asyncio.sleep(0)  # a Ctrl-C while they were packed stops the pass before a fork
        packs = [pack for _, pack in parts]
        made: list[Child | None] = []  # a child a share (None: it could not be made)
        shape, url = self.llm.shape(), self._url  # what the children make their rows by
        sends = url is not None and not self.index  # no result left to read: requests only
        try:
            with shared():
                for number, (part, pack) in enumerate(parts):
                    others = [p for p in (packed, *packs) if p is not None and p is not pack]
                    rows = pack or part
                    if sends and url is not None:
                        make, finish = self._sender(url, self._forked(number))
                        Child.start(make, rows, others, self.files, made, finish)
                    else:
                        Child.start(self._made, rows, others, self.files, made)
                for task in own:
                    await self._one(task)
                for number, (child, (part, _)) in enumerate(zip(made, parts, strict=True)):
                    if sends and url is not None:
                        await self._adopt_sent(child, part, shape, url, self._forked(number))
                    else:
                        await self._adopt_all(child, part, shape)
            for task in tasks:  # none left, unless the plan made more rows than it counted
                await self._one(task)
        finally:
            for child in made:
                if child is not None:
                    child.stop()
            if sends:
                for number in range(len(parts)):
                    for folder in self._forked(number):
                        shutil.rmtree(folder, ignore_errors=True)

    def _forked(self, number: int) -> tuple[Path, Path]:
        """Where a child writes its shards and their ids: beside this process's, to be
        renamed into place, but unseen (a kill leaves them, and the next pass drops them)."""
        name = f".forked-{number}"
        return self.requests / name, self.files / "ids" / name

    def _sender(
        self, url: str, folders: tuple[Path, Path]
    ) -> tuple[Make, Callable[[], list[Made]]]:
        """How a child writes the requests of a pass with no result left to read: each row's
        request line, rendered from its form as `_opened` renders it, into shards of its own
        (their names are given as they are adopted); and, once its rows are done, the shards."""
        assert self.opens is not None
        shards: list[Shard] = []
        writer = ShardWriter(
            folders[0], folders[1], (f"{n:06d}" for n in range(1, 1 << 30)), shards.append
        )
        writer.max_lines = min(writer.max_lines, self.max_lines or writer.max_lines)
        opening, request_of, tag = self.opens.opening, self.opens.llm.request_of, self.ledger.tag
        out = self.out

        def make(task: Task) -> Made | None:
            if task.key in out:  # none is, in such a pass (it would wait, not be a row of it):
                return None  # the parent's `_send` says whether its very request is out
            call = opening(task)
            request = None if call is None else request_of(call)
            if request is None or request.body is None or request.url != url:
                return None
            identifier = custom_id(tag, 0, request.digest, task.key)
            writer.write(identifier, request_line(identifier, url, request.body))
            return identifier, b"", int(request.digest, 16), 0, SENT

        def finish() -> list[Made]:
            writer.close()
            return [(shard.name, b"", shard.lines, shard.size, SHARD) for shard in shards]

        return make, finish

    async def _adopt_sent(
        self,
        child: Child | None,
        tasks: list[Task],
        shape: tuple[Any, ...],
        url: str,
        folders: tuple[Path, Path],
    ) -> None:
        """Take the requests a child wrote: its shards, named on from this process's and
        recorded as its own are, and its rows waiting on them; the rows it did not make (all,
        when it failed) are done here."""
        declined, shards, sent, done = [], [], [], 0
        try:
            if child is not None:
                await child.wait()
            lines = child.lines() if child is not None else None
            for made in lines if lines is not None and self.llm.shape() == shape else ():
                if made is not None and made[4] == SHARD:
                    shards.append(made)
                    continue
                done += 1
                if made is None:
                    declined.append(tasks[done - 1])
                elif made[4] == SENT:
                    sent.append((made[0].split("~", 3)[3], (made[2] << 16) | made[3]))
        finally:
            if child is not None:
                child.stop()
        if done != len(tasks):  # it failed (or made them otherwise): its shards are not ours
            shards, declined, sent = [], list(tasks), []
        self.out.update(sent)
        self.sent += len(sent)
        self.rendered += len(sent)
        writer = self._writer(url)
        writer.close()  # this process's shard recorded: the next name is the child's first
        record = self._recorded(url)
        for name, _, count, size, _ in shards:
            final = self.ledger.next_name()
            path, ids = self.requests / f"{final}.jsonl", self.files / "ids" / f"{final}.ids"
            try:
                (folders[1] / f"{name}.ids").replace(ids)
                (folders[0] / f"{name}.jsonl").replace(path)
            except OSError as exc:
                raise write_error(path, exc, "; rerun the same command") from None
            record(Shard(final, path, ids, count, size))
        for task in declined:
            await self._one(task)

    async def _adopt_all(
        self, child: Child | None, tasks: list[Task], shape: tuple[Any, ...]
    ) -> None:
        """Write a child's rows from the lines it made, while its rows are read as this
        process reads them (a result's refusal of the structured-output method, say, changes
        what the rows after it ask); the others (all, when it failed) are done here. A row
        the child read is written by the key it gives: its task, made before the fork, is
        read only for a row done here."""
        try:
            if child is not None:
                await child.wait()
            await self._adopt_lines(child.lines() if child is not None else None, tasks, shape)
        finally:
            if child is not None:
                child.stop()

    async def _adopt_lines(
        self, lines: Iterator[Made | None] | None, tasks: list[Task], shape: tuple[Any, ...]
    ) -> None:
        done, run = 0, []  # rows read, and the run of lines adopted not yet written
        for made in (lines or ()) if self.llm.shape() == shape else ():
            if done == len(tasks):
                break
            done += 1
            # the row as the child found it, one result: no other way could change that
            if made is not None and self.index.lone(made[0]):
                run.append(made)
                if len(run) == ADOPTED:
                    self._adopt(run)
                    run = []
                    await asyncio.sleep(0)  # a Ctrl-C takes effect between runs
                continue
            self._adopt(run)
            run = []
            await self._one(tasks[done - 1])
            if self.llm.shape() != shape:
                break  # the child's next lines were made as the rows no longer are
        self._adopt(run)
        for task in tasks[done:]:
            await self._one(task)

    def _adopt(self, run: list[Made]) -> None:
        """Write rows whose lines a child made, in one write and one count, as if the bulk
        lane had made them here."""
        if not run:
            return
        assert self.lane is not None
        self.lane.write_many(run)  # a line's kind is FRESH (1) or not (0)
        spend, out = self.index.spend, self.out
        for key, _, _, _, fresh in run:
            spend(key, fresh == FRESH)
            out.pop(key, None)
        self.written += len(run)
        self.read += len(run)

    def _fast(self) -> bool:
        """Whether a child would make rows as this process makes them now: the bulk lane has
        learned its line, or, with no result left to read, a row's request was rendered from
        its form."""
        return (self.lane is not None and self.lane.ready) or (
            self._url is not None and not self.index
        )

    def _made(self, task: Task) -> Made | None:
        """What a forked child makes of a row in a pass that reads results, as `_bulk` would
        do it here, changing nothing (forked.py): the row's CSV line, by the bulk lane, from
        its one result. None: the row goes the parent's way."""
        assert self.opens is not None
        found = self.index.single(task.key)
        lane = self.lane
        if found is None or lane is None:
            return None
        made = lane.line_of(task, found[0], self.opens.opening(task))
        if made is None:
            return None
        tokens = made.prompt_tokens, made.completion_tokens
        return task.key, made.line, *tokens, FRESH if found[1] else 0

    def _directly(self, task: Task) -> tuple[bool, dict[str, list[Known]]]:
        """Take the row's results, and do the row by its first call alone if it can be:
        whether it was, and its results (for the whole way, if not)."""
        if self.lane is not None and self._bulk(self.lane, task):
            return True, {}
        known = self.index.take(task.key) if task.key in self.index else {}
        return self.opens is not None and self._opened(self.opens, task, known), known

    def _bulk(self, lane: Lane, task: Task) -> bool:
        """Write the row in the bulk lane, if it reads the row's one result."""
        found = self.index.single(task.key)
        assert self.opens is not None  # a lane is made for a plan that opens
        made = lane.line_of(task, found[0], self.opens.opening(task)) if found else None
        if found is None or made is None:
            return False
        self._wrote(lane, task, made, found[1])
        return True

    def _wrote(self, lane: Lane, task: Task, made: Encoded, fresh: bool) -> None:
        lane.write(task, made, fresh)
        self.index.spend(task.key, fresh)
        self.out.pop(task.key, None)
        self.written += 1
        self.read += 1

    async def _row(self, task: Task, known: dict[str, list[Known]]) -> None:
        """Do a row the whole way (once its first call's form is learned: directly, if the
        form renders it)."""
        if self.opens is not None:
            call = self.opens.opening(task)
            if call is not None and self.opens.llm.learns(call):
                await self.opens.llm.learn(call)
                if self._opened(self.opens, task, known):
                    return
        row = RowCalls(task.key, known)
        with calls_of(row):
            try:
                values = await self.runner.attempt(task, self.plan.work)
            except Deferred as waiting:
                self._defer(task.key, row, waiting)
                return
        self._bill_unused(row)
        self.runner.settle(task, values)
        self.out.pop(task.key, None)
        self.written += 1

    def _opened(self, opens: Opens, task: Task, known: dict[str, list[Known]]) -> bool:
        """Do a row by its first call alone, as its work would: send the call's request when
        the row has no result, or write the row from the result of that very request when it
        is all the row needs. False: the row goes the whole way (its first call's form not
        learned yet, a row that fails before its call, a call no form renders)."""
        call = opens.opening(task)
        request = None if call is None else opens.llm.request_of(call, body=not known)
        if call is None or request is None:
            return False
        url, body, digest = request
        if body is not None:  # no result yet: the work would stop at its first call, number 0
            self.rendered += self._send(task.key, 0, digest, url, body)
            self._url = url
            return True
        results = known.get(digest, [])
        if len(known) != 1 or len(results) != 1 or results[0].call != 0:
            return False  # retries, samples, or a result asked with another body
        reply = opens.llm.read_first(call, url, results[0].answer)
        values = None if reply is None else opens.answered(task, reply)
        if reply is None or values is None:
            return False
        opens.llm.booked(reply, results[0].fresh)
        self.runner.settle(task, ok_row(values))
        if self.lane is not None:  # the bulk lane writes the next such rows as this one is
            self.lane.learn(self.runner.last_row)
        self.out.pop(task.key, None)
        self.written += 1
        self.read += 1
        return True

    def _defer(self, key: str, row: RowCalls, waiting: Deferred) -> None:
        """Keep what the row went through; send its next call, unless it is out already."""
        self.unused += bool(row.known) and not row.used  # results of requests it no longer makes
        for known in row.used:
            self._keep(known.line)
        self._bill_unused(row)
        self._send(key, waiting.call, waiting.digest, waiting.url, waiting.body)

    def _bill_unused(self, row: RowCalls) -> None:
        """Bill the results new to this run that the row went without (it asks otherwise now):
        paid for all the same, and spent with the files they came in."""
        used = {id(known) for known in row.used}
        for results in row.known.values():
            for known in results:
                if known.fresh and id(known) not in used:
                    self.llm.billed(known.answer, self.asked_of)

    def _send(self, key: str, call: int, digest: str, url: str, body: bytes) -> bool:
        """Write the request a row waits on (its call, with this body) into a shard, unless
        it is out already."""
        request = token(call, digest)
        if self.out.get(key) == request:
            return False
        identifier = custom_id(self.ledger.tag, call, digest, key)
        self._writer(url).write(identifier, request_line(identifier, url, body))
        self.out[key] = request
        self.sent += 1
        return True

    def _writer(self, url: str) -> ShardWriter:
        """The writer of a URL's requests, with no other URL's shard open: a shard is named
        the next name the ledger has not recorded, so two open at once took the same name."""
        if url != self._open:
            for other in self._writers.values():
                other.close()
            self._open = url
        writer = self._writers.get(url)
        if writer is None:
            names = iter(self.ledger.next_name, None)
            writer = ShardWriter(self.requests, self.files / "ids", names, self._recorded(url))
            writer.max_lines = min(writer.max_lines, self.max_lines or writer.max_lines)
            self._writers[url] = writer
        return writer

    def _recorded(self, url: str) -> Callable[[Shard], None]:
        """How a finished shard of requests to `url` is recorded: its name taken."""

        def record(shard: Shard) -> None:
            self.shards.append(shard)
            self.ledger.record(
                "shard",
                name=shard.name,
                path=shard.path,
                ids=shard.ids,
                lines=shard.lines,
                bytes=shard.size,
                url=url,
                mode=self.mode,
                model=self.runner.stage.model,
                **self.with_shard(self, shard),
            )

        return record

    def _keep_the_rest(self) -> None:
        """Carry the results of rows this run leaves out (a smaller --limit): paid for, they
        are spent only by a row written from them. Those new to this run are billed now."""
        for key in list(self.index.keys()):
            for results in self.index.take(key).values():
                for known in results:
                    self._keep(known.line)
                    if known.fresh:
                        self.llm.billed(known.answer, self.asked_of)
            self.out.pop(key, None)  # its request is answered: it waits on nothing

    def _keep(self, line: bytes) -> None:
        if self._carry is None:
            self._carry_path.parent.mkdir(parents=True, exist_ok=True)
            self._carry = self._carry_path.open("wb", buffering=1 << 20)
        self._carry.write(line if line.endswith(b"\n") else line + b"\n")

    def _retire(self) -> None:
        """The results read are spent, but for those carried: the ledger says so."""
        self.runner.log.flush(durable=True)  # the rows on disk before their results are spent
        carried = None
        if self._carry is not None:
            self._carry.flush()
            os.fsync(self._carry.fileno())
            self._carry.close()
            carried = self._carry_path
        files = [path for path, _ in self.index.files]
        self.ledger.record("merged", files=files, carry=carried, **self.commit(self))


def results_of(ledger: Ledger, fresh: list[Path]) -> list[tuple[Path, bool]]:
    """The files a pass merges: new result files, then the results carried from the last."""
    files = [(path, True) for path in fresh if path.exists()]
    if ledger.carry is not None and ledger.carry.exists():
        files.append((ledger.carry, False))
    return files
