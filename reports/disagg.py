"""Disaggregated runs (prefill and decode pools joined by a KV link): transfer volume, link
queueing and per-pool KV utilisation. Runs without these optional columns skip the section."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from records.run_dir import RunRecords
from reports.downsample import decimate_rows
from reports.memory import SLOT_KINDS, USED_KINDS
from reports.theme import display_text, new_figure, run_color

# Optional columns a disaggregated run adds. requests.csv: bytes of KV sent over the link,
# time spent queued for the link, and when the transfer started (after the prefill);
# steps.csv: which pool ran the step.
TRANSFER_BYTES = "kv_transfer_bytes"
TRANSFER_QUEUE = "kv_transfer_queue_ms"
TRANSFER_START = "kv_transfer_start_s"
POOL = "pool"
MAX_VOLUME_BINS = 200


def has_transfers(run: RunRecords) -> bool:
    columns = run.requests.columns
    return all(c in columns for c in (TRANSFER_BYTES, TRANSFER_QUEUE, TRANSFER_START))


def has_pools(run: RunRecords) -> bool:
    """A run with separate prefill and decode pools (colocated runs name one pool)."""
    if POOL not in run.steps.columns:
        return False
    return bool(set(run.steps[POOL].astype(str)) - {"colocated"})


def has_disaggregation(run: RunRecords) -> bool:
    return has_transfers(run) or has_pools(run)


def kv_transfer_volume(runs: Sequence[RunRecords]) -> go.Figure:
    """How much KV crosses the link over time (GB/s, binned)?"""
    fig = new_figure("KV transfer volume over the link", "time (s)", "KV transferred (GB/s)")
    for idx, run in enumerate(r for r in runs if has_transfers(r)):
        rows = run.requests[[TRANSFER_START, TRANSFER_BYTES]].dropna()
        t = rows[TRANSFER_START].to_numpy(float)
        if not t.size:
            continue
        edges = np.linspace(t.min(), max(t.max(), t.min() + 1e-9), MAX_VOLUME_BINS + 1)
        volume, _ = np.histogram(t, bins=edges, weights=rows[TRANSFER_BYTES].to_numpy(float))
        width = edges[1] - edges[0]
        fig.add_trace(
            go.Scatter(
                x=edges[:-1],
                y=volume / width / 1e9,
                mode="lines",
                line={"shape": "hv", "color": run_color(idx)},
                name=display_text(run.label),
                hovertemplate="t %{x:.2f} s<br>%{y:.3f} GB/s<extra></extra>",
            )
        )
    return fig


def kv_link_queueing(runs: Sequence[RunRecords]) -> go.Figure:
    """How long does a request's KV wait for the link? (min/max decimated)"""
    fig = new_figure(
        "KV transfer queueing on the link", "transfer start time (s)", "queued for link (ms)"
    )
    for idx, run in enumerate(r for r in runs if has_transfers(r)):
        rows = run.requests[[TRANSFER_START, TRANSFER_QUEUE]].dropna()
        rows = rows.sort_values(TRANSFER_START, kind="stable")
        x = rows[TRANSFER_START].to_numpy(float)
        y = rows[TRANSFER_QUEUE].to_numpy(float)
        keep = decimate_rows(x, [y])
        fig.add_trace(
            go.Scatter(
                x=x[keep],
                y=y[keep],
                mode="markers",
                marker={"size": 4, "color": run_color(idx)},
                name=display_text(run.label),
                hovertemplate="t %{x:.2f} s<br>queued %{y:.2f} ms<extra></extra>",
            )
        )
    return fig


def pool_utilisation(run: RunRecords) -> go.Figure:
    """How full is each pool's KV cache over time?"""
    fig = new_figure(
        f"KV utilisation per pool: {display_text(run.label)}", "step start time (s)", "KV in use"
    )
    for pool_idx, (pool, pool_steps) in enumerate(run.steps.groupby(POOL, sort=True)):
        steps = pool_steps.sort_values("start_s", kind="stable")
        total = sum(steps[c].to_numpy(float) for c in SLOT_KINDS if c in steps.columns)
        used = sum(steps[c].to_numpy(float) for c in USED_KINDS if c in steps.columns)
        share = used / np.where(total > 0, total, 1.0)
        x = steps["start_s"].to_numpy(float)
        keep = decimate_rows(x, [share])
        fig.add_trace(
            go.Scatter(
                x=x[keep],
                y=share[keep],
                mode="lines",
                line={"color": run_color(pool_idx)},
                name=display_text(str(pool)),
                hovertemplate="t %{x:.3f} s<br>in use %{y:.1%}<extra></extra>",
            )
        )
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    return fig
