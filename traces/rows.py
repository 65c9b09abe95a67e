"""Row-level parsing shared by the loaders: field parsers that record problems with file, line
and field, and `TraceBuilder`, which orders accepted rows into a `Trace` or raises.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.text_files import open_text
from traces.problems import TraceFormatError, TraceProblem
from traces.schema import DEFAULT_HASH_BLOCK_TOKENS, Trace, TraceRequest

OnError = Literal["raise", "skip"]
ON_ERROR_CHOICES: tuple[str, ...] = ("raise", "skip")
_ID_SEPARATORS = re.compile(r"[;\s]+")
_SCHEMA_FIELD = re.compile(r"TraceRequest\.(\w+)")


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")


@dataclass(slots=True)
class ParsedRow:
    """A row that parsed cleanly; `arrival_raw` is in the source's unit (see `TraceBuilder`)."""

    line: int
    arrival_raw: float
    prompt_tokens: int
    output_tokens: int
    request_id: str | None = None
    num_samples: int = 1
    prompt_token_ids: tuple[int, ...] | None = None
    prefix_hash_ids: tuple[int, ...] | None = None
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
    priority: int = 0


class RowParser:
    """Parses one field at a time; on failure records a `TraceProblem` and returns None."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[TraceProblem] = []
        self.deliberate_skips: list[TraceProblem] = []
        self.bad_lines: set[int] = set()

    def problem(self, line: int, field: str, message: str) -> None:
        """Record malformed input: it fails the load unless `on_error="skip"`."""
        self.problems.append(TraceProblem(self.path, line, field, message))
        self.bad_lines.add(line)

    def skip(self, line: int, field: str, message: str) -> None:
        """Record a well-formed row left out by an option the caller chose (never an error)."""
        self.deliberate_skips.append(TraceProblem(self.path, line, field, message))
        self.bad_lines.add(line)

    def integer(self, text: str, line: int, field: str, minimum: int | None = 1) -> int | None:
        """An int >= minimum (any int where minimum is None); integral floats such as `12.0`
        are accepted."""
        text = text.strip()
        try:
            value = int(text)
        except ValueError:
            number = self.real(text, line, field, minimum=None)
            if number is None:
                return None
            if not number.is_integer():
                self.problem(line, field, f"expected an integer, got {text!r}")
                return None
            value = int(number)
        if minimum is not None and value < minimum:
            self.problem(line, field, f"must be >= {minimum}, got {value}")
            return None
        return value

    def real(self, text: str, line: int, field: str, minimum: float | None = 0.0) -> float | None:
        """A finite float (>= minimum unless minimum is None)."""
        text = text.strip()
        if not text:
            self.problem(line, field, "missing value")
            return None
        try:
            value = float(text)
        except ValueError:
            self.problem(line, field, f"not a number: {text!r}")
            return None
        if not math.isfinite(value):
            self.problem(line, field, f"must be finite, got {text!r}")
            return None
        if minimum is not None and value < minimum:
            self.problem(line, field, f"must be >= {minimum:g}, got {text!r}")
            return None
        return value

    def id_list(self, text: str, line: int, field: str) -> tuple[int, ...] | None:
        """Space- or `;`-separated ints; an empty field means "not given" (None)."""
        parts = [part for part in _ID_SEPARATORS.split(text.strip()) if part]
        try:
            return tuple(int(part) for part in parts) if parts else None
        except ValueError:
            self.problem(line, field, f"expected space- or ';'-separated ints, got {text[:40]!r}")
            return None


def read_csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """Yield (1-based line number, cells) for each CSV row, header first; blank lines are
    skipped (a line of empty fields such as `,,` is a row, and gets reported)."""
    with open_text(path, "CSV file", newline="") as handle:
        reader = csv.reader(handle)
        for cells in reader:
            if len(cells) > 1 or (cells and cells[0].strip()):
                yield reader.line_num, cells


def column_index(
    path: str, header: list[str], required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, int]:
    """Map column name to position; a missing required column is fatal (line 1)."""
    names = [name.strip() for name in header]
    missing = [name for name in required if name not in names]
    if missing:
        problems = [
            TraceProblem(path, 1, name, f"missing required column (header has {names})")
            for name in missing
        ]
        raise TraceFormatError(path, problems)
    return {name: names.index(name) for name in (*required, *optional) if name in names}


def cell(cells: list[str], index: dict[str, int], name: str) -> str | None:
    """The named cell of a row, or None when the column is absent or the row is short."""
    position = index.get(name)
    if position is None or position >= len(cells):
        return None
    return cells[position]


def _by_line(problem: TraceProblem) -> int:
    return problem.line


def _raw_text(value: float) -> str:
    """A raw time as the file wrote it (integers without a decimal point)."""
    if isinstance(value, int) or (value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(value)


class TraceBuilder:
    """Turns parsed rows into requests in file order, rejecting rows that go back in time,
    duplicate ids and rows the schema refuses; `build` returns the `Trace` or raises.

    `time_divisor` converts `arrival_raw` to seconds (1000 for milliseconds); times are shifted
    so the first accepted row arrives at 0.0. A row without an id gets its 0-based data-row
    index, counting bad rows too, so ids do not move when rows are skipped.
    """

    def __init__(
        self, parser: RowParser, time_field: str, on_error: str, time_divisor: float = 1.0
    ) -> None:
        check_on_error(on_error)
        self.parser = parser
        self.time_field = time_field
        self.on_error = on_error
        self.time_divisor = time_divisor
        self.requests: list[TraceRequest] = []
        self.notes: list[str] = []
        self.num_rows_seen = 0
        self.first_raw: float | None = None
        self._last_raw = -math.inf
        self._last_line = 0
        self._ids: set[str] = set()

    def add(self, row: ParsedRow | None, line: int) -> None:
        """Accept a parsed row (None: the parser already recorded its problems)."""
        row_idx = self.num_rows_seen
        self.num_rows_seen += 1
        if row is None or line in self.parser.bad_lines:
            return
        if row.arrival_raw < self._last_raw:
            # In the file's own units, against the line it is compared with.
            self.parser.problem(
                line,
                self.time_field,
                f"timestamp goes backwards: {_raw_text(row.arrival_raw)} is before "
                f"{_raw_text(self._last_raw)} on line {self._last_line} (rows must be sorted "
                "by time)",
            )
            return
        request_id = row.request_id if row.request_id is not None else str(row_idx)
        if request_id in self._ids:
            self.parser.problem(line, "request_id", f"duplicate request_id {request_id!r}")
            return
        first = row.arrival_raw if self.first_raw is None else self.first_raw
        try:
            request = TraceRequest(
                request_id=request_id,
                arrival_s=(row.arrival_raw - first) / self.time_divisor,
                prompt_tokens=row.prompt_tokens,
                output_tokens=row.output_tokens,
                num_samples=row.num_samples,
                prompt_token_ids=row.prompt_token_ids,
                prefix_hash_ids=row.prefix_hash_ids,
                hash_block_tokens=row.hash_block_tokens,
                priority=row.priority,
            )
        except ValueError as error:
            match = _SCHEMA_FIELD.match(str(error))
            self.parser.problem(line, match.group(1) if match else "row", str(error))
            return
        self.first_raw = first
        self._last_raw = row.arrival_raw
        self._last_line = line
        self._ids.add(request_id)
        self.requests.append(request)

    def build(self, name: str, fmt: str, offset_s: float = 0.0) -> Trace:
        """The trace; raises `TraceFormatError` on problems (unless skipping) or no rows.

        `offset_s` is added to the first raw time to give `Trace.arrival_offset_s`.
        """
        path = self.parser.path
        problems = self.parser.problems
        if problems and self.on_error == "raise":
            raise TraceFormatError(path, problems)
        everything = sorted([*problems, *self.parser.deliberate_skips], key=_by_line)
        if not self.requests:
            what = "no data rows" if not self.num_rows_seen else "no usable rows"
            raise TraceFormatError(path, everything, f"trace file {path} has {what}")
        first_raw = self.first_raw if self.first_raw is not None else 0.0
        return Trace(
            name=name,
            requests=tuple(self.requests),
            source=path,
            format=fmt,
            num_skipped=len(self.parser.bad_lines),
            problems=tuple(everything),
            arrival_offset_s=offset_s + first_raw / self.time_divisor,
            notes=tuple(self.notes),
        )
