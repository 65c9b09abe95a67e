"""Trace loaders: our CSV, Vidur's processed CSV, Azure LLM inference CSV, Mooncake JSONL and
BurstGPT CSV, auto-detected from the first line by `load_trace`; plus `load_length_table`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from core.text_files import binary_message, open_text, trace_stem
from traces.problems import TraceFormatError, TraceProblem
from traces.rows import (
    ParsedRow,
    RowParser,
    TraceBuilder,
    cell,
    check_on_error,
    column_index,
    read_csv_rows,
)
from traces.schema import DEFAULT_HASH_BLOCK_TOKENS, LengthTable, Trace
from traces.timestamps import parse_timestamp_ns

RowFunction = Callable[[list[str], dict[str, int], int, RowParser], ParsedRow | None]

SERVESIM_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
SERVESIM_OPTIONAL = (
    "request_id",
    "num_samples",
    "prompt_token_ids",
    "prefix_hash_ids",
    "hash_block_tokens",
    "priority",
)
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
LENGTH_TABLE_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
BURSTGPT_FAILURE_CHOICES = ("skip", "error", "keep")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
# The columns that identify each CSV format when ``format="auto"``, in the order tried.
CSV_HEADERS = {
    "servesim": SERVESIM_REQUIRED,
    "azure": AZURE_COLUMNS,
    "vidur": VIDUR_COLUMNS,
    "burstgpt": BURSTGPT_COLUMNS,
}


def _text(cells: list[str], index: dict[str, int], name: str, line: int, parser: RowParser) -> str:
    """A required column's stripped text; "" after recording a problem when it is empty."""
    text = (cell(cells, index, name) or "").strip()
    if not text:
        parser.problem(line, name, "missing value")
    return text


def _check_width(header: list[str], cells: list[str], line: int, parser: RowParser) -> bool:
    """False (after recording the problem) when a row has more or fewer fields than the header;
    a short row blames the first column it lacks."""
    if len(cells) < len(header):
        missing = header[len(cells)].strip()
        parser.problem(
            line, missing, f"missing value: row has {len(cells)} of {len(header)} fields"
        )
        return False
    if len(cells) > len(header):
        parser.problem(line, "row", f"{len(cells)} fields but the header has {len(header)}")
        return False
    return True


def _tokens(
    cells: list[str], index: dict[str, int], name: str, line: int, parser: RowParser
) -> int:
    """A token count >= 1 from a required column; 0 on failure (the problem is recorded)."""
    text = _text(cells, index, name, line, parser)
    return (parser.integer(text, line, name) if text else None) or 0


def _seconds(
    cells: list[str], index: dict[str, int], name: str, line: int, parser: RowParser
) -> float:
    """A time in seconds (finite, >= 0) from a required column; 0.0 on failure (recorded)."""
    text = _text(cells, index, name, line, parser)
    return (parser.real(text, line, name) if text else None) or 0.0


def _servesim_row(
    cells: list[str], index: dict[str, int], line: int, parser: RowParser
) -> ParsedRow | None:
    row = ParsedRow(
        line,
        _seconds(cells, index, "arrival_s", line, parser),
        _tokens(cells, index, "prompt_tokens", line, parser),
        _tokens(cells, index, "output_tokens", line, parser),
    )
    request_id = (cell(cells, index, "request_id") or "").strip()
    row.request_id = request_id or None
    for name in ("num_samples", "hash_block_tokens"):
        text = (cell(cells, index, name) or "").strip()
        if text:
            setattr(row, name, parser.integer(text, line, name) or 1)
    for name in ("prompt_token_ids", "prefix_hash_ids"):
        text = cell(cells, index, name) or ""
        setattr(row, name, parser.id_list(text, line, name))
    text = (cell(cells, index, "priority") or "").strip()
    if text:
        row.priority = parser.integer(text, line, "priority", minimum=None) or 0
    return row


def _vidur_row(
    cells: list[str], index: dict[str, int], line: int, parser: RowParser
) -> ParsedRow | None:
    return ParsedRow(
        line,
        _seconds(cells, index, "arrived_at", line, parser),
        _tokens(cells, index, "num_prefill_tokens", line, parser),
        _tokens(cells, index, "num_decode_tokens", line, parser),
    )


def _azure_row_function(day_cache: dict[str, int]) -> RowFunction:
    def azure_row(
        cells: list[str], index: dict[str, int], line: int, parser: RowParser
    ) -> ParsedRow | None:
        text = _text(cells, index, "TIMESTAMP", line, parser)
        arrival_ns = 0
        if text:
            try:
                arrival_ns = parse_timestamp_ns(text, day_cache)
            except ValueError as error:
                parser.problem(line, "TIMESTAMP", str(error))
        return ParsedRow(
            line,
            arrival_ns,
            _tokens(cells, index, "ContextTokens", line, parser),
            _tokens(cells, index, "GeneratedTokens", line, parser),
        )

    return azure_row


def _read_csv(
    path: Path,
    on_error: str,
    columns: tuple[tuple[str, ...], tuple[str, ...]],
    row_function: RowFunction,
    time_divisor: float = 1.0,
    note_unread: bool = False,
) -> TraceBuilder:
    """Feed every data row through `row_function` into a builder; `columns` is (required,
    optional) and the first required column holds the arrival time. With `note_unread`, a
    column neither names is noted (`_unread_columns`): a format of our own has no others."""
    check_on_error(on_error)
    parser = RowParser(str(path))
    builder = TraceBuilder(parser, columns[0][0], on_error, time_divisor)
    rows = read_csv_rows(path)
    header = next(rows, None)
    if header is None:
        raise TraceFormatError(str(path), [], f"trace file {path} is empty")
    index = column_index(str(path), header[1], *columns)
    if note_unread:
        unknown = [c.strip() for c in header[1] if c.strip() not in (*columns[0], *columns[1])]
        if unknown:
            builder.notes.append(_unread_columns(unknown))
    for line, cells in rows:
        if _check_width(header[1], cells, line, parser):
            builder.add(row_function(cells, index, line, parser), line)
        else:
            builder.add(None, line)
    return builder


def load_servesim(path: str | Path, on_error: str = "raise", *, name: str | None = None) -> Trace:
    """Our own CSV (see `traces/README.md`): `arrival_s,prompt_tokens,output_tokens` required;
    `request_id,num_samples,prompt_token_ids,prefix_hash_ids,hash_block_tokens,priority` optional
    (``priority``: any integer, lower served first under ``--scheduling-policy priority``)."""
    path = Path(path)
    columns = (SERVESIM_REQUIRED, SERVESIM_OPTIONAL)
    builder = _read_csv(path, on_error, columns, _servesim_row, note_unread=True)
    return builder.build(name or trace_stem(path), "servesim")


def _unread_columns(unknown: list[str]) -> str:
    """What a note says of a servesim CSV's columns that no field reads: each by name, with
    the column it most likely misspells."""
    known = (*SERVESIM_REQUIRED, *SERVESIM_OPTIONAL)
    named = []
    for column in unknown:
        close = difflib.get_close_matches(column, known, n=1)
        named.append(f"{column!r} (did you mean {close[0]!r}?)" if close else repr(column))
    return f"columns not read (the servesim format has no such column): {', '.join(named)}"


def load_vidur(path: str | Path, on_error: str = "raise", *, name: str | None = None) -> Trace:
    """Vidur's processed trace CSV: `arrived_at` (s), `num_prefill_tokens`, `num_decode_tokens`."""
    path = Path(path)
    builder = _read_csv(path, on_error, (VIDUR_COLUMNS, ()), _vidur_row)
    return builder.build(name or trace_stem(path), "vidur")


def load_azure(path: str | Path, on_error: str = "raise", *, name: str | None = None) -> Trace:
    """Azure LLM inference trace CSV: `TIMESTAMP` (date-time string), `ContextTokens`,
    `GeneratedTokens`. `arrival_offset_s` is the first timestamp in Unix seconds (naive=UTC)."""
    path = Path(path)
    row_function = _azure_row_function({})
    builder = _read_csv(path, on_error, (AZURE_COLUMNS, ()), row_function, 1e9)
    return builder.build(name or trace_stem(path), "azure")


class _BurstGptRows:
    """Row function for BurstGPT that also counts the rows it deliberately treats specially."""

    def __init__(self, failures: str, models: Collection[str] | None) -> None:
        self.failures = failures
        self.models = models
        self.num_other_models = 0
        self.num_kept_failures = 0

    def __call__(
        self, cells: list[str], index: dict[str, int], line: int, parser: RowParser
    ) -> ParsedRow | None:
        model = (cell(cells, index, "Model") or "").strip()
        if self.models is not None and model not in self.models:
            self.num_other_models += 1
            return None
        arrival = _seconds(cells, index, "Timestamp", line, parser)
        prompt_tokens = _tokens(cells, index, "Request tokens", line, parser)
        response = _text(cells, index, "Response tokens", line, parser)
        output_tokens = parser.integer(response, line, "Response tokens", 0) if response else None
        if output_tokens == 0:
            reason = "failed request (0 response tokens)"
            if self.failures == "error":
                parser.problem(line, "Response tokens", f"{reason}; burstgpt_failures='error'")
            elif self.failures == "skip":
                parser.skip(line, "Response tokens", f"{reason} skipped (burstgpt_failures='skip')")
            else:
                self.num_kept_failures += 1
                output_tokens = 1
        return ParsedRow(line, arrival, prompt_tokens, output_tokens or 0)


def load_burstgpt(
    path: str | Path,
    on_error: str = "raise",
    *,
    name: str | None = None,
    burstgpt_failures: str = "skip",
    models: Collection[str] | None = None,
) -> Trace:
    """BurstGPT CSV: `Timestamp` (s), `Model`, `Request tokens`, `Response tokens`, ...

    Rows with 0 response tokens are failed requests. `burstgpt_failures="skip"` leaves them out
    and records each in `Trace.problems` and `num_skipped`; `"error"` treats them as bad rows;
    `"keep"` keeps them as 1-output-token requests (their prefill still loads the server) and
    says so in `Trace.notes`. `models` keeps only those `Model` values (counted in notes).
    """
    if burstgpt_failures not in BURSTGPT_FAILURE_CHOICES:
        raise ValueError(
            f"burstgpt_failures must be one of {BURSTGPT_FAILURE_CHOICES},"
            f" got {burstgpt_failures!r}"
        )
    path = Path(path)
    rows = _BurstGptRows(burstgpt_failures, models)
    builder = _read_csv(path, on_error, (BURSTGPT_COLUMNS, ("Model",)), rows)
    if rows.num_other_models:
        builder.notes.append(
            f"left out {rows.num_other_models} row(s) whose Model is not one of"
            f" {sorted(models or ())}"
        )
    if rows.num_kept_failures:
        builder.notes.append(
            f"kept {rows.num_kept_failures} failed request(s) (0 response tokens) as"
            " output_tokens=1 (burstgpt_failures='keep')"
        )
    return builder.build(name or trace_stem(path), "burstgpt")


def _json_int(record: dict[str, Any], key: str, line: int, parser: RowParser, minimum: int) -> int:
    """A JSON integer >= minimum (integral floats accepted); -1 after recording a problem."""
    if key not in record:
        parser.problem(line, key, "missing key")
        return -1
    value = record[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        parser.problem(line, key, f"expected an integer, got {value!r}")
        return -1
    if value < minimum:
        parser.problem(line, key, f"must be >= {minimum}, got {value}")
        return -1
    return value


def _mooncake_row(
    text: str, line: int, parser: RowParser, hash_block_tokens: int
) -> ParsedRow | None:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        parser.problem(line, "json", f"invalid JSON: {error.msg} at column {error.colno}")
        return None
    if not isinstance(record, dict):
        parser.problem(line, "json", f"expected a JSON object, got {type(record).__name__}")
        return None
    timestamp = _json_int(record, "timestamp", line, parser, 0)
    row = ParsedRow(
        line,
        timestamp,
        _json_int(record, "input_length", line, parser, 1),
        _json_int(record, "output_length", line, parser, 1),
        hash_block_tokens=hash_block_tokens,
    )
    hash_ids = record.get("hash_ids")
    if hash_ids is not None:
        if isinstance(hash_ids, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in hash_ids
        ):
            row.prefix_hash_ids = tuple(hash_ids)
        else:
            parser.problem(line, "hash_ids", f"expected a list of ints, got {str(hash_ids)[:40]}")
    return row


def load_mooncake(
    path: str | Path,
    on_error: str = "raise",
    *,
    name: str | None = None,
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS,
) -> Trace:
    """Mooncake JSON Lines: `timestamp` (ms), `input_length`, `output_length`, and `hash_ids`,
    one id per `hash_block_tokens`-token prompt block (512 in the FAST'25 release)."""
    check_on_error(on_error)
    path = Path(path)
    parser = RowParser(str(path))
    builder = TraceBuilder(parser, "timestamp", on_error, time_divisor=1000.0)
    with open_text(path, "trace") as handle:
        for line, text in enumerate(handle, start=1):
            if text.strip():
                builder.add(_mooncake_row(text, line, parser, hash_block_tokens), line)
    return builder.build(name or trace_stem(path), "mooncake")


FORMATS: dict[str, Callable[..., Trace]] = {
    "servesim": load_servesim,
    "vidur": load_vidur,
    "azure": load_azure,
    "mooncake": load_mooncake,
    "burstgpt": load_burstgpt,
}


def _first_line(path: Path) -> str:
    with open_text(path, "trace") as handle:
        for text in handle:
            if text.strip():
                return text.strip()
    raise TraceFormatError(str(path), [], f"trace file {path} is empty")


def detect_format(path: str | Path) -> str:
    """The `FORMATS` key whose header (or first JSON record) matches the file's first line."""
    path = Path(path)
    first = _first_line(path)
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            keys = set()
        if set(MOONCAKE_KEYS) <= keys:
            return "mooncake"
        missing = ", ".join(k for k in MOONCAKE_KEYS if k not in keys)
        message = f"JSON record without the Mooncake keys {MOONCAKE_KEYS} (missing {missing})"
    else:
        names = {name.strip() for name in next(iter(read_csv_rows(path)))[1]}
        for fmt, required in CSV_HEADERS.items():
            if set(required) <= names:
                return fmt
        if set(LENGTH_TABLE_COLUMNS) <= names:
            message = (
                "a length table with no arrival times: give it arrivals with `python -m sim"
                f" trace generate --lengths table --length-table {path} -o TRACE.csv`"
            )
        else:
            message = f"unrecognised header {first[:120]!r}; {expected_columns(names)}"
    problem = TraceProblem(str(path), 1, "header", message)
    raise TraceFormatError(
        str(path),
        [problem],
        f"cannot detect the format of {path}; name it with --format (format= in Python), one "
        f"of {sorted(FORMATS)}",
    )


def expected_columns(names: set[str]) -> str:
    """What each CSV format's header needs and which of those ``names`` lacks, and what a
    Mooncake file is (a header names none of its keys: it has no header)."""
    parts = []
    for fmt, required in CSV_HEADERS.items():
        missing = [column for column in required if column not in names]
        lacks = "none present" if len(missing) == len(required) else f"missing {', '.join(missing)}"
        parts.append(f"{fmt} needs {', '.join(required)} ({lacks})")
    parts.append(f"mooncake is JSON Lines with the keys {', '.join(MOONCAKE_KEYS)}")
    return "; ".join(parts)


def _existing_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"trace file {path} {what}")
    return path


def load_trace(
    path: str | Path, format: str = "auto", on_error: str = "raise", **options: Any
) -> Trace:
    """Load any supported trace; `format="auto"` detects it from the header / first line.

    `on_error="raise"` (default) fails with a `TraceFormatError` listing every bad row (file,
    line, field); `"skip"` leaves bad rows out and records them in `Trace.num_skipped` and
    `Trace.problems`. `options` go to the format's loader (e.g. `burstgpt_failures`, `name`).
    """
    path = _existing_file(path)
    check_on_error(on_error)
    try:
        if format == "auto":
            format = detect_format(path)
        elif format not in FORMATS:
            raise ValueError(
                f"unknown trace format {format!r}; choose 'auto' or one of {sorted(FORMATS)}"
            )
        return FORMATS[format](path, on_error, **options)
    except UnicodeDecodeError as error:  # binary past the sniffed head
        raise ValueError(binary_message(path, "trace", error)) from None


def load_length_table(
    path: str | Path, on_error: str = "raise", *, name: str | None = None, **options: Any
) -> LengthTable:
    """Prompt/output lengths from a Vidur/etalon stats CSV (`num_prefill_tokens`,
    `num_decode_tokens`, ...) or, failing that, from any trace `load_trace` reads."""
    path = _existing_file(path)
    check_on_error(on_error)
    rows = read_csv_rows(path)
    header = next(rows, None)
    names = {n.strip() for n in header[1]} if header else set()
    if not set(LENGTH_TABLE_COLUMNS) <= names or "arrived_at" in names:
        trace = load_trace(path, on_error=on_error, **options)
        return LengthTable(
            name or trace.name,
            tuple(r.prompt_tokens for r in trace.requests),
            tuple(r.output_tokens for r in trace.requests),
            trace.source,
            trace.num_skipped,
            trace.problems,
        )
    assert header is not None
    parser = RowParser(str(path))
    index = column_index(str(path), header[1], LENGTH_TABLE_COLUMNS)
    prompts: list[int] = []
    outputs: list[int] = []
    for line, cells in rows:
        if not _check_width(header[1], cells, line, parser):
            continue
        prompt = _tokens(cells, index, "num_prefill_tokens", line, parser)
        output = _tokens(cells, index, "num_decode_tokens", line, parser)
        if line not in parser.bad_lines:
            prompts.append(prompt)
            outputs.append(output)
    if (parser.problems and on_error == "raise") or not prompts:
        summary = "" if prompts else f"length table {path} has no usable rows"
        raise TraceFormatError(str(path), parser.problems, summary)
    return LengthTable(
        name or trace_stem(path),
        tuple(prompts),
        tuple(outputs),
        str(path),
        len(parser.bad_lines),
        tuple(parser.problems),
    )
