"""One writer per run folder: an exclusive, advisory lock held while a command writes there.

The lock is `flock` on `OUT/.ragexam.lock`; the kernel drops it when the process dies, however
it dies, so a crashed run never leaves the folder locked. The file holds the holder's pid,
for the message a second process prints.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ragexam.errors import OutputFileError, RunFolderBusy

LOCK_FILE = ".ragexam.lock"
_held: dict[Path, int] = {}  # folders this process holds, with a count: stages nest in `run`


@contextmanager
def run_folder_lock(out: Path) -> Iterator[None]:
    """Hold the run folder's lock, or raise RunFolderBusy naming the pid that holds it."""
    key = out.resolve()
    if key in _held:  # `run` holds it across its stages; each stage takes it again
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    descriptor = _acquire(out)
    _held[key] = 1
    try:
        yield
    finally:
        del _held[key]
        os.close(descriptor)  # closing releases the flock


def _acquire(out: Path) -> int:
    try:
        out.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputFileError(
            out, f"cannot be written as a run folder ({exc.strerror}); pass a writable --out"
        ) from None
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
