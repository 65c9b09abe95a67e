"""Load and batching over time: running / waiting / swapped requests, per-step batch
composition (prefill vs decode tokens) and step duration."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from records.run_dir import RunRecords
from reports.downsample import decimate_rows
from reports.step_series import per_step, replica_groups, step_points
from reports.theme import display_text, new_figure, run_color

QUEUE_SERIES = {
    "num_running": ("running", "#1f77b4"),
    "num_waiting": ("waiting", "#ff7f0e"),
    "num_swapped": ("swapped", "#9467bd"),
}
BATCH_SERIES = {
    "num_prefill_tokens": ("prefill tokens", "#d62728"),
    "num_decode_tokens": ("decode tokens", "#2ca02c"),
}


def _group_name(group: str, name: str) -> str:
    return f"{group}: {name}" if group else name


def load_over_time(run: RunRecords) -> go.Figure:
    """How many requests are running, waiting and swapped out at each step? Each step's counts
    hold from its start to its end. While the replica idles between steps nothing runs and
    nothing is swapped out (a swapped request would be swapped in), so those lines drop to 0;
    the waiting line keeps its last count, since only a policy that holds requests back for a
    fuller batch (static, dynamic) idles with requests waiting, and steps.csv records no count
    between steps."""
    fig = new_figure(
        f"Requests running / waiting / swapped: {display_text(run.label)}",
        "time (s)",
        "requests",
    )
    columns = [c for c in QUEUE_SERIES if c in run.steps.columns]
    for group, steps in replica_groups(run.steps):
        x, ys = step_points(steps, [per_step(steps, c) for c in columns], gap_value=0.0)
        if "num_waiting" in columns:
            # (the same points, with the gaps holding the count before them)
            at = columns.index("num_waiting")
            _, (ys[at],) = step_points(steps, [per_step(steps, "num_waiting")], gap_value=np.nan)
            ys[at] = pd.Series(ys[at]).ffill().to_numpy()
        keep = decimate_rows(x, ys)
        for column, y in zip(columns, ys, strict=True):
            name, color = QUEUE_SERIES[column]
            fig.add_trace(
                go.Scatter(
                    x=x[keep],
                    y=y[keep],
                    mode="lines",
                    line={"color": color, "width": 1.5, "shape": "hv"},
                    name=display_text(_group_name(group, name)),
                    hovertemplate=f"t %{{x:.3f}} s<br>{name} %{{y}}<extra></extra>",
                )
            )
    return fig


def batch_composition(run: RunRecords) -> go.Figure:
    """What does each step compute: how many prefill tokens and how many decode tokens? Each
    step's tokens hold from its start to its end (zero while the replica idles)."""
    fig = new_figure(
        f"Batch composition per step: {display_text(run.label)}",
        "time (s)",
        "tokens in one step",
    )
    for group, steps in replica_groups(run.steps):
        x, ys = step_points(steps, [per_step(steps, c) for c in BATCH_SERIES], gap_value=0.0)
        keep = decimate_rows(x, ys)
        for (name, color), y in zip(BATCH_SERIES.values(), ys, strict=True):
            fig.add_trace(
                go.Scatter(
                    x=x[keep],
                    y=y[keep],
                    mode="lines",
                    line={"color": color, "width": 1, "shape": "hv"},
                    name=display_text(_group_name(group, name)),
                    hovertemplate=f"t %{{x:.3f}} s<br>{name} %{{y:.1f}}<extra></extra>",
                )
            )
    return fig


def step_duration(runs: Sequence[RunRecords]) -> go.Figure:
    """How long does each step take, run against run? A fast-forwarded row of identical steps
    shows their mean duration over its whole span."""
    fig = new_figure("Step duration over time", "time (s)", "step duration (ms)")
    for idx, run in enumerate(runs):
        for group, steps in replica_groups(run.steps):
            x, (y,) = step_points(steps, [per_step(steps, "duration_s") * 1000.0])
            keep = decimate_rows(x, [y])
            name = f"{run.label} ({group})" if group else run.label
            fig.add_trace(
                go.Scatter(
                    x=x[keep],
                    y=y[keep],
                    mode="lines",
                    line={"color": run_color(idx), "width": 1, "shape": "hv"},
                    name=display_text(name),
                    hovertemplate="t %{x:.3f} s<br>duration %{y:.2f} ms<extra></extra>",
                )
            )
    return fig
