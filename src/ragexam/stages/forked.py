"""A second process for the bulk lane: the last rows of a large pass, read on another core.

Reading a million results is CPU-bound Python, and one process uses one core. Once the bulk
lane has learned its line, a pass with many rows left forks a child. The child makes the
lines of the last rows (the lane's pure step: `Lane.line_of`), while the parent writes the
first ones as before; then the parent writes the child's lines, in their rows' order, as if
it had made them itself: the same file, in the same order, and every count, bill and record
kept by the parent alone. A row the child does not read is done by the parent, as every row
is without a child. The child writes nothing but an unnamed temporary file, and dies with
its parent (a kill -9 leaves nothing behind); a child that fails leaves its rows to the
parent.

The rows of each process, the parent's included, are packed before the fork (packed.py), so
that none reads the objects they were made from while another maps them.

Linux only (fork, PR_SET_PDEATHSIG), and only with a second core to run on. The child runs
no code that takes a lock another thread may hold: no logging, printing, nor event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import mmap
import os
import signal
import struct
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from ragexam.io.batchfiles import write_all
from ragexam.stages.bulk import Lane
from ragexam.stages.packed import Packed
from ragexam.stages.room import room
from ragexam.stages.runner import Task

ROWS_TO_FORK = 20_000  # rows left in a pass below which a child is not worth its start
MAX_CHILDREN = 7
# What a row costs a child, of what it costs the parent, which also writes it and counts it
# (bench_batch at a million rows: a child's share ended as the parent's did at this ratio).
CHILD_COST = 0.9
# a line's length (DECLINED: the child read none), its key's, its tokens and freshness
_RECORD = struct.Struct("<IIqq?")
DECLINED = 0xFFFFFFFF
_CHUNK = 1 << 20
_PR_SET_PDEATHSIG = 1

# (the row's line, its result line's freshness) from the index, or None
Found = Callable[[str], "tuple[bytes, bool] | None"]
Opening = Callable[[Task], Any]
Share = Packed | Sequence[Task]  # a child's rows: packed, or as they are when they do not pack
Made = tuple[str, bytes, int, int, bool]  # a row the child read: key, line, tokens, fresh


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

    @classmethod
    def start(
        cls,
        lane: Lane,
        found: Found,
        opening: Opening,
        rows: Share,
        others: Sequence[Packed],
        folder: Path,
        into: list[Child | None],
    ) -> None:
        """Fork a child that makes the lines of `rows` (and lets the `others`, the other
        processes' rows, go), and put it `into` the list of those to stop (before a signal
        that waited can be raised here); None when the machine has no room for one, its
        memory now that the rows are packed included: the parent does its rows."""
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
                    _child(lane, found, opening, tasks, output)
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

    def lines(self) -> Iterator[Made | None] | None:
        """Once the child has ended: (key, line, prompt and completion tokens, fresh) of each
        of its rows in order, None for a row it did not read; None when it failed."""
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        size = os.fstat(self.output.fileno()).st_size
        return (
            _records(mmap.mmap(self.output.fileno(), size, prot=mmap.PROT_READ))
            if size
            else iter(())
        )

    def stop(self) -> None:
        """End the child, if it still runs, and drop its file."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            self.pid = 0
        self.output.close()


def _records(data: mmap.mmap) -> Iterator[Made | None]:
    at, size = 0, _RECORD.size
    with data:
        while at < len(data):
            length, named, prompt, completion, fresh = _RECORD.unpack_from(data, at)
            at += size
            if length == DECLINED:
                yield None
                continue
            key = data[at : at + named].decode("utf-8", "surrogatepass")
            at += named
            yield key, data[at : at + length], prompt, completion, fresh
            at += length


def _child(
    lane: Lane, found: Found, opening: Opening, tasks: Iterator[Task], output: IO[bytes]
) -> None:
    """The child's whole life: it never returns, and runs none of the parent's cleanup."""
    fd = output.fileno()
    try:
        chunk: list[bytes] = []
        size = 0
        for task in tasks:
            result = found(task.key)
            made = lane.line_of(task, result[0], opening(task)) if result is not None else None
            if result is None or made is None:
                chunk.append(_RECORD.pack(DECLINED, 0, 0, 0, False))
                continue
            line, key = made.line, task.key.encode("utf-8", "surrogatepass")
            tokens = made.prompt_tokens, made.completion_tokens
            chunk += (_RECORD.pack(len(line), len(key), *tokens, result[1]), key, line)
            size += len(line)
            if size >= _CHUNK:
                write_all(fd, b"".join(chunk))
                chunk, size = [], 0
        write_all(fd, b"".join(chunk))
    except BaseException:
        os._exit(1)
    os._exit(0)


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
