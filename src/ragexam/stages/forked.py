"""A second process for the batch road: the last rows of a large pass, done on another core.

Writing a million requests, or reading a million results, is CPU-bound Python, and one process
uses one core. Once a pass reads rows its fast ways (the bulk lane has learned its line, or,
with no result left to read, a row's request was rendered from its form), a pass with many rows
left forks a child. The child does the last rows those ways, the parent the first ones as
before. A merging child makes each row's CSV line from its one result (`Pass._made`), and the
parent writes them in their rows' order, as if it had made them itself: the same file, and
every count, bill and record kept by the parent alone. A child writing requests renders each
row's request line and writes it into shards of its own (`Pass._sender`), in a hidden folder;
the parent renames them into place under its next names and records them. A row the child does
not make is done by the parent, as every row is without a child; a child that fails leaves all
its rows to the parent. The child's records go to an unnamed temporary file. It dies with its
parent, even at kill -9 (a writing child's shards are left unrecorded, and the next pass drops
them), and the parent waits on it as its event loop runs, so a stop ends both.

The rows of each process, the parent's included, are packed before the fork (packed.py), so
that none reads the objects they were made from while another maps them.

Linux only (fork, PR_SET_PDEATHSIG), and only with a second core to run on. The child runs
no code that takes a lock another thread may hold: no logging, printing, nor event loop. A
child writing requests starts a thread of its own to write them, whose locks are its own
(concurrent.futures makes its global lock anew in a forked child).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import signal
import struct
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from ragexam.io.batchfiles import write_all
from ragexam.stages.packed import Packed
from ragexam.stages.room import room
from ragexam.stages.runner import Task

ROWS_TO_FORK = 20_000  # rows left in a pass below which a child is not worth its start
MAX_CHILDREN = 7
# What a row costs a child, of what it costs the parent, which also writes it and counts it
# (bench_batch at a million rows: a child's share ended as the parent's did at this ratio).
CHILD_COST = 0.9
# a line's length (DECLINED: the child made none), its name's, two numbers and its kind
_RECORD = struct.Struct("<IIQQB")
DECLINED = 0xFFFFFFFF
_CHUNK = 1 << 20
_WINDOW = 4 << 20  # the most of a child's file read at once
_PR_SET_PDEATHSIG = 1
# What a child made of a row: (name, line, two numbers, kind). A CSV line: the row's key, its
# tokens, and FRESH when its result is new to this run. A request it wrote into its own shard
# (SENT, no line): its custom_id, the body's digest and the call's number. A shard it wrote
# (SHARD, after its rows' records): the shard's name, its lines and bytes.
Made = tuple[str, bytes, int, int, int]
FRESH, SENT, SHARD = 1, 2, 8
Make = Callable[[Task], "Made | None"]  # None: the parent does the row
Finish = Callable[[], "Iterable[Made]"]  # what the child says once its rows are made
Share = Packed | Sequence[Task]  # a child's rows: packed, or as they are when they do not pack


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return 1


def children_for(left: int) -> int:
    """How many children a pass with this many rows left gains from: one a spare core, as
    many as the memory holds (room.py)."""
    if sys.platform != "linux" or left < ROWS_TO_FORK:
        return 0
    return room(min(cores() - 1, MAX_CHILDREN))


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """While children live: this process's collections pass over the objects it had when it
    forked them (a collection writes into every object it visits), so their pages stay shared.
    What was frozen before (the command line freezes what it built) stays frozen after, and
    so does what this froze with it: its owner unfreezes it all."""
    owned = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if owned:
            gc.unfreeze()


def shares(left: int, children: int) -> list[int]:
    """The rows left, shared out so that the parent and each child end together: the
    parent's first, then each child's in turn (the last takes what rounding leaves)."""
    each = int(left / (children + CHILD_COST))
    return [left - children * each] + [each] * children


class Child:
    """A forked child making the lines of the last rows of a pass."""

    def __init__(self, pid: int, output: IO[bytes]) -> None:
        self.pid, self.output = pid, output
        self._status: int | None = None  # how it ended, once `wait` saw it end

    @classmethod
    def start(
        cls,
        make: Make,
        rows: Share,
        others: Sequence[Packed],
        folder: Path,
        into: list[Child | None],
        finish: Finish | None = None,
    ) -> None:
        """Fork a child that makes what `make` makes of `rows`, then says what `finish` says
        (and lets the `others`, the other processes' rows, go), and put it `into` the list of
        those to stop (before a signal that waited can be raised here); None when the machine
        has no room for one, its memory now that the rows are packed included: the parent
        does its rows."""
        try:
            if not room(1):
                raise OSError("no memory for a child")
            folder.mkdir(parents=True, exist_ok=True)
            # unnamed, so nothing is left on any exit; closed by `stop`: it outlives this call
            output = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115
        except OSError:
            if isinstance(rows, Packed):
                rows.drop()  # the parent reads the rows as they are
            into.append(None)
            return
        parent = os.getpid()
        # until the child has its own handlers, Ctrl-C and SIGTERM wait: the parent's would
        # run the parent's way out (its files written, its event loop closed) in the child
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            with warnings.catch_warnings():  # 3.12+: threads; the child takes no lock
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                try:
                    _alone(parent, mask)
                    for other in others:
                        other.drop()
                    tasks = rows.rows() if isinstance(rows, Packed) else iter(rows)
                    _child(make, tasks, output, finish)
                finally:
                    os._exit(1)
            into.append(cls(pid, output))
        except OSError:  # no memory or no process left for it
            cls(0, output).stop()
            into.append(None)
        finally:
            if isinstance(rows, Packed):
                rows.drop()  # the child's now, or the parent reads the rows as they are
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    async def wait(self) -> None:
        """Until the child has ended, the event loop running meanwhile: a stop (Ctrl-C,
        SIGTERM: the stage's task cancelled) ends the wait, and `stop` the child."""
        while self.pid and self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222 (it never blocks)
            if pid:
                self._status, self.pid = status, 0
            else:
                await asyncio.sleep(0.01)

    def lines(self) -> Iterator[Made | None] | None:
        """Once the child has ended: what it made of each of its rows, in order, None for a
        row it did not make; None when it failed. Read before `stop`, which drops them."""
        status = self._status
        if status is None:
            _, status = os.waitpid(self.pid, 0)
            self.pid = 0
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        return _records(self.output.fileno())

    def stop(self) -> None:
        """End the child, if it still runs, and drop its file."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            self.pid = 0
        self.output.close()


def _records(fd: int) -> Iterator[Made | None]:
    """The records of a child's file, read a window at a time (a million request lines are
    gigabytes: mapped, they would count in this process's resident memory). A record cut
    short ends them: the rows after it are the parent's."""
    data, at, offset, size = b"", 0, 0, _RECORD.size
    while True:
        if len(data) - at < size:
            more = os.pread(fd, _WINDOW, offset)
            offset += len(more)
            data, at = data[at:] + more, 0
            if len(data) < size:
                return
        length, named, first, second, kind = _RECORD.unpack_from(data, at)
        at += size
        if length == DECLINED:
            yield None
            continue
        end = at + named + length
        if len(data) < end:  # the record runs on past what is read: read on from it
            more = os.pread(fd, max(_WINDOW, end - len(data)), offset)
            offset += len(more)
            data, end, at = data[at:] + more, end - at, 0
            if len(data) < end:
                return
        name = data[at : at + named].decode("utf-8", "surrogatepass")
        yield name, data[at + named : end], first, second, kind
        at = end


def _child(
    make: Make, tasks: Iterator[Task], output: IO[bytes], finish: Finish | None = None
) -> None:
    """The child's whole life: it never returns, and runs none of the parent's cleanup."""
    fd = output.fileno()
    try:
        chunk: list[bytes] = []
        size = 0
        for made in _all_made(make, tasks, finish):
            if made is None:
                chunk.append(_RECORD.pack(DECLINED, 0, 0, 0, 0))
                continue
            name, line, first, second, kind = made
            named = name.encode("utf-8", "surrogatepass")
            chunk += (_RECORD.pack(len(line), len(named), first, second, kind), named, line)
            size += len(line)
            if size >= _CHUNK:
                write_all(fd, b"".join(chunk))
                chunk, size = [], 0
        write_all(fd, b"".join(chunk))
    except BaseException:
        os._exit(1)
    os._exit(0)


def _all_made(make: Make, tasks: Iterator[Task], finish: Finish | None) -> Iterator[Made | None]:
    for task in tasks:
        yield make(task)
    if finish is not None:
        yield from finish()


def _alone(parent: int, mask: set[int | signal.Signals]) -> None:
    """The child's own signals: Ctrl-C, which reaches the parent too, is the parent's to act
    on (it ends the child); SIGTERM ends it at once; and so does the parent's death."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)  # never wake the parent's event loop
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)
