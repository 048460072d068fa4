"""CSV files: formula-safe cells, records read tolerantly, input files checked line by line."""

from __future__ import annotations

import codecs
import csv
import io
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any

from ragexam.errors import InputFileError

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
    kind = type(value)  # the common types first, by identity: 22 cells a row, a million rows
    if kind is str:
        return escape_cell(value) if value[:1] in _FIRST else value
    if value is None:
        return ""
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is float or isinstance(value, int | float):
        return repr(value)
    return escape_cell(str(value))


_FIRST = frozenset(["'", *FORMULA_START])  # a text cell that may need escaping starts so


def encode_row(values: Sequence[str]) -> str:
    """One CSV line of these cells."""
    return RowEncoder().line(values)


class RowEncoder:
    """CSV lines of rows, one at a time, through one writer (~1 µs a row less than a new one).

    The writer ends lines with "\n" and quotes the cells that hold one, but not a cell that
    holds a lone "\r", which every reader (Python's, pandas', a spreadsheet) takes for the
    end of the line: such a row is written by a writer whose line end holds both, so it
    quotes them too, and ended with "\n" like the others.
    """

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer, lineterminator="\n")
        self._quoting_cr = csv.writer(self._buffer, lineterminator="\r\n")

    def line(self, values: Sequence[str]) -> str:
        """One CSV line of these cells."""
        self._buffer.seek(0)
        self._buffer.truncate()
        self._writer.writerow(values)
        line = self._buffer.getvalue()
        if "\r" not in line:
            return line
        self._buffer.seek(0)
        self._buffer.truncate()
        self._quoting_cr.writerow(values)
        return self._buffer.getvalue()[:-2] + "\n"

    def row(self, row: Mapping[str, Any], columns: Sequence[str]) -> str:
        """The CSV line of a row's plain values, in these columns (a missing one is empty)."""
        get, first = row.get, _FIRST  # a plain text or empty cell needs no call: most of them
        return self.line(
            [
                "" if (v := get(c)) is None else v if type(v) is str and v[:1] not in first
                else format_cell(v)
                for c in columns
            ]
        )  # fmt: skip


@dataclass(frozen=True)
class Record:
    """One CSV record: its fields, first line (1-based), byte span, and why it is unreadable."""

    fields: list[str]
    line: int
    start: int
    end: int
    problem: str | None = None


def scan(data: bytes) -> tuple[list[Record], int]:
    """Every non-blank record of a CSV, readable or not, and the offset of a torn tail."""
    records: list[Record] = []
    torn = _drain(records, records_in(io.BytesIO(data)))
    return records, torn


def _drain(items: list[Any], source: Generator[Any, None, int]) -> int:
    """Append what `source` yields to `items`; what it returns."""
    while True:
        try:
            items.append(next(source))
        except StopIteration as stop:
            return int(stop.value)


def records_in(source: Iterator[bytes]) -> Generator[Record, None, int]:
    """scan, one record at a time from a binary file's lines: returns the offset of a torn
    tail once every record is out.

    A torn tail is what follows the last newline, or a quoted field still open at the end of
    the file: what a crash leaves mid-write. Undecodable bytes make their record unreadable,
    never the records after it.
    """
    handed, last = [0], [False]  # bytes handed to the csv reader: it reads no line ahead

    def lines() -> Iterator[str]:
        line = next(source, b"")
        while line.endswith(b"\n"):  # what follows the last newline is torn or empty
            following = next(source, b"")
            handed[0], last[0] = handed[0] + len(line), not following.endswith(b"\n")
            yield line.decode("utf-8", "surrogateescape")
            line = following

    reader = csv.reader(lines(), strict=True)
    while True:
        first, start = reader.line_num + 1, handed[0]
        try:
            fields, problem = next(reader), None
        except StopIteration:
            return handed[0]
        except csv.Error as exc:
            if last[0]:  # an open quote ran to the end: a torn tail
                return start
            fields, problem = [], f"is not valid CSV ({exc})"
        if fields or problem:
            yield Record(fields, first, start, handed[0], problem or _undecodable(fields))


def counted(record: Record, fields: int) -> Record:
    """The record, marked unreadable when it has another number of fields than the header."""
    if record.problem is None and len(record.fields) != fields:
        problem = f"has {len(record.fields)} fields where the header has {fields}"
        return replace(record, problem=problem)
    return record


def _undecodable(fields: list[str]) -> str | None:
    try:
        "".join(fields).encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text (save the file as UTF-8)"
    return None


def header_of(path: Path) -> list[str]:
    """The column names of a CSV file, [] when it is not there or empty (unreadable: what
    reading its rows says)."""
    try:
        with path.open("rb") as handle:
            if handle.read(3) != codecs.BOM_UTF8:
                handle.seek(0)
            header = next(records_in(handle), None)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    return [] if header is None or header.problem else header.fields


def read_rows(
    path: Path, required: Sequence[str], key: str | None = None, filled: Sequence[str] = ()
) -> list[dict[str, str]]:
    """Read an input CSV written by ragexam or by hand; it must hold the `required` columns.

    Any unreadable record (not UTF-8, broken quoting, too few or too many fields), a `key`
    seen twice, or an `ok` row with an empty `filled` column is a one-line error naming the
    file and the line.
    """
    data = _input(path)
    columns = _valid_columns(data, required, key, filled)
    if columns is None:
        return _checked_file(path, data, required, key, filled)
    names = list(columns)
    return [dict(zip(names, cells, strict=True)) for cells in zip(*columns.values(), strict=True)]


def read_columns(
    path: Path,
    required: Sequence[str],
    key: str | None = None,
    filled: Sequence[str] = (),
    optional: Sequence[str] | None = None,
) -> dict[str, Sequence[str]]:
    """read_rows as one sequence of cells per column: a large file's rows need no dicts.

    With `optional`, only the required and filled columns and those of `optional` the file has
    are read (and `status`, which the filled check reads): a million rows' other cells are
    never held.
    """
    data = _input(path)
    columns = _valid_columns(data, required, key, filled, optional)
    if columns is not None:
        return columns
    rows = _checked_file(path, data, required, key, filled)
    names = rows[0] if rows else required
    kept = [name for name in names if _kept(name, (*required, *filled), optional)]
    return {name: [row[name] for row in rows] for name in kept}


def _kept(name: str, required: Sequence[str], optional: Sequence[str] | None) -> bool:
    return optional is None or name in required or name in optional or name == "status"


def _valid_columns(
    data: bytes,
    required: Sequence[str],
    key: str | None,
    filled: Sequence[str],
    optional: Sequence[str] | None = None,
) -> dict[str, Sequence[str]] | None:
    """The kept columns of a file with no problem at all, read in one pass of the csv module
    (3-4x faster than record by record) that keeps only their cells; None at the first doubt,
    for _checked_file to name it."""
    try:
        text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="")  # not copied
        reader = csv.reader(text, strict=True)
        header = next((record for record in reader if record), [])
        if not header or "" in header or any(name not in header for name in required):
            return None
        where = {name: at for at, name in enumerate(header)}  # a repeated name: its last
        kept = [name for name in where if _kept(name, (*required, *filled), optional)]
        if not kept:
            return None  # nothing to keep: the careful reading says what the file holds
        pick = itemgetter(*(where[name] for name in kept))
        width, rows = len(header), []
        for record in reader:
            if len(record) == width:
                rows.append(pick(record) if len(kept) > 1 else (pick(record),))
            elif record:
                return None  # more or fewer fields than the header
    except (UnicodeDecodeError, csv.Error):
        return None
    if _may_start_with_apostrophe(data):  # else no cell is escaped: none to look at
        escaped = methodcaller("startswith", "'")  # few cells are: unescape only their rows
        rows = [tuple(map(unescape_cell, r)) if any(map(escaped, r)) else r for r in rows]
    columns: dict[str, Sequence[str]] = dict.fromkeys(kept, ())
    if rows:
        columns = dict(zip(kept, zip(*rows, strict=True), strict=True))
    if key is not None and len(set(columns[key])) != len(rows):
        return None
    if not _all_filled(columns, [name for name in filled if name in columns]):
        return None
    return columns


def _input(path: Path) -> bytes:
    """An input file's bytes, without a byte-order mark and ending with a newline."""
    try:
        data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    except FileNotFoundError:
        raise InputFileError(path, "not found; run the stage that writes it first") from None
    except IsADirectoryError:
        raise InputFileError(path, "is a folder, not a CSV file; pass the file's path") from None
    except OSError as exc:
        raise InputFileError(path, f"cannot be read ({exc.strerror})") from None
    if data and not data.endswith(b"\n"):
        data += b"\n"  # a hand-made file may lack the last newline; its last line still counts
    return data


def _checked_file(
    path: Path, data: bytes, required: Sequence[str], key: str | None, filled: Sequence[str]
) -> list[dict[str, str]]:
    """read_rows record by record, to name the line of the first problem."""
    records, torn = scan(data)
    if torn < len(data):
        raise InputFileError(
            path, "ends inside a quoted field: a quote is not closed", _line(data, torn)
        )
    if not records:
        raise InputFileError(path, f"is empty; it needs the column(s) {', '.join(required)}")
    header = records[0]
    missing = [name for name in required if name not in header.fields]
    if header.problem or missing:
        raise InputFileError(path, header.problem or f"lacks the column(s) {', '.join(missing)}", 1)
    rows = _checked_rows(path, header.fields, records[1:], key)
    for row, record in zip(rows, records[1:], strict=True):
        empty = [name for name in filled if name in row and not row[name].strip()]
        if empty and row.get("status", "ok") in ("ok", ""):
            raise InputFileError(path, f"the {empty[0]} is empty", record.line)
    return rows


def _may_start_with_apostrophe(data: bytes) -> bool:
    """Whether a cell may start with an apostrophe: a cell starts the file, or follows a comma,
    a line ending or its opening quote."""
    marks = (b",'", b"\n'", b"\r'", b"\"'")
    return b"'" in data and (data.startswith(b"'") or any(mark in data for mark in marks))


def _all_filled(columns: Mapping[str, Sequence[str]], filled: list[str]) -> bool:
    """Whether every `ok` row (every row, without a status column) has text in `filled`."""
    if all(all(map(str.strip, columns[name])) for name in filled):
        return True  # the common case, column by column; else only ok rows count
    statuses = columns.get("status") or ["ok"] * len(columns[filled[0]])
    return all(
        status not in ("ok", "") or all(columns[name][i].strip() for name in filled)
        for i, status in enumerate(statuses)
    )


def _checked_rows(
    path: Path, columns: list[str], records: list[Record], key: str | None
) -> list[dict[str, str]]:
    rows, seen = [], set()
    for record in records:
        record = counted(record, len(columns))
        if record.problem is not None:
            raise InputFileError(path, record.problem, record.line)
        row = {
            name: unescape_cell(value)
            for name, value in zip(columns, record.fields, strict=True)
            if name
        }
        if key is not None:
            if row[key] in seen:
                raise InputFileError(path, f"{key} {row[key]!r} appears twice", record.line)
            seen.add(row[key])
        rows.append(row)
    return rows


def _line(data: bytes, offset: int) -> int:
    """The 1-based line at a byte offset."""
    return data.count(b"\n", 0, offset) + 1
