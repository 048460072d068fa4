"""Rows packed into a few large bytes before a fork, so that no process reads the objects
they were made from while another maps them.

After a fork every page is shared until a process writes to it, and then it is copied. CPython
writes a reference count into every object it reads: a parent and a child each reading their
own share of a million exam rows as objects copied nearly every page the rows lay on (890 MB
of the child's, measured). Packed, each process reads its rows from bytes of its own (a
chunk's reading writes one count), makes them anew in memory of its own, and lets the chunks
go as it reads them; a chunk of 32 MiB or more is mapped apart by the allocator (glibc,
musl), so letting it go gives its memory back.

Rows pack when they share their `known` and `late` (the judge's do) and their payloads are
named tuples of one type whose fields are declared strings, numbers, booleans or None (mypy
holds the values to that): marshal writes those exactly, and refuses their subclasses, so
each row is made again equal to what it was. A field declared otherwise (bytes, which marshal
would also make of a bytearray; a container) keeps the rows from packing.
"""

from __future__ import annotations

import gc
import marshal
import types
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from itertools import islice
from typing import Any, Union, get_args, get_origin, get_type_hints

from ragexam.stages.runner import Task

ROWS = 1024  # rows a chunk holds
GROUP = 32 << 20  # bytes a group of chunks holds at least: mapped apart, and unmapped when let go
_VERSION = 2  # marshal's, without references: it writes nothing into what it reads
_EXACT = frozenset({str, int, float, bool, type(None)})  # the fields that pack


def split(tasks: Iterator[Task], sizes: Sequence[int]) -> list[tuple[list[Task], Packed | None]]:
    """The next rows, in parts of these sizes, each with its rows packed (None: they do not
    pack). The collector waits meanwhile: a million tasks made at once set off collections
    that visit every object of the process, for nothing (a task holds no cycle): 1.7 s at a
    million rows, against 0.2 s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        parts = [list(islice(tasks, size)) for size in sizes]
        return [(part, Packed.of(part)) for part in parts]
    finally:
        if enabled:
            gc.enable()


class Packed:
    """Rows in groups of marshalled chunks, read once, each group let go when read."""

    def __init__(self, first: Task, groups: list[tuple[bytes, list[int]]], count: int) -> None:
        self._known, self._late, self._kind = first.known, first.late, type(first.payload)
        self._groups: list[tuple[bytes, list[int]] | None] = list(groups)
        self.count = count

    @classmethod
    def of(cls, tasks: Sequence[Task]) -> Packed | None:
        """The tasks packed; None when they do not pack (they are read as they are)."""
        if not tasks or not _packable(tasks[0]):
            return None
        first, groups, chunks, size = tasks[0], [], [], 0
        for start in range(0, len(tasks), ROWS):
            chunk = _chunk(first, tasks[start : start + ROWS])
            if chunk is None:
                return None
            chunks.append(chunk)
            size += len(chunk)
            if size >= GROUP:
                groups.append(_group(chunks))
                chunks, size = [], 0
        if chunks:
            groups.append(_group(chunks))
        return cls(first, groups, len(tasks))

    def rows(self) -> Iterator[Task]:
        """The rows, made again in order; each group is let go once read."""
        known, late = self._known, self._late
        make: Callable[[tuple[Any, ...]], Any] = self._kind._make
        for number, group in enumerate(self._groups):
            if group is None:
                return
            self._groups[number] = None
            data, ends = group
            view, start = memoryview(data), 0
            del data, group
            for end in ends:
                for key, fields in marshal.loads(view[start:end]):
                    yield Task(key, known, make(fields), late)
                start = end
            view.release()

    def drop(self) -> None:
        """Let every group go (another process reads them)."""
        self._groups = []


def _packable(first: Task) -> bool:
    kind = type(first.payload)
    return issubclass(kind, tuple) and hasattr(kind, "_make") and _scalars(kind)


@cache
def _scalars(kind: type) -> bool:
    """Whether every field of a named tuple type is declared one that packs, or a union of
    them (checked once a type: at a million rows, checking each value took 0.55 s)."""
    try:
        hints = get_type_hints(kind)
    except Exception:  # a name it cannot resolve: it does not pack
        return False
    for name in getattr(kind, "_fields", ()):
        if name not in hints:  # collections.namedtuple declares nothing
            return False
        hint = hints[name]
        union = get_origin(hint) in (Union, types.UnionType)
        if not all(arg in _EXACT for arg in (get_args(hint) if union else (hint,))):
            return False
    return True


def _chunk(first: Task, tasks: Sequence[Task]) -> bytes | None:
    """The tasks' keys and payload fields, marshalled; None when one does not pack."""
    known, late, kind = first.known, first.late, type(first.payload)
    if any(
        t.known is not known or t.late is not late or type(t.payload) is not kind for t in tasks
    ):
        return None
    try:
        return marshal.dumps([(t.key, tuple(t.payload)) for t in tasks], _VERSION)
    except ValueError:  # a subclass of str, int or float, or an object typed otherwise
        return None


def _group(chunks: list[bytes]) -> tuple[bytes, list[int]]:
    """Chunks joined into one bytes, and where each ends."""
    ends, at = [], 0
    for chunk in chunks:
        at += len(chunk)
        ends.append(at)
    return b"".join(chunks), ends
