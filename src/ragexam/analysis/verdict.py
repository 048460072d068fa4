"""The judge's verdict on its known-answer controls, read back from judge_controls.csv.

The grades are checked against each kind's bounds again here, so the verdict follows the
bounds of this version; a control that ended in error is neither a pass nor a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragexam.analysis.controls import KINDS
from ragexam.errors import InputFileError
from ragexam.io.csvfile import read_rows
from ragexam.io.runfolder import RunFolder

TRUSTED_SHARE = 0.9  # below this share of passed controls, the judge is not to be trusted
WORST_FAILURES = 10


@dataclass(frozen=True)
class Failure:
    """A control that failed: its texts, grades, and the bounds it broke."""

    qa_id: str
    control: str
    question: str
    ground_truth: str
    answer: str
    completeness: float
    conciseness: float
    why: str
    distance: float


@dataclass(frozen=True)
class Verdict:
    """How the judge did on its controls: passes per kind, errors, and the worst failures."""

    passed: dict[str, int]
    graded: dict[str, int]
    errors: int
    failures: list[Failure] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Controls graded (error rows are neither passes nor failures)."""
        return sum(self.graded.values())

    @property
    def passed_total(self) -> int:
        """Controls that passed."""
        return sum(self.passed.values())

    @property
    def trusted(self) -> bool:
        """At least 90% of the graded controls passed (and at least one was graded)."""
        return self.total > 0 and self.passed_total >= TRUSTED_SHARE * self.total

    def columns(self) -> dict[str, int]:
        """The columns summary.csv gains."""
        columns = {
            "judge_controls_total": self.total,
            "judge_controls_passed": self.passed_total,
            "judge_controls_errors": self.errors,
        }
        for kind in KINDS:
            columns[f"controls_passed_{kind}"] = self.passed[kind]
            columns[f"controls_total_{kind}"] = self.graded[kind]
        return columns

    def failing_kinds(self) -> list[str]:
        """Kinds with fewer than 90% of their graded controls passed."""
        return [
            kind
            for kind in KINDS
            if self.graded[kind] and self.passed[kind] < TRUSTED_SHARE * self.graded[kind]
        ]

    def line(self) -> str:
        """One line: the verdict, naming each failing kind with its passes."""
        if self.total == 0:
            return (
                f"no judge control could be graded ({self.errors} errors); rerun `ragexam judge` "
                "to retry them"
            )
        share = f"{self.passed_total}/{self.total} judge controls passed"
        if self.trusted:
            return f"{share}: the judge grades known answers as expected"
        kinds = "; ".join(
            f"{KINDS[kind].failing}: {self.passed[kind]}/{self.graded[kind]} {kind} controls passed"
            for kind in self.failing_kinds()
        )
        return f"only {share}: {kinds}"

    def message(self) -> str:
        """The line the terminal shows: a warning when the judge is not to be trusted."""
        return self.line() if self.trusted else f"Warning: {self.line()}"


def read_verdict(out: Path) -> Verdict | None:
    """The verdict of OUT/judge_controls.csv, recomputed from its grades; None without the file."""
    path = RunFolder(out).controls
    if not path.exists():
        return None
    required = ("control", "completeness", "conciseness", "status")
    passed, graded = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)
    errors, failures = 0, []
    for line, row in enumerate(read_rows(path, required), start=2):
        kind = KINDS.get(row["control"])
        if kind is None:
            raise InputFileError(path, f"line {line}: unknown control {row['control']!r}")
        if row["status"] != "ok":
            errors += 1
            continue
        completeness = _grade(path, line, row, "completeness")
        conciseness = _grade(path, line, row, "conciseness")
        graded[row["control"]] += 1
        broken = kind.bounds.misses(completeness, conciseness)
        if not broken:
            passed[row["control"]] += 1
            continue
        failures.append(_failure(row, completeness, conciseness, broken))
    failures.sort(key=lambda failure: -failure.distance)
    return Verdict(passed, graded, errors, failures[:WORST_FAILURES])


def _grade(path: Path, line: int, row: Mapping[str, str], name: str) -> float:
    """A grade of an ok row, which must be a number in [0, 1]: a failure is never a score."""
    try:
        value = float(row[name])
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:
        raise InputFileError(
            path,
            f"line {line}: status ok but no {name} in [0, 1]; delete the row and rerun "
            "ragexam judge to grade it again",
        )
    return value


def _failure(
    row: Mapping[str, str], completeness: float, conciseness: float, broken: list[Any]
) -> Failure:
    return Failure(
        row.get("qa_id", ""),
        row["control"],
        row.get("question", ""),
        row.get("ground_truth_answer", ""),
        row.get("answer", ""),
        completeness,
        conciseness,
        "; ".join(text for text, _ in broken),
        max(distance for _, distance in broken),
    )
