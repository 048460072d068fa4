"""The structured cells of ragexam's CSVs: an exam's `kind` and `chunk_ids`, an answer's
`target_ranks` (JSON arrays)."""

from __future__ import annotations

import json
from typing import Any

SINGLE, MULTI_HOP, UNANSWERABLE = "single", "multi-hop", "unanswerable"
KINDS = (SINGLE, MULTI_HOP, UNANSWERABLE)  # of question: one chunk, two, none that answers
NOT_A_KIND = f"a kind that is none of {', '.join(KINDS)}"  # an exam's cell that is no kind


def id_list(cell: str) -> tuple[str, ...] | None:
    """The ids of a JSON array of strings (empty cell: none); None when it is not one."""
    value = _array(cell)
    if value is None or not all(isinstance(item, str) and item for item in value):
        return None
    return tuple(value)


def rank_list(cell: str) -> tuple[int | None, ...] | None:
    """The ranks of a JSON array of 1-based ranks or nulls; None when it is not one."""
    value = _array(cell)
    if value is None:
        return None
    if not all(item is None or _whole(item) for item in value):
        return None
    return tuple(value)


def _whole(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and item >= 1


def _array(cell: str) -> list[Any] | None:
    if not cell.strip():
        return []
    try:
        value = json.loads(cell)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def question_chunks(chunk_id: str, chunk_ids: tuple[str, ...]) -> tuple[str, ...]:
    """A question's source chunks: its chunk_ids, else its chunk_id (an empty list is none)."""
    return chunk_ids or ((chunk_id,) if chunk_id else ())
