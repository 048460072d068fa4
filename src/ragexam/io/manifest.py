"""The run folder's manifest.json: what every stage's results depend on, and its figures.

A stage that stops on a full disk must still record that it failed. While a stage runs, a
small file (`.manifest.room`) holds disk room for that last update: when the manifest cannot
be written for want of space, the room is given back and the write tried once more.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ragexam.errors import NoSpaceLeft, OutputFileError
from ragexam.io.atomic import NO_SPACE, atomic_file

ROOM_FILE = ".manifest.room"
ROOM_BYTES = 64 * 1024  # a manifest of every stage, settings included, is a few KiB


@contextmanager
def manifest_room(out: Path) -> Iterator[None]:
    """Hold disk room for the manifest's last update while a stage runs; give it back after."""
    path = out / ROOM_FILE
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(descriptor, 0, ROOM_BYTES)
        finally:
            os.close(descriptor)
    except OSError as exc:
        with suppress(FileNotFoundError):
            path.unlink()
        if exc.errno in NO_SPACE:  # not even this much room: stop before any work
            raise NoSpaceLeft(out / "manifest.json") from None
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            path.unlink()


def update_manifest(
    out: Path, stage: str, record: Mapping[str, Any], *, last: bool = False
) -> Path:
    """Merge one stage's record into `manifest.json` of the run folder, atomically.

    The stage's `last` update may use the room held for it when the disk is full.
    """
    path = out / "manifest.json"
    manifest = _current(path)
    manifest["ragexam_version"] = version("ragexam")
    manifest.setdefault("stages", {})[stage] = {
        **record,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    text = json.dumps(manifest, indent=2, default=str) + "\n"
    try:
        _write(path, text)
    except NoSpaceLeft:
        if not last or not (out / ROOM_FILE).exists():
            raise
        (out / ROOM_FILE).unlink()  # the room held for this moment
        _write(path, text)
    return path


def set_run_field(out: Path, name: str, value: Any) -> Path:
    """Set one figure of the run as a whole (such as its cost) in `manifest.json`."""
    path = out / "manifest.json"
    manifest = _current(path)
    manifest[name] = value
    _write(path, json.dumps(manifest, indent=2, default=str) + "\n")
    return path


def _current(path: Path) -> dict[str, Any]:
    """The manifest to update: {} when there is none; refused when not a JSON object."""
    manifest = _parsed(path)
    if not isinstance(manifest, dict):
        raise OutputFileError(path, "is not a JSON object; move it away and ragexam rebuilds it")
    return manifest


def _parsed(path: Path) -> Any:
    """The manifest's JSON, {} when there is none. One that does not parse is refused, not
    rebuilt: it was edited (ragexam writes it whole, by a rename), and rebuilt it would forget
    the store the folder's exam is of, and take another's."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise OutputFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise OutputFileError(path, "is not UTF-8 text; " + _FIX) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
        raise OutputFileError(path, f"is not valid JSON ({where}); {_FIX}") from None
    stages = data.get("stages", {}) if isinstance(data, dict) else {}
    if not isinstance(stages, dict):  # edited: every reader takes them for objects
        raise OutputFileError(path, f"its 'stages' is not a JSON object; {_FIX}")
    odd = [name for name, record in stages.items() if not isinstance(record, dict)]
    if odd:
        raise OutputFileError(path, f"its stage {odd[0]!r} is not a JSON object; {_FIX}")
    return data


# how to go on from a manifest that does not parse
_FIX = "fix it, or move it away and ragexam rebuilds it (forgetting which store the exam is of)"


def _write(path: Path, text: str) -> None:
    with atomic_file(path) as handle:
        handle.write(text)


def read_manifest(out: Path) -> dict[str, Any]:
    """The run folder's manifest, or an empty one (none yet, or a folder that is none)."""
    path = out / "manifest.json"
    if not out.is_dir():
        return {}
    data = _parsed(path)
    return data if isinstance(data, dict) else {}
