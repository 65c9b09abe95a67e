"""Latency figures: per-run CDFs of TTFT, TPOT, E2E and queueing delay, the same per priority
class where a trace has several, and latency against arrival time (does a queue build up?)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go

from records.run_dir import RunRecords
from reports.downsample import cdf_points, decimate_rows
from reports.theme import display_text, new_figure, run_color

# requests.csv column -> what the figure calls it
LATENCY_NAMES = {
    "ttft_ms": "TTFT",
    "tpot_ms": "TPOT",
    "e2el_ms": "E2E latency",
    "queueing_ms": "Queueing delay",
}


def _finished(
    run: RunRecords, column: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(arrival_s, column) of finished requests with a value, in arrival order."""
    frame = run.requests
    if column not in frame.columns or frame.empty:
        return np.empty(0), np.empty(0)
    mask = frame["status"].astype(str) == "finished" if "status" in frame.columns else True
    rows = frame.loc[mask, ["arrival_s", column]].dropna()
    rows = rows.sort_values("arrival_s", kind="stable")
    return rows["arrival_s"].to_numpy(float), rows[column].to_numpy(float)


def latency_cdf(runs: Sequence[RunRecords], column: str) -> go.Figure:
    """How is ``column`` (a requests.csv latency in ms) distributed, run against run?"""
    name = LATENCY_NAMES[column]
    fig = new_figure(f"{name}: CDF over finished requests", f"{name} (ms)", "share of requests")
    for idx, run in enumerate(runs):
        x, y = cdf_points(_finished(run, column)[1])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line={"shape": "hv", "color": run_color(idx), "width": 2},
                name=display_text(run.label),
                hovertemplate=f"{name} %{{x:.2f}} ms<br>share %{{y:.3f}}<extra></extra>",
            )
        )
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    return fig


def latency_vs_arrival(runs: Sequence[RunRecords], column: str) -> go.Figure:
    """Does ``column`` grow with arrival time (a queue building up)? Min/max decimated."""
    name = LATENCY_NAMES[column]
    fig = new_figure(
        f"{name} against arrival time (a rising trend means a growing queue)",
        "arrival time (s)",
        f"{name} (ms)",
    )
    for idx, run in enumerate(runs):
        x, y = _finished(run, column)
        keep = decimate_rows(x, [y])
        fig.add_trace(
            go.Scatter(
                x=x[keep],
                y=y[keep],
                mode="markers",
                marker={"size": 4, "color": run_color(idx), "opacity": 0.6},
                name=display_text(run.label),
                hovertemplate=f"arrival %{{x:.2f}} s<br>{name} %{{y:.2f}} ms<extra></extra>",
            )
        )
    return fig


# One line style per priority class, lowest (served first) solid.
_CLASS_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def priority_classes(run: RunRecords) -> list[int]:
    """The run's priority classes, lowest first; empty when its trace had one (requests.csv
    then has no ``priority`` column)."""
    frame = run.requests
    if "priority" not in frame.columns:
        return []
    classes = sorted(int(p) for p in frame["priority"].dropna().unique())
    return classes if len(classes) > 1 else []


def latency_cdf_by_priority(runs: Sequence[RunRecords], column: str) -> go.Figure:
    """How is ``column`` distributed within each priority class, run against run? One color
    per run, one line style per class."""
    name = LATENCY_NAMES[column]
    fig = new_figure(
        f"{name} by priority class (lower is served first under priority scheduling)",
        f"{name} (ms)",
        "share of the class's requests",
    )
    for idx, run in enumerate(runs):
        frame = run.requests
        finished = frame["status"].astype(str) == "finished"
        for rank, priority in enumerate(priority_classes(run)):
            values = frame.loc[finished & (frame["priority"] == priority), column].dropna()
            x, y = cdf_points(values.to_numpy(float))
            dash = _CLASS_DASHES[rank % len(_CLASS_DASHES)]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line={"shape": "hv", "color": run_color(idx), "width": 2, "dash": dash},
                    name=f"{display_text(run.label)}, priority {priority}",
                    hovertemplate=f"{name} %{{x:.2f}} ms<br>share %{{y:.3f}}<extra></extra>",
                )
            )
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    return fig
