"""Known-answer controls for the judge: answers whose right grades are known by construction.

`judge --controls N` samples N exam questions with the seed and grades eight control answers
for each (the kinds below: four known answers, and four injections, injections.py), through
the exam's prompt, model, scale, samples and runner, into judge_controls.csv. verdict.py reads
that file back for `stats`. Controls never enter a mean.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragexam.analysis.injections import INJECTIONS, injected
from ragexam.config import Scale
from ragexam.io.rowlog import RowLog

# The runner's key is control_id ("qa_id:kind"); these follow it, before the judge's columns,
# and `passed` follows the judge's grades (design.md's order).
CONTROL_COLUMNS = (
    "qa_id",
    "control",
    "document",
    "donor_qa_id",
    "question",
    "ground_truth_answer",
    "answer",
)
DONT_KNOW = "I don't know."
SLACK = 1e-9  # a mean of samples may land a hair off a bound it meets exactly
DRAWS = 64  # donors drawn at random before the pool is scanned for one


@dataclass(frozen=True)
class Bounds:
    """Where a control's grades must fall for it to pass; None is no bound."""

    completeness_min: float | None = None
    completeness_max: float | None = None
    conciseness_min: float | None = None
    conciseness_max: float | None = None

    def misses(self, completeness: float, conciseness: float) -> list[tuple[str, float]]:
        """Each bound the grades break, as ("conciseness 1.00 > 0.7", distance beyond it)."""
        checks = [
            ("completeness", completeness, self.completeness_min, self.completeness_max),
            ("conciseness", conciseness, self.conciseness_min, self.conciseness_max),
        ]
        broken = []
        for name, value, low, high in checks:
            if low is not None and value < low - SLACK:
                broken.append((f"{name} {value:.2f} < {low:g}", low - value))
            if high is not None and value > high + SLACK:
                broken.append((f"{name} {value:.2f} > {high:g}", value - high))
        return broken

    def passes(self, completeness: float, conciseness: float) -> bool:
        """True when the grades break no bound."""
        return not self.misses(completeness, conciseness)

    def text(self) -> str:
        """The bounds as the design states them: "completeness ≥ 0.8 and conciseness ≤ 0.7"."""
        parts = [
            f"{name} {sign} {value:g}"
            for name, sign, value in (
                ("completeness", "≥", self.completeness_min),
                ("completeness", "≤", self.completeness_max),
                ("conciseness", "≥", self.conciseness_min),
                ("conciseness", "≤", self.conciseness_max),
            )
            if value is not None
        ]
        return " and ".join(parts)


@dataclass(frozen=True)
class Kind:
    """One kind of control: what its answer is, its bounds, and what failing it says."""

    answer: str
    bounds: Bounds
    failing: str


KINDS: dict[str, Kind] = {
    "verbatim": Kind(
        "the ground truth itself",
        Bounds(completeness_min=0.8, conciseness_min=0.8),
        "the judge does not give the ground truth itself full marks",
    ),
    "dont_know": Kind(
        f'"{DONT_KNOW}"',
        Bounds(completeness_max=0.2),
        "the judge gives credit to an answer that says it does not know",
    ),
    "padded": Kind(
        "the ground truth, then the ground truth of a question from another document",
        Bounds(completeness_min=0.8, conciseness_max=0.7),
        "the judge does not penalise padding",
    ),
    "wrong": Kind(
        "the ground truth of a question from another document",
        Bounds(completeness_max=0.2),
        "the judge gives credit to a wrong answer",
    ),
    **{
        kind: Kind(answer, Bounds(completeness_max=0.2), f"the judge gives credit to {answer}")
        for kind, answer in INJECTIONS.items()
    },
}
KNOWN = ("verbatim", "dont_know", "padded", "wrong")  # the known answers; the rest are injections


@dataclass(frozen=True)
class Source:
    """An exam question a control can be built from."""

    qa_id: str
    document: str
    question: str
    ground_truth: str
    key_points: str | None = None  # the JSON cell, when the exam has key points


@dataclass(frozen=True)
class Control:
    """One control answer to grade, and the question it answers."""

    source: Source
    kind: str
    answer: str
    donor: str = ""

    @property
    def key(self) -> str:
        """The control's id in judge_controls.csv: qa_id and kind."""
        return f"{self.source.qa_id}:{self.kind}"

    def columns(self) -> dict[str, str]:
        """The columns known before grading."""
        return {
            "qa_id": self.source.qa_id,
            "control": self.kind,
            "document": self.source.document,
            "donor_qa_id": self.donor,
            "question": self.source.question,
            "ground_truth_answer": self.source.ground_truth,
            "answer": self.answer,
        }


def build_controls(
    sources: Sequence[Source], n: int, seed: int, scale: Scale = Scale.unit
) -> list[Control]:
    """Eight controls for each of n questions drawn with `seed` (a larger n keeps the first
    ones); an injection's fake verdict is in the reply format of `scale`."""
    pool = sorted(sources, key=lambda source: source.qa_id)
    drawn = pool.copy()
    random.Random(seed).shuffle(drawn)
    several = len({source.document for source in pool}) > 1
    controls = []
    for turn, source in enumerate(drawn[:n]):
        controls.append(Control(source, "verbatim", source.ground_truth))
        controls.append(Control(source, "dont_know", DONT_KNOW))
        donor = _donor(source, pool, several, seed)
        if donor is None:  # a single-question exam has nothing to pad with
            continue
        wrong, by = donor.ground_truth, donor.qa_id
        controls.append(Control(source, "padded", f"{source.ground_truth} {wrong}", by))
        controls.append(Control(source, "wrong", wrong, by))
        for kind in INJECTIONS:
            answer = injected(kind, wrong, turn, scale, source.key_points)
            controls.append(Control(source, kind, answer, by))
    return controls


def _donor(source: Source, pool: list[Source], several: bool, seed: int) -> Source | None:
    """Another document's question (another question's, with one document), drawn with the seed.

    Its ground truth is at least as long as the source's when the exam has one, so that the
    padding is at least half of the padded answer and a fair judge's conciseness falls to 0.7
    or below, as the padded control's bound expects.
    """

    def eligible(other: Source) -> bool:
        if several:
            return other.document != source.document
        return other.ground_truth != source.ground_truth

    rng, length = random.Random(f"{seed}:{source.qa_id}"), _words(source.ground_truth)
    for _ in range(DRAWS):  # a few draws find one in most exams, without scanning them
        other = rng.choice(pool)
        if eligible(other) and _words(other.ground_truth) >= length:
            return other
    candidates = [other for other in pool if eligible(other)]
    long_enough = [other for other in candidates if _words(other.ground_truth) >= length]
    if long_enough:
        return rng.choice(long_enough)
    return max(candidates, key=lambda other: _words(other.ground_truth), default=None)


def _words(text: str) -> int:
    return len(text.split())


def keep_planned(path: Path, columns: Sequence[str], controls: Sequence[Control]) -> None:
    """Drop rows this sample does not hold as they are (another seed or N, or edited texts)."""
    if not path.exists():
        return
    log = RowLog(path, columns)
    planned = {control.key: control.columns() for control in controls}
    rows = log.load()
    kept = [row for row in rows if _as_planned(row, planned.get(row["control_id"]))]
    if len(kept) < len(rows):
        log.rewrite(kept)


def _as_planned(row: Mapping[str, str], planned: Mapping[str, str] | None) -> bool:
    return planned is not None and all(row.get(name) == value for name, value in planned.items())
