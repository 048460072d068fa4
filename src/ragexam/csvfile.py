"""CSV files as durable row logs: formula-safe cells, flushed appends, torn-tail repair."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import IO, Any

from ragexam.errors import InputFileError, OutputFileError

# A cell starting with one of these is run as a formula by spreadsheets (OWASP CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def escape_cell(text: str) -> str:
    """Prefix a formula-like cell with an apostrophe; reversible by `unescape_cell`.

    A cell already made of apostrophes before a formula character gets one more, so that
    unescaping always removes exactly the apostrophe that escaping added.
    """
    return "'" + text if text.lstrip("'").startswith(FORMULA_START) else text


def unescape_cell(text: str) -> str:
    """Undo `escape_cell`."""
    if text.startswith("'") and text.lstrip("'").startswith(FORMULA_START):
        return text[1:]
    return text


def format_cell(value: Any) -> str:
    """A CSV cell for a plain value: None is empty, bools are lower-case, text is escaped."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return escape_cell(str(value))


def _encode(values: Iterable[str]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _records(data: bytes) -> Iterator[tuple[list[str], int]]:
    """Yield each complete CSV record with the byte offset just past it.

    Stops at the first torn record: one cut mid-line, mid-quote or mid-character.
    """
    lines = data.split(b"\n")[:-1]  # what follows the last newline is torn or empty
    ends = list(accumulate(len(line) + 1 for line in lines))
    reader = csv.reader((line.decode("utf-8") + "\n" for line in lines), strict=True)
    try:
        for record in reader:
            yield record, ends[reader.line_num - 1]
    except (csv.Error, UnicodeDecodeError):
        return


class RowLog:
    """An append-only CSV of result rows that survives being killed at any byte."""

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.path = path
        self.columns = list(columns)
        self._file: IO[str] | None = None

    def load(self) -> list[dict[str, str]]:
        """Read the rows already written, cutting off a torn last record."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        rows, good = [], 0
        for number, (record, end) in enumerate(_records(data)):
            if number == 0:
                self._check_header(record)
            elif len(record) != len(self.columns):
                break
            else:
                rows.append(dict(zip(self.columns, map(unescape_cell, record), strict=True)))
            good = end
        if good < len(data):
            with self.path.open("r+b") as handle:
                handle.truncate(good)
        return rows

    def _check_header(self, header: list[str]) -> None:
        if header != self.columns:
            raise OutputFileError(
                self.path,
                "exists with other columns than this version writes; "
                "move it away or choose another --out",
            )

    def rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the file atomically with a header and these rows."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("w", encoding="utf-8", newline="") as handle:
            handle.write(_encode(self.columns))
            for row in rows:
                handle.write(self._line(row))
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(self.path)

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row and flush it to the OS, so a killed process keeps it."""
        if self._file is None:
            if not self.path.exists() or self.path.stat().st_size == 0:
                self.rewrite([])
            self._file = self.path.open("a", encoding="utf-8", newline="")
        self._file.write(self._line(row))
        self._file.flush()

    def _line(self, row: Mapping[str, Any]) -> str:
        return _encode(format_cell(row.get(column)) for column in self.columns)

    def close(self) -> None:
        """Flush to disk and close."""
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


def read_rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    """Read an input CSV written by ragexam or by hand; it must hold the `required` columns."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            missing = [name for name in required if name not in columns]
            if missing:
                raise InputFileError(path, f"lacks the column(s) {', '.join(missing)}")
            return [
                {key: unescape_cell(value or "") for key, value in row.items() if key}
                for row in reader
            ]
    except FileNotFoundError:
        raise InputFileError(path, "not found; run the stage that writes it first") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputFileError(path, f"is not a readable UTF-8 CSV ({exc})") from None
