"""The run folder's manifest.json: what every stage's results depend on, and its figures."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragexam import __version__
from ragexam.csvfile import atomic_file
from ragexam.errors import OutputFileError


def update_manifest(out: Path, stage: str, record: Mapping[str, Any]) -> Path:
    """Merge one stage's record into `manifest.json` of the run folder, atomically."""
    path = out / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        manifest = {}  # a torn manifest is rebuilt; the CSVs are the record of results
    if not isinstance(manifest, dict):
        raise OutputFileError(path, "is not a JSON object; move it away and ragexam rebuilds it")
    manifest["ragexam_version"] = __version__
    manifest.setdefault("stages", {})[stage] = {
        **record,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    try:
        with atomic_file(path) as handle:
            handle.write(json.dumps(manifest, indent=2, default=str) + "\n")
    except OSError as exc:
        raise OutputFileError(path, f"cannot be written: {exc.strerror}") from None
    return path


def read_manifest(out: Path) -> dict[str, Any]:
    """The run folder's manifest, or an empty one."""
    path = out / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def input_file(out: Path, name: str, key: str) -> Path:
    """`out/name`, else the file a stage of this run recorded reading as `key` (e.g. the exam)."""
    local = out / name
    if local.exists():
        return local
    stages = read_manifest(out).get("stages")
    for record in stages.values() if isinstance(stages, dict) else ():
        recorded = record.get(key) if isinstance(record, dict) else None
        if isinstance(recorded, str) and Path(recorded).is_file():
            return Path(recorded)
    return local
