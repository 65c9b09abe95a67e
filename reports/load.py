"""Load and batching over time: running / waiting / swapped requests, per-step batch
composition (prefill vs decode tokens) and step duration."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from records.run_dir import RunRecords
from reports.downsample import decimate_rows
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


def load_over_time(run: RunRecords) -> go.Figure:
    """How many requests are running, waiting and swapped out at each step?"""
    steps = run.steps
    fig = new_figure(
        f"Requests running / waiting / swapped: {display_text(run.label)}",
        "time (s)",
        "requests",
    )
    columns = [c for c in QUEUE_SERIES if c in steps.columns]
    x = steps["start_s"].to_numpy(float)
    keep = decimate_rows(x, [steps[c].to_numpy(float) for c in columns])
    for column in columns:
        name, color = QUEUE_SERIES[column]
        fig.add_trace(
            go.Scatter(
                x=x[keep],
                y=steps[column].to_numpy(float)[keep],
                mode="lines",
                line={"color": color, "width": 1.5, "shape": "hv"},
                name=name,
                hovertemplate=f"t %{{x:.3f}} s<br>{name} %{{y:d}}<extra></extra>",
            )
        )
    return fig


def batch_composition(run: RunRecords) -> go.Figure:
    """What does each step compute: how many prefill tokens and how many decode tokens?"""
    steps = run.steps
    fig = new_figure(
        f"Batch composition per step (stacked): {display_text(run.label)}",
        "step start time (s)",
        "tokens in the step",
    )
    x = steps["start_s"].to_numpy(float)
    total = sum(steps[c].to_numpy(float) for c in BATCH_SERIES)
    keep = decimate_rows(x, [steps[c].to_numpy(float) for c in BATCH_SERIES] + [total])
    for column, (name, color) in BATCH_SERIES.items():
        fig.add_trace(
            go.Scatter(
                x=x[keep],
                y=steps[column].to_numpy(float)[keep],
                mode="lines",
                stackgroup="tokens",
                line={"color": color, "width": 0.5},
                name=name,
                hovertemplate=f"t %{{x:.3f}} s<br>{name} %{{y:d}}<extra></extra>",
            )
        )
    return fig


def step_duration(runs: Sequence[RunRecords]) -> go.Figure:
    """How long does each step take, run against run?"""
    fig = new_figure("Step duration over time", "step start time (s)", "step duration (ms)")
    for idx, run in enumerate(runs):
        x = run.steps["start_s"].to_numpy(float)
        y = run.steps["duration_s"].to_numpy(float) * 1000.0
        keep = decimate_rows(x, [y])
        fig.add_trace(
            go.Scatter(
                x=x[keep],
                y=y[keep],
                mode="lines",
                line={"color": run_color(idx), "width": 1},
                name=display_text(run.label),
                hovertemplate="t %{x:.3f} s<br>duration %{y:.2f} ms<extra></extra>",
            )
        )
    return fig
