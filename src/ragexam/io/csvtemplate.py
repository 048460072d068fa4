"""CSV lines of rows alike but for a few cells: the rest encoded once, by the csv writer.

A million rows of one kind (the judge's commonest) differ in six or seven of their 29 cells.
Their line is the template's constant text with those cells put in, each quoted as the csv
writer quotes a field: a field is quoted, its quotes doubled, when it holds a character the
writer quotes for. Which characters those are is asked of the writer itself, and the
template is checked against it on probes of every one of them; where it disagrees (another
Python's writer), every line is the writer's own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ragexam.io.csvfile import RowEncoder

_MARK = "\ue000{}\ue001"  # a placeholder the writer writes as it is (no character it quotes for)
_PROBES = [chr(code) for code in range(128)] + ["\u2028", "\x85", "é", "€", "😀"]


class LineTemplate:
    """The CSV line of a row from its varying cells, the others as the template has them."""

    def __init__(self, cells: Sequence[str], varying: Sequence[int]) -> None:
        self._encoder = RowEncoder()
        self._cells, self._varying = list(cells), tuple(varying)
        marked = list(cells)
        for number, at in enumerate(varying):
            marked[at] = _MARK.format(number)
        line = self._encoder.line(marked)
        self._segments = re.split("\ue000[0-9]+\ue001", line)
        quoted = "".join(c for c in _PROBES if self._encoder.line([c, ""])[:1] == '"')
        self._quoted = re.compile(f"[{re.escape(quoted)}]") if quoted else None
        exact = len(self._segments) == len(varying) + 1 and all(
            self._filled(probe) == self._written(probe) for probe in self._probes()
        )
        self.line = self._filled if exact else self._written
        """The row's line, with these cells (formatted) at the varying places."""

    def _filled(self, values: Sequence[str]) -> str:
        """The line as the template fills it."""
        segments, quoted = self._segments, self._quoted
        parts = [segments[0]]
        for value, segment in zip(values, segments[1:], strict=True):
            if quoted is not None and quoted.search(value):
                value = '"' + value.replace('"', '""') + '"'
            parts += (value, segment)
        return "".join(parts)

    def _written(self, values: Sequence[str]) -> str:
        """The line as the csv writer writes it."""
        cells = list(self._cells)
        for at, value in zip(self._varying, values, strict=True):
            cells[at] = value
        return self._encoder.line(cells)

    def _probes(self) -> list[list[str]]:
        """Varying cells of every character alone, in text, doubled, and empty."""
        count = len(self._varying)
        texts = [*_PROBES, *(f"a{c}b{c}" for c in _PROBES), "", ' "quoted", ', "a\r\nb"]
        return [
            [texts[(first + at) % len(texts)] for at in range(count)] for first in range(len(texts))
        ]
