"""Fingerprints: what a row was made from, so a resumed run redoes rows whose input changed.

Each row records `input_hash`, a hash of the input values it was made from (the chunk for a
question; the question and ground truth for an answer; question, ground truth and answer for
a grade). The settings a row must share with its run (model, prompt, a stage's fixed ones
such as k) are checked by the runner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

UNIT_SEPARATOR = "\x1f"  # cannot appear in CSV text cells that matter, so joins stay unambiguous


def input_hash(*values: str | None) -> str:
    """A short stable hash of the input values a row is made from, in order."""
    text = UNIT_SEPARATOR.join("" if value is None else value for value in values)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def changed_inputs(
    rows: Mapping[str, Mapping[str, Any]], inputs: Callable[[], Mapping[str, str]]
) -> list[str]:
    """Keys of rows whose recorded input hash differs from the input this run has for them."""
    current = inputs()
    return [
        key for key, row in rows.items() if key in current and row.get("input_hash") != current[key]
    ]
