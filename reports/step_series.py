"""Per-step quantities as step functions of time: each ``steps.csv`` row holds its value from
its start to its end (a fast-forwarded row covers ``num_steps`` identical steps, each taking
its duration divided by that count), with a gap value between rows where the replica idled."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]
# Rows closer than this are back to back (times are sums of float durations).
GAP_TOLERANCE_S = 1e-9


def per_step(steps: pd.DataFrame, column: str) -> FloatArray:
    """``column`` for one step of each row. ``RunRecords.steps`` already holds per-step means
    of the summed columns (``records.run_dir.per_step``); a row's ``duration_s`` spans all its
    steps, so it is divided by ``num_steps`` here."""
    values = np.asarray(steps[column].to_numpy(float), dtype=np.float64)
    if column == "duration_s" and "num_steps" in steps.columns:
        values = values / np.maximum(steps["num_steps"].to_numpy(float), 1.0)
    return values


def step_points(
    steps: pd.DataFrame, series: list[FloatArray], gap_value: float = np.nan
) -> tuple[FloatArray, list[FloatArray]]:
    """Points that draw each series as a step function (plotly ``line_shape="hv"``).

    ``steps`` are one replica's rows in time order and ``series`` one value per row. Every row
    gives a point at its start; where the next row starts later than this one ends, a point at
    the end takes ``gap_value`` (NaN breaks the line); the last row also ends in a point, so the
    line reaches the end of the run."""
    start = np.asarray(steps["start_s"].to_numpy(float), dtype=np.float64)
    end = start + np.asarray(steps["duration_s"].to_numpy(float), dtype=np.float64)
    if start.size == 0:
        return start, [np.asarray(s, dtype=np.float64) for s in series]
    gap_after = np.flatnonzero(start[1:] > end[:-1] + GAP_TOLERANCE_S)
    x = np.insert(start, gap_after + 1, end[gap_after])
    x = np.append(x, end[-1])
    ys = []
    for values in series:
        y = np.insert(np.asarray(values, dtype=np.float64), gap_after + 1, gap_value)
        ys.append(np.append(y, values[-1]))
    return x, ys


def replica_groups(steps: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(label, rows in time order) per replica; the label is empty for a single replica."""
    keys = [c for c in ("pool", "replica") if c in steps.columns]
    if not keys or len(steps.groupby(keys)) <= 1:
        yield "", steps.sort_values("start_s", kind="stable")
        return
    for key, rows in steps.groupby(keys, sort=True):
        parts = key if isinstance(key, tuple) else (key,)
        yield " ".join(str(p) for p in parts), rows.sort_values("start_s", kind="stable")


def value_at(x: FloatArray, y: FloatArray, times: FloatArray) -> FloatArray:
    """The step function drawn from (``x``, ``y``) with ``line_shape="hv"``, at ``times``
    (NaN before the first point and after the last)."""
    idx = np.searchsorted(x, times, side="right") - 1
    out = np.where(idx >= 0, y[np.clip(idx, 0, len(y) - 1)], np.nan)
    out[(times > x[-1]) if len(x) else slice(None)] = np.nan
    return np.asarray(out, dtype=np.float64)
