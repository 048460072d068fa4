"""Rows packed before a fork (stages/packed.py): each is made again equal to what it was, with
the very `known` and `late` it shared, and rows that would not come back exactly do not pack."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest

from ragexam.llm.prompts import Delimited
from ragexam.stages import packed
from ragexam.stages.exams import Exam
from ragexam.stages.packed import Packed, split
from ragexam.stages.runner import Task

KNOWN: Mapping[str, Any] = {"model": "m"}


def late(exam: Exam) -> Mapping[str, str]:
    return {"input_hash": exam.qa_id}


def exams(n: int) -> list[Task]:
    """Exams whose texts hold what an encoding could lose: None, accents, emoji, a lone
    surrogate, a NUL, returns."""
    texts = [None, "", "é € 😀", "half \ud800 a character", "nul\x00byte", "a\r\nb", "x" * 5000]
    return [
        Task(
            f"q{i}",
            KNOWN,
            Exam(
                f"q{i}",
                texts[i % len(texts)],
                f"truth {i}",
                texts[(i + 3) % len(texts)] or "",
                key_points=None if i % 2 else '["a"]',
            ),
            late,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("group", [1, packed.GROUP])  # a group a chunk, or one for them all
def test_rows_come_back_equal_sharing_what_they_shared(
    monkeypatch: pytest.MonkeyPatch, group: int
) -> None:
    monkeypatch.setattr(packed, "ROWS", 7)
    monkeypatch.setattr(packed, "GROUP", group)
    tasks = exams(60)
    rows = Packed.of(tasks)
    assert rows is not None and rows.count == 60
    again = list(rows.rows())
    assert again == tasks
    assert all(type(row.payload) is Exam for row in again)
    assert all(row.known is KNOWN and row.late is late for row in again)
    assert list(rows.rows()) == []  # read once: each group let go as it is read


def test_a_dropped_pack_yields_nothing() -> None:
    rows = Packed.of(exams(10))
    assert rows is not None
    rows.drop()
    assert list(rows.rows()) == []


def other_known(tasks: list[Task]) -> list[Task]:
    return [tasks[0], tasks[1]._replace(known={"model": "m"}), *tasks[2:]]


def a_str_subclass(tasks: list[Task]) -> list[Task]:
    exam = tasks[3].payload._replace(answer=Delimited("<chunk>x</chunk>"))
    return [*tasks[:3], tasks[3]._replace(payload=exam), *tasks[4:]]


def not_a_tuple(tasks: list[Task]) -> list[Task]:
    return [task._replace(payload=dict(task.payload._asdict())) for task in tasks]


def an_object(tasks: list[Task]) -> list[Task]:
    return [*tasks[:-1], tasks[-1]._replace(payload=tasks[-1].payload._replace(context=object()))]


@pytest.mark.parametrize("change", [other_known, a_str_subclass, not_a_tuple, an_object])
def test_rows_that_would_not_come_back_exactly_do_not_pack(change: Any) -> None:
    """Another `known` than the first row's, a str subclass (marshal would make it a str),
    a payload that is no tuple, an object marshal cannot write."""
    assert Packed.of(change(exams(40))) is None


def test_split_takes_the_next_rows_in_parts_and_leaves_the_collector_as_it_was() -> None:
    import gc

    tasks = iter(exams(30))
    parts = split(tasks, [10, 15])
    assert [[t.key for t in part] for part, _ in parts] == [
        [f"q{i}" for i in range(10)],
        [f"q{i}" for i in range(10, 25)],
    ]
    assert all(pack is not None and list(pack.rows()) == part for part, pack in parts)
    assert next(tasks).key == "q25" and gc.isenabled()


class Blob(NamedTuple):
    qa_id: str
    data: bytes  # marshal would make a bytearray of it bytes


class Listed(NamedTuple):
    qa_id: str
    items: list[str] | None


Undeclared = namedtuple("Undeclared", ["qa_id", "data"])  # declares no type


@pytest.mark.parametrize(
    "payload",
    [Blob("q", b"x"), Listed("q", ["a"]), ("q", "a"), Undeclared("q", bytearray(b"x"))],
)
def test_payloads_whose_fields_are_not_declared_scalars_do_not_pack(payload: Any) -> None:
    """A field declared bytes, or a container; a plain tuple and a collections.namedtuple,
    which declare nothing (marshal would make the bytearray bytes)."""
    assert Packed.of([Task("q", KNOWN, payload, late)]) is None
