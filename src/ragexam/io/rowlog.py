"""Output CSVs as durable row logs: flushed appends, torn-tail repair, bad rows quarantined."""

from __future__ import annotations

import codecs
import os
from array import array
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ragexam.errors import OutputFileError
from ragexam.io.atomic import atomic_file, write_error
from ragexam.io.csvfile import Record, RowEncoder, counted, encode_row, records_in, unescape_cell

HELD_BYTES = 1 << 18  # rows held (RowLog.hold) are written at the latest at this size


class RowLog:
    """An append-only CSV of result rows that survives being killed at any byte."""

    def __init__(self, path: Path, columns: Sequence[str], required: Sequence[str] = ()) -> None:
        self.path = path
        self.columns = list(columns)
        # columns an existing file must have: the rows' values. Others an older version did
        # not write are read empty; these, read empty, would be `ok` rows with no value.
        self.required = tuple(required)
        self.quarantined = 0  # unreadable rows moved to FILE.bad-rows by the last load
        self._fd: int | None = None
        self._spans: array[int] | None = None  # start and end of each row the last load read
        self._encoder = RowEncoder()
        self._held: list[bytes] | None = None  # rows not yet written, while rows are held
        self._held_bytes = 0

    @property
    def bad_rows_path(self) -> Path:
        """Where unreadable rows go, with their line numbers."""
        return self.path.with_name(self.path.name + ".bad-rows")

    def load(self, columns: Sequence[str] | None = None) -> list[dict[str, str]]:
        """Read the rows already written; cut a torn tail, move unreadable rows aside.

        Rows from an older version that lacked some columns are read with those empty. With
        `columns`, an `ok` row keeps only those (other rows stay whole): a large file then
        takes a fraction of the memory, and `keep` rewrites it from the file itself.
        """
        rows = self._rows()  # one at a time
        if columns is None:
            return list(rows)
        return [
            row if row.get("status") != "ok" else {c: row[c] for c in columns if c in row}
            for row in rows
        ]

    def keep(self, positions: set[int]) -> None:
        """Rewrite the file with only its rows at these positions (0 is the first after the
        header), as the last `load` read it: their bytes as they are, never all rows at once."""
        if self._spans is None:  # the file was not read as it stands: read it again
            rows = enumerate(self._rows())
            self.rewrite(row for position, row in rows if position in positions)
            return
        runs: list[list[int]] = []  # byte ranges to copy, neighbours joined
        for position in sorted(positions):
            start, end = self._spans[2 * position], self._spans[2 * position + 1]
            if runs and runs[-1][1] == start:
                runs[-1][1] = end
            else:
                runs.append([start, end])
        with self.path.open("rb") as source, atomic_file(self.path) as handle:
            handle.write(encode_row(self.columns))
            text = codecs.getincrementaldecoder("utf-8")()  # a chunk may end mid-character
            for start, end in runs:
                source.seek(start)
                while start < end:
                    chunk = source.read(min(end - start, 1 << 20))
                    start += len(chunk)
                    handle.write(text.decode(chunk))

    def _rows(self) -> Iterator[dict[str, str]]:
        """The readable rows; once they are out, a torn tail is cut and unreadable rows are
        moved aside (the file rewritten in a second pass, as when its header is older)."""
        self._spans = None
        if self.path.is_dir():
            raise OutputFileError(self.path, "is a folder, not a CSV file; move it away")
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            bom = len(codecs.BOM_UTF8) if handle.read(3) == codecs.BOM_UTF8 else 0
            handle.seek(bom)
            records = records_in(handle)
            header = next(records, None)
            if header is None:
                return
            self._check_header(header.fields)
            bad: list[Record] = []
            self._spans = array("Q")
            torn = yield from self._readable(records, header.fields, bad, bom)
            self._quarantine(handle, bom, bad)
            if bad or header.fields != self.columns:
                handle.seek(bom)
                again = records_in(handle)
                next(again)
                self._spans = None
                self.rewrite(self._readable(again, header.fields, []))
                return
        if bom + torn < self.path.stat().st_size:  # cut in place: the rows above keep their bytes
            with self.path.open("r+b") as handle:
                handle.truncate(bom + torn)

    def _readable(
        self,
        records: Generator[Record, None, int],
        header: list[str],
        bad: list[Record],
        bom: int | None = None,
    ) -> Generator[dict[str, str], None, int]:
        """The rows of the readable records, the others put in `bad`; returns the torn offset.

        With `bom` (the offset of the records' bytes), each row's byte span is kept for `keep`.
        """
        while True:
            try:
                record = counted(next(records), len(header))
            except StopIteration as stop:
                return int(stop.value)
            if record.problem is not None:
                bad.append(record)
                continue
            if bom is not None and self._spans is not None:
                self._spans.extend((bom + record.start, bom + record.end))
            cells = dict(zip(header, map(unescape_cell, record.fields), strict=True))
            yield {column: cells.get(column, "") for column in self.columns}

    def _check_header(self, header: list[str]) -> None:
        unknown = [name for name in header if name not in self.columns]
        if unknown or not header or header[0] != self.columns[0]:
            raise OutputFileError(
                self.path,
                "exists with other columns than this version writes; "
                "move it away or choose another --out",
            )
        lacking = [name for name in self.required if name not in header]
        if lacking:  # an edit took them out: resumed, its ok rows would have no value
            raise OutputFileError(
                self.path,
                f"line 1: lacks the column(s) {', '.join(lacking)}, which hold its rows' "
                "values; put them back, or move the file away to make it again",
            )

    def _quarantine(self, source: IO[bytes], offset: int, bad: list[Record]) -> None:
        """Append unreadable rows, each under a line naming its line number and problem."""
        self.quarantined = len(bad)
        if not bad:
            return
        with self.bad_rows_path.open("ab") as handle:
            for record in bad:
                handle.write(f"# line {record.line}: {record.problem}\n".encode())
                source.seek(offset + record.start)
                handle.write(source.read(record.end - record.start))
            handle.flush()
            os.fsync(handle.fileno())

    def rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the file atomically with a header and these rows."""
        with atomic_file(self.path) as handle:
            handle.write(encode_row(self.columns))
            for row in rows:
                handle.write(self._line(row))

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row straight to the OS, so a killed process keeps it (while rows are
        held, `flush` writes it).

        A write that fails (disk full) is cut back to the end of the last whole row, and
        raises OutputFileError: the file never keeps half a row.
        """
        self.append_line(self._line(row).encode("utf-8"))

    def append_line(self, data: bytes) -> None:
        """`append`, of a row already encoded as its CSV line in this file's columns."""
        if self._held is None:
            self._write(data)
            return
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= HELD_BYTES:
            self.flush()

    def append_lines(self, lines: Sequence[bytes]) -> None:
        """`append_line`, of many rows at once."""
        if self._held is None:
            self._write(b"".join(lines))
            return
        self._held += lines
        self._held_bytes += sum(map(len, lines))
        if self._held_bytes >= HELD_BYTES:
            self.flush()

    def hold(self) -> None:
        """Keep rows in memory until `flush`, or HELD_BYTES of them: one write for thousands
        of rows, for a caller that can make again any row a kill loses (the batch road, whose
        results stay on disk until it records them merged, after a durable flush)."""
        if self._held is None:
            self._held, self._held_bytes = [], 0

    def flush(self, durable: bool = False) -> None:
        """Write the rows held (and with `durable`, make sure they are on disk)."""
        if self._held:
            data = b"".join(self._held)
            self._held, self._held_bytes = [], 0
            self._write(data)
        if durable and self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise write_error(self.path, exc) from None

    def _write(self, data: bytes) -> None:
        """Write whole rows at the end of the file, or none of them."""
        if self._fd is None:
            if not self.path.exists() or self.path.stat().st_size == 0:
                self.rewrite([])
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except OSError as exc:  # a file made read-only, in a folder that is not
                raise write_error(self.path, exc) from None
        view, written = memoryview(data), 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except OSError as exc:  # cut back what these rows wrote; shrinking needs no room
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            advice = "; make room and rerun the same command, every finished row is kept"
            raise write_error(self.path, exc, advice) from None

    def _line(self, row: Mapping[str, Any]) -> str:
        return self._encoder.row(row, self.columns)

    def close(self) -> None:
        """Flush to disk and close."""
        try:
            self.flush()
        finally:
            self._held = None
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
