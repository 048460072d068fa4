"""Whole files written atomically, with the umask's mode; a failed write is one line of error."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import IO

from ragexam.errors import NoSpaceLeft, OutputFileError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or a full quota


def write_error(path: Path, exc: OSError, advice: str = "") -> OutputFileError:
    """The one-line error for a write that failed: no space left on the run folder, or why."""
    if exc.errno in NO_SPACE:
        return NoSpaceLeft(path)
    return OutputFileError(path, f"cannot be written: {exc.strerror or exc}{advice}")


def folder_error(path: Path, exc: OSError) -> OutputFileError:
    """The one-line error for a run folder that cannot be made or written: a file in its place
    (or in a parent's), or the system's reason."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            reason = f"{part} is a file, not a folder"
            break
    else:
        reason = exc.strerror or str(exc)
    return OutputFileError(
        path, f"cannot be written as a run folder ({reason}); pass a writable --out"
    )


def unwritable(folder: Path) -> str | None:
    """Why files cannot be made in a folder (or, if it does not exist yet, in the nearest
    folder it would be made in), as the system would say it; None when they can."""
    place = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if place is None or os.access(place, os.W_OK | os.X_OK):
        return None
    read_only = os.statvfs(place).f_flag & os.ST_RDONLY
    return os.strerror(errno.EROFS if read_only else errno.EACCES)


@contextmanager
def atomic_file(path: Path) -> Iterator[IO[str]]:
    """Write a text file under a unique temporary name, then rename it over `path`.

    The unique name means two writers never share a temporary file; a failed write leaves
    `path` as it was, removes the temporary file and raises OutputFileError.
    """
    try:
        descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as handle:
            os.fchmod(descriptor, _mode(path))  # mkstemp's 0600 would hide results from others
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        Path(name).replace(path)
    except BaseException as exc:
        with suppress(FileNotFoundError):
            Path(name).unlink()
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise


def _mode(path: Path) -> int:
    """The mode a rewritten file keeps, or a new file gets: as `open` would make it (umask)."""
    with suppress(FileNotFoundError):
        return path.stat().st_mode & 0o777
    return 0o666 & ~_umask()


@cache
def _umask() -> int:
    """The process's umask (read by setting it, so once: it is process-wide)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
