"""Read a persisted Chroma store without ever writing to it: open a snapshot copy instead.

Chroma (1.x, its Rust core) has no read-only mode: opening a store rewrites `chroma.sqlite3`
and index files, fails on a read-only mount, and even the refusal of an older store's format
adds a table. So ragexam copies the store into a private temporary folder, once per process,
and opens the copy; the user's store stays byte-identical. The copies go when the command ends;
those of a command killed (`kill -9`) go when the next one makes its own.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ragexam.errors import StoreError

PREFIX = "ragexam-store-"  # then the process's number: the snapshots of a dead one are swept


@dataclass(frozen=True)
class Snapshot:
    """A private copy of a store: where it is, how big, and how long the copy took."""

    original: Path
    path: Path
    size: int
    seconds: float
    signature: frozenset[tuple[str, int, int]]

    def describe(self) -> str:
        """One line for the terminal."""
        return (
            f"reading a snapshot of {self.original} ({self.size / 1e6:.1f} MB, copied in "
            f"{self.seconds:.1f}s): Chroma writes to any store it opens, and ragexam never "
            "changes yours"
        )


class Snapshots:
    """The snapshots one command made, by store: made once, reused by its stages, then removed."""

    def __init__(self) -> None:
        self._made: dict[Path, Snapshot] = {}

    def of(self, store: Path) -> tuple[Snapshot, bool]:
        """The snapshot of a store, and whether it was made just now.

        A snapshot is made again when the store's files changed since (size or mtime).
        """
        key, signature = store.resolve(), _signature(store)
        if key in self._made:
            if self._made[key].signature == signature:
                return self._made[key], False
            shutil.rmtree(self._made.pop(key).path.parent, ignore_errors=True)
        started = time.monotonic()
        _sweep()
        root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{_namespace()}-"))
        if not self._made:
            atexit.register(self.remove)  # a command that dies still leaves no copy behind
        try:
            size = _copy(store, root / "store")
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise StoreError(
                f"cannot copy the Chroma store at {store} to read it safely: {exc.strerror}; "
                "make room in the temporary folder (TMPDIR)"
            ) from None
        made = Snapshot(store, root / "store", size, time.monotonic() - started, signature)
        self._made[key] = made
        return made, True

    @property
    def made(self) -> list[Snapshot]:
        """The snapshots made so far."""
        return list(self._made.values())

    def existing(self, store: Path) -> Path | None:
        """Where the snapshot of a store is, if one was made."""
        made = self._made.get(store.resolve())
        return made.path if made is not None else None

    def remove(self) -> None:
        """Delete every snapshot made."""
        if self._made:
            atexit.unregister(self.remove)  # done: the process need not keep this session
        while self._made:
            _, made = self._made.popitem()
            shutil.rmtree(made.path.parent, ignore_errors=True)


def _sweep() -> None:
    """Remove the snapshots of commands that died without removing theirs (`kill -9`, the
    OOM killer): each is named by its process, and a process that is gone needs it no more.
    Only those of this user and of this process namespace: a container sharing the folder
    numbers its processes apart."""
    ours = _namespace()
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*-*"):
        pid, namespace, _ = root.name.removeprefix(PREFIX).split("-", 2)
        if namespace != ours or not pid.isdigit() or _alive(int(pid)):
            continue
        if root.is_dir() and root.stat().st_uid == os.getuid():
            shutil.rmtree(root, ignore_errors=True)


def _namespace() -> str:
    """This process's PID namespace (Linux), in which its number means this process."""
    try:
        return str(Path("/proc/self/ns/pid").readlink()).removeprefix("pid:[").removesuffix("]")
    except OSError:
        return "0"


def _alive(pid: int) -> bool:
    """Whether a process of this number runs (one we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _signature(store: Path) -> frozenset[tuple[str, int, int]]:
    """Every file of the store with its size and modification time."""
    files = (path for path in store.rglob("*") if path.is_file())
    return frozenset(
        (str(path), stat.st_size, stat.st_mtime_ns) for path in files for stat in [path.stat()]
    )


def _copy(source: Path, target: Path) -> int:
    """Copy a folder's files, writable whatever their modes were; the bytes copied."""
    size = 0
    for folder, _, files in os.walk(source):
        destination = target / Path(folder).relative_to(source)
        destination.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(Path(folder) / name, destination / name)  # contents, not modes
            size += (destination / name).stat().st_size
    return size
