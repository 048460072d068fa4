"""The batch road's bulk lane: the commonest row of a million, written in a tight loop.

The commonest judge row on the batch road has one result, for its first call, asked with the
body its values render now, a plain completion whose text is a JSON grade that validates. The
direct lane (replay.py's `Pass._opened`) reads it through the objects every road shares:
a `Known`, an `Answer`, a `Reply`, a `Sample`, a row of values and the runner's CSV encoder,
~40 µs a row. This lane reads the same result into the same CSV line in about half that:
the line is a template of the row's cells, learned from a row the direct lane wrote, with
only the cells that differ from row to row (the key, the grades, the input hash, the
tokens) put in.

Every step is the direct lane's own function, or a stricter one: a result it does not read
(another shape, a failure, a reply wrapped in prose, one that does not validate, retries,
samples) goes the direct lane's way, which reads it as before. A test holds the two lanes'
files byte for byte equal on the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from ragexam.io.batchfiles import plain_result
from ragexam.io.csvfile import format_cell
from ragexam.io.csvtemplate import LineTemplate
from ragexam.llm.client import LLM
from ragexam.llm.deferred import plain_completion
from ragexam.llm.structured import exact_json
from ragexam.stages.runner import RUN_COLUMNS, Encoded, Runner, Task

# The runner's cells of an ok row that differ from row to row: the rest are the stage's.
RUN_VARYING = ("input_hash", "prompt_tokens", "completion_tokens")
_CONSTANT_RUN = frozenset(RUN_COLUMNS) - set(RUN_VARYING)


@dataclass(frozen=True)
class Rows:
    """What a plan's commonest row is made of: the schema of its one reply, the columns the
    reply's value fills, and their values for a valid reply (each as the row records it)."""

    schema: type[BaseModel]
    columns: tuple[str, ...]
    values: Callable[[Any], tuple[Any, ...]]


@runtime_checkable
class Bulk(Protocol):
    """A plan whose commonest row the bulk lane can write (the judge's, on a scale)."""

    def bulk(self) -> Rows | None:
        """What its commonest row is made of; None: every row goes the direct lane."""
        ...


class Lane:
    """Writes the rows whose one result the lane reads; says False for every other row."""

    def __init__(self, rows: Rows, runner: Runner, llm: LLM, tag: str) -> None:
        self.rows, self.runner, self.llm, self.tag = rows, runner, llm, tag
        self.columns = runner.stage.all_columns()
        self._template: LineTemplate | None = None  # learned from a row the direct lane wrote
        self.written = 0

    def learn(self, row: dict[str, Any]) -> None:
        """Take the template from a row the direct lane wrote from its first result: every
        cell but the key, the reply's values and the runner's varying ones, as that row has
        it. They are the same for every row of the lane (a test holds them to it)."""
        if self._template is not None:
            return
        varying = (self.runner.stage.key, *self.rows.columns, *RUN_VARYING)
        if row.get("status") != "ok" or any(
            name not in self.columns for name in (*varying, *_CONSTANT_RUN)
        ):
            return
        cells = [format_cell(row.get(name)) for name in self.columns]
        self._template = LineTemplate(cells, [self.columns.index(name) for name in varying])

    @property
    def ready(self) -> bool:
        """Whether it has learned its line: it reads rows from now on."""
        return self._template is not None

    def line_of(self, task: Task, line: bytes, opening: Any) -> Encoded | None:
        """The row's CSV line and its tokens, read from its one result `line` as the direct
        lane would write the row; None when this lane does not read it (the direct lane
        does). It changes nothing: a forked child makes lines with it (forked.py)."""
        if self._template is None or opening is None:
            return None
        result = plain_result(line)
        rendered = self.llm.request_of(opening, body=False) if result is not None else None
        if result is None or rendered is None or not self.llm.reads_directly(rendered.url):
            return None
        identifier, body = result
        if identifier != f"{self.tag}~0~{rendered.digest}~{task.key}":
            return None  # another call's result, or asked with another body
        found = plain_completion(body)
        grade = _valid(self.rows.schema, found[0]) if found is not None else None
        if found is None or grade is None:
            return None
        _, prompt, completion = found
        hashed = task.late(task.payload)["input_hash"] if task.late else task.known["input_hash"]
        values = (task.key, *self.rows.values(grade), hashed, prompt, completion)
        line = self._template.line([format_cell(value) for value in values]).encode()
        return Encoded(line, prompt, completion)

    def write(self, task: Task, made: Encoded, fresh: bool) -> None:
        """Write the row's line, and count its reply as the direct lane counts one."""
        self.runner.settle(task, made)
        self.llm.booked_tokens(made.prompt_tokens, made.completion_tokens, fresh)
        self.written += 1

    def write_many(self, rows: Sequence[tuple[str, bytes, int, int, int]]) -> None:
        """`write`, of many rows made elsewhere (a forked child's): (key, line, prompt and
        completion tokens, fresh: 1 or 0) of each, written at once and counted in all."""
        prompt = completion = fresh_prompt = fresh_completion = calls = 0
        for _, _, prompt_tokens, completion_tokens, fresh in rows:
            prompt += prompt_tokens
            completion += completion_tokens
            if fresh:
                fresh_prompt += prompt_tokens
                fresh_completion += completion_tokens
                calls += 1
        keys, lines = [row[0] for row in rows], [row[1] for row in rows]
        self.runner.settle_lines(keys, lines, (prompt, completion))
        self.llm.booked_replies(fresh_prompt, fresh_completion, calls, len(rows))
        self.written += len(rows)


def _valid(schema: type[BaseModel], text: str) -> BaseModel | None:
    """The reply's value when its text is one JSON object that validates, else None."""
    data = exact_json(text)
    if data is None:
        return None
    try:
        return schema.model_validate(data)
    except ValidationError:
        return None
