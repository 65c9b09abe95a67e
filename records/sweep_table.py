"""``sweep.csv``: one row per sweep point (its options, status, error and every summary metric).
``write_sweep_csv`` formats values deterministically (floats as ``repr``), so any executor that
produces the same rows writes the same bytes; ``load_sweep_csv`` reads it back for reports."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

LEAD_COLUMNS = ("point", "run_dir", "status", "error", "num_gpus")
# What the printed table shows of each point beside its options: (column, header, format).
PRINTED_METRICS = (
    ("request_throughput", "req/s", "{:.3f}"),
    ("request_goodput", "goodput", "{:.3f}"),
    ("slo_attainment", "in SLO", "{:.1%}"),
    ("median_ttft_ms", "TTFT p50 ms", "{:,.1f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:,.1f}"),
    ("median_tpot_ms", "TPOT p50 ms", "{:,.2f}"),
    ("p99_tpot_ms", "TPOT p99 ms", "{:,.2f}"),
)


def format_value(value: Any) -> str:
    """None is empty, booleans are true/false, floats their shortest round-trip ``repr``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def sweep_columns(option_names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Lead columns, the options, then every metric any row holds, by name (resumed rows come
    from summary.json, whose keys are sorted, so no row's own order can be trusted)."""
    lead = [*LEAD_COLUMNS, *option_names]
    metrics = sorted({key for row in rows for key in row} - set(lead))
    return [*lead, *metrics]


def sweep_csv_text(option_names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    columns = sweep_columns(option_names, rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([format_value(row.get(column)) for column in columns])
    return buffer.getvalue()


def points_text(option_names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """The points as a plain-text table: each point's options as given (empty where a point
    leaves one at its default), its key metrics, and its error where it failed."""
    metrics = [m for m in PRINTED_METRICS if any(row.get(m[0]) is not None for row in rows)]
    table = []
    for row in rows:
        line = {"point": str(row.get("point", ""))}
        line |= {name: option_text(row.get(name)) for name in option_names}
        for column, header, spec in metrics:
            value = row.get(column)
            line[header] = "" if value is None or row.get("status") != "ok" else spec.format(value)
        line["status"] = str(row.get("status", ""))
        if row.get("error"):
            line["status"] += f": {row['error']}"
        table.append(line)
    frame = pd.DataFrame(table)
    text: str = frame.to_string(index=False)
    return text


def option_text(value: Any) -> str:
    """An option's value as it reads on a command line; empty where the point does not set it
    (a float column read back from CSV holds NaN there, and 64.0 for 64)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return format_value(value)


def write_sweep_csv(
    path: str | Path, option_names: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(sweep_csv_text(option_names, rows), encoding="utf-8")
    write_option_names(out, option_names)
    return out


def load_sweep_csv(path: str | Path) -> pd.DataFrame:
    """``sweep.csv`` as a frame (empty cells are NaN; ``error`` and ``run_dir`` stay strings)."""
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    missing = [c for c in LEAD_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a sweep.csv (missing columns {missing})")
    frame["error"] = ["" if pd.isna(v) else str(v) for v in frame["error"]]
    return frame


def options_path(csv_path: str | Path) -> Path:
    """The ``sweep.json`` beside a ``sweep.csv``: which of its columns are options."""
    return Path(csv_path).with_name("sweep.json")


def write_option_names(csv_path: str | Path, option_names: Sequence[str]) -> None:
    text = json.dumps({"options": list(option_names)}, indent=2) + "\n"
    options_path(csv_path).write_text(text, encoding="utf-8")


def option_columns(csv_path: str | Path, frame: pd.DataFrame) -> list[str]:
    """The option columns of a sweep frame, from ``sweep.json`` (written beside sweep.csv)."""
    path = options_path(csv_path)
    try:
        names = json.loads(path.read_text(encoding="utf-8"))["options"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: cannot read the sweep's option names ({error})") from error
    return [str(n) for n in names if str(n) in frame.columns]
