"""One writer per run folder: an exclusive, advisory lock held while a command writes there.

The lock is `flock` on `OUT/.ragexam.lock`; the kernel drops it when the process dies, however
it dies, so a crashed run never leaves the folder locked. The file holds the holder's pid,
for the message a second process prints.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from ragexam.errors import RunFolderBusy
from ragexam.io.atomic import folder_error

LOCK_FILE = ".ragexam.lock"


class Locks:
    """The run folders one command holds: each locked once, however many of its stages ask."""

    def __init__(self) -> None:
        self._held: dict[Path, int] = {}

    @contextmanager
    def holding(self, out: Path) -> Iterator[None]:
        """Hold the run folder's lock, or raise RunFolderBusy naming the pid that holds it."""
        key = out.resolve()
        if key in self._held:  # `run` holds it across its stages; each stage takes it again
            self._held[key] += 1
            try:
                yield
            finally:
                self._held[key] -= 1
            return
        descriptor = _acquire(out)
        self._held[key] = 1
        try:
            yield
        finally:
            del self._held[key]
            os.close(descriptor)  # closing releases the flock


def run_folder_lock(out: Path) -> AbstractContextManager[None]:
    """Hold one run folder's lock, for a caller outside any command."""
    return Locks().holding(out)


def _acquire(out: Path) -> int:
    try:
        out.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise folder_error(out, exc) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(descriptor)
        raise RunFolderBusy(out, holder) from None
    os.ftruncate(descriptor, 0)
    with suppress(OSError):  # a full disk: the lock holds all the same, only its pid is unsaid
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor
