"""Writes a `Trace` as our own CSV (gzip-compressed when the name ends in ``.gz``);
`load_servesim` reads it back to an equal set of requests."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path
from typing import TextIO

from traces.schema import DEFAULT_HASH_BLOCK_TOKENS, Trace, TraceRequest

BASE_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "num_samples")


def _ids(ids: tuple[int, ...] | None) -> str:
    return " ".join(map(str, ids)) if ids is not None else ""


def trace_columns(trace: Trace) -> tuple[str, ...]:
    """The base columns plus only those optional columns some request needs."""
    columns = list(BASE_COLUMNS)
    requests = trace.requests
    has_hash_ids = any(r.prefix_hash_ids is not None for r in requests)
    if has_hash_ids:
        columns.append("prefix_hash_ids")
    if has_hash_ids or any(r.hash_block_tokens != DEFAULT_HASH_BLOCK_TOKENS for r in requests):
        columns.append("hash_block_tokens")
    if any(r.prompt_token_ids is not None for r in requests):
        columns.append("prompt_token_ids")
    if any(r.priority != 0 for r in requests):
        columns.append("priority")
    return tuple(columns)


def _row(request: TraceRequest, columns: tuple[str, ...]) -> list[str]:
    # repr() of a float is the shortest text that reads back to the identical float.
    row = [
        request.request_id,
        repr(float(request.arrival_s)),
        str(request.prompt_tokens),
        str(request.output_tokens),
        str(request.num_samples),
    ]
    if "prefix_hash_ids" in columns:
        row.append(_ids(request.prefix_hash_ids))
    if "hash_block_tokens" in columns:
        row.append(str(request.hash_block_tokens))
    if "prompt_token_ids" in columns:
        row.append(_ids(request.prompt_token_ids))
    if "priority" in columns:
        row.append(str(request.priority))
    return row


def _open_for_writing(path: Path) -> TextIO:
    """``path`` opened for UTF-8 text; a ``.gz`` name gets gzip, with no timestamp in its
    header, so that the same trace always gives the same bytes."""
    if path.suffix.lower() != ".gz":
        return path.open("w", newline="", encoding="utf-8")
    raw = gzip.GzipFile(path, mode="wb", mtime=0)
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` as a servesim CSV (LF line endings, UTF-8; gzip-compressed when `path`
    ends in ``.gz``, as the loaders read it) and return the path."""
    path = Path(path)
    columns = trace_columns(trace)
    with _open_for_writing(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(_row(request, columns) for request in trace.requests)
    return path
