"""Which chunks the exam covers, and how it splits: stratified by document, seeded.

`--sample N` allocates N chunks to the documents in proportion to their sizes (largest
remainders; at least one each when N allows), `--per-document N` takes N from each, and
`--split F` puts a fraction F of each document's questions in `validation`, the rest in
`test`. Every draw comes from `--seed`, so the same store and options give the same rows.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragexam.errors import ConfigError, OutputFileError
from ragexam.io.manifest import read_manifest

SPLITS = ("validation", "test")


@dataclass(frozen=True)
class Sampling:
    """How generate chooses and splits its chunks; the manifest records it."""

    sample: int | None = None
    per_document: int | None = None
    seed: int = 0
    split: float | None = None

    def __post_init__(self) -> None:
        if self.sample is not None and self.per_document is not None:
            raise ConfigError("give --sample N or --per-document N, not both")
        if self.split is not None and not 0 < self.split < 1:
            raise ConfigError(f"--split {self.split:g} must lie between 0 and 1, e.g. 0.5")

    @property
    def active(self) -> bool:
        """True when the chunks must be listed before the first question is written."""
        return (self.sample, self.per_document, self.split) != (None, None, None)

    def record(self) -> dict[str, Any]:
        """What the manifest keeps; a resumed run must match it."""
        return asdict(self) if self.active else {}


def allocate(counts: Mapping[str, int], n: int) -> dict[str, int]:
    """Chunks per document: proportional to its size, largest remainders first (ties by name).

    When n is at least the number of documents, each gets at least one; never more than it has.
    """
    total = sum(counts.values())
    if n >= total:
        return dict(counts)
    quota = {doc: n * count / total for doc, count in counts.items()}
    least = 1 if n >= len(counts) else 0
    given = {doc: max(least, min(counts[doc], math.floor(quota[doc]))) for doc in counts}
    left = n - sum(given.values())
    while left != 0:
        step = 1 if left > 0 else -1
        # Give to those furthest below their quota; take from those furthest above it.
        able = [
            doc
            for doc in sorted(counts)
            if (given[doc] < counts[doc] if step > 0 else given[doc] > least)
        ]
        able.sort(key=lambda doc: step * (given[doc] - quota[doc]))
        for doc in able[: abs(left)]:
            given[doc] += step
            left -= step
    return given


def choose(chunks: Iterable[tuple[str, str]], sampling: Sampling) -> set[str]:
    """The ids of the chunks to ask about, from (id, document) pairs: a seeded stratified draw."""
    by_document: dict[str, list[str]] = {}
    for chunk_id, document in chunks:
        by_document.setdefault(document, []).append(chunk_id)
    counts = {doc: len(ids) for doc, ids in by_document.items()}
    if sampling.per_document is not None:
        wanted = {doc: min(count, sampling.per_document) for doc, count in counts.items()}
    elif sampling.sample is not None:
        wanted = allocate(counts, sampling.sample)
    else:
        wanted = counts
    rng = random.Random(sampling.seed)
    chosen: set[str] = set()
    for doc in sorted(by_document):
        chosen.update(rng.sample(sorted(by_document[doc]), wanted[doc]))
    return chosen


def assign_splits(chunks: Iterable[tuple[str, str]], fraction: float, seed: int) -> dict[str, str]:
    """Each chunk's split: per document, round(fraction x its count) in validation, at random."""
    by_document: dict[str, list[str]] = {}
    for chunk_id, document in chunks:
        by_document.setdefault(document, []).append(chunk_id)
    rng = random.Random(f"{seed}:split")
    splits: dict[str, str] = {}
    for doc in sorted(by_document):
        ids = sorted(by_document[doc])
        rng.shuffle(ids)
        validation = math.floor(fraction * len(ids) + 0.5)
        splits.update({chunk_id: SPLITS[place >= validation] for place, chunk_id in enumerate(ids)})
    return splits


def check_resume(out: Path, path: Path, sampling: Sampling) -> None:
    """Refuse to add rows of another sample or split to an existing qa_dataset.csv."""
    if not path.exists() or path.stat().st_size == 0:
        return
    stages = read_manifest(out).get("stages") or {}
    record = (stages.get("generate") or {}) if isinstance(stages, dict) else {}
    if not record:
        return
    before = (record.get("options") or {}).get("sampling") or {}
    if before != sampling.record():
        raise OutputFileError(
            path,
            f"was written with sampling {_describe(before)}, not {_describe(sampling.record())}; "
            "rerun with the same --sample/--per-document/--seed/--validation, or use another "
            "--out",
        )


def _describe(record: Mapping[str, Any]) -> str:
    shown = {key: value for key, value in record.items() if value is not None}
    return ", ".join(f"{key}={value}" for key, value in shown.items()) or "every chunk"
