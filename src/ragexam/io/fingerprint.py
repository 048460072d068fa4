"""Fingerprints: what a row was made from, so a resumed run redoes rows whose input changed.

Each row records `input_hash`, a hash of the input values it was made from (the chunk for a
question; the question and ground truth for an answer; question, ground truth and answer for
a grade). The settings a row must share with its run (model, prompt, a stage's fixed ones
such as k) are checked by the runner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ragexam.errors import OutputFileError

UNIT_SEPARATOR = "\x1f"  # cannot appear in CSV text cells that matter, so joins stay unambiguous


def input_hash(*values: str | None) -> str:
    """A short stable hash of the input values a row is made from, in order."""
    text = UNIT_SEPARATOR.join("" if value is None else value for value in values)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def answer_hash(question: str, truth: str, sources: tuple[str, ...]) -> str:
    """What an answer is made from: its question, the question's ground truth and source
    chunks (one source hashes as before several were possible: answers made then stay current)."""
    return input_hash(question, truth, *(sources or ("",)))


def text_hash(text: str) -> str:
    """A chunk's text as the exam keeps it (`chunk_hash`): a store rebuilt with new ids still
    holds the same text, and a retrieved chunk is matched by it."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class Stage(Protocol):
    """What the rows of a stage's output must share: model, prompt and fixed settings."""

    @property
    def path(self) -> Path:
        """The output file."""

    @property
    def model(self) -> str:
        """The model that made the rows."""

    @property
    def prompt_hash(self) -> str:
        """The hash of the prompt that made them."""

    @property
    def fixed(self) -> Mapping[str, Any]:
        """The settings every row shares."""

    @property
    def legacy(self) -> Mapping[str, Any]:
        """Fixed settings that rows of older versions leave empty, with what they were."""


def changed_inputs(
    rows: Mapping[str, Mapping[str, Any]], inputs: Callable[[], Mapping[str, str]]
) -> list[str]:
    """Keys of rows whose recorded input hash differs from the input this run has for them."""
    current = inputs()
    return [
        key for key, row in rows.items() if key in current and row.get("input_hash") != current[key]
    ]


def stale_rows(stage: Stage, rows: Mapping[str, Mapping[str, Any]], force: bool) -> list[str]:
    """Keys of rows made under another model, prompt or fixed setting; without --force, refused."""
    ours = _fingerprint(stage, None)
    stale = [key for key, row in rows.items() if _fingerprint(stage, row) != ours]
    if stale and not force:
        theirs = _fingerprint(stage, rows[stale[0]])
        names = [name for name in ours if theirs[name] != ours[name]]
        what = "model or prompt" if {"model", "prompt"} & set(names) else " or ".join(names)
        was = ", ".join(f"{name} {theirs[name]!r}" for name in names)
        now = ", ".join(f"{name} {ours[name]!r}" for name in names)
        raise OutputFileError(
            stage.path,
            f"{len(stale)} existing rows came from a different {what} "
            f"({was}) than this run ({now}); pass --force to redo them, or use another --out",
        )
    return stale


def _fingerprint(stage: Stage, row: Mapping[str, Any] | None) -> dict[str, str]:
    """What a row must share with its run: model, prompt, and the stage's fixed settings."""
    if row is None:
        mine = {"model": stage.model, "prompt": stage.prompt_hash}
        return mine | {name: _cell(value) for name, value in stage.fixed.items()}
    theirs = {"model": str(row.get("model") or ""), "prompt": str(row.get("prompt_hash") or "")}
    for name in stage.fixed:
        cell = str(row.get(name) or "")
        # An older row's empty cell is the setting it was made at, as its version recorded it.
        theirs[name] = _cell(stage.legacy[name]) if not cell and name in stage.legacy else cell
    return theirs


def _cell(value: Any) -> str:
    """A fixed setting as a row holds it once read back: None is empty, a bool lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)
