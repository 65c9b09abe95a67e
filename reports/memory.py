"""KV memory figures: where every KV token slot is over time (stacked), the time-averaged
breakdown per run (the vLLM paper's Figure 2), and the utilisation numbers for the table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd
import plotly.graph_objects as go

from records.run_dir import RunRecords
from reports.downsample import decimate_rows
from reports.step_series import replica_groups, step_points
from reports.theme import display_text, new_figure

# steps.csv column -> (legend name, colour); bottom of the stack first.
SLOT_KINDS = {
    "real_token_slots": ("real tokens", "#2ca02c"),
    "internal_fragmentation_slots": ("internal fragmentation", "#ff7f0e"),
    "reservation_waste_slots": ("reservation waste", "#d62728"),
    "external_fragmentation_slots": ("external fragmentation", "#9467bd"),
    "cached_free_slots": ("cached-free (prefix cache)", "#17becf"),
    "free_slots": ("free", "#d9d9d9"),
}
# Figure 2 of the vLLM paper splits the memory a system holds or has made unusable.
FIGURE2_KINDS = (
    "real_token_slots",
    "internal_fragmentation_slots",
    "reservation_waste_slots",
    "external_fragmentation_slots",
)
USED_KINDS = FIGURE2_KINDS[:3]


def _slots(steps: pd.DataFrame, column: str) -> npt.NDArray[np.float64]:
    if column in steps.columns:
        return np.asarray(steps[column].to_numpy(float), dtype=np.float64)
    return np.zeros(len(steps), dtype=np.float64)


def _total_slots(steps: pd.DataFrame) -> npt.NDArray[np.float64]:
    return np.asarray(sum(_slots(steps, c) for c in SLOT_KINDS), dtype=np.float64)


def _weights(steps: pd.DataFrame) -> npt.NDArray[np.float64]:
    """Each step weighs its duration (a time average over busy time); equal weights when no
    step has a positive duration."""
    w = _slots(steps, "duration_s")
    return w if w.sum() > 0 else np.ones_like(w)


def kv_utilisation(run: RunRecords) -> tuple[float | None, float | None]:
    """(time-averaged, peak) share of KV slots in use (real + internal + reservation waste)."""
    steps = run.steps
    total = _total_slots(steps)
    if not len(steps) or not (total > 0).all():
        return None, None
    used = sum(_slots(steps, c) for c in USED_KINDS) / total
    return float(np.average(used, weights=_weights(steps))), float(used.max())


def kv_memory_over_time(run: RunRecords) -> go.Figure:
    """Where is every KV slot at each step: real tokens, each kind of waste, cache, free? One
    stack per replica (the first shown, the others one legend click away). A kind that holds no
    slot in any step of a replica (the prefix cache with prefix caching off, reservation waste
    under paged memory) is left out: a zero-height band would still draw its edge colour."""
    fig = new_figure(
        f"KV memory over time (stacked share of all slots): {display_text(run.label)}",
        "time (s)",
        "share of KV slots",
    )
    for group_idx, (group, steps) in enumerate(replica_groups(run.steps)):
        total = _total_slots(steps)
        total[total == 0] = 1.0
        # A row's snapshot holds until the next row (or the end of the run), idle gaps too.
        x, series = step_points(steps, [_slots(steps, c) / total for c in SLOT_KINDS])
        shares = [pd.Series(y).ffill().to_numpy() for y in series]
        keep = decimate_rows(x, shares)
        for (name, color), share in zip(SLOT_KINDS.values(), shares, strict=True):
            if not np.nan_to_num(share).any():
                continue
            fig.add_trace(
                go.Scatter(
                    x=x[keep],
                    y=share[keep],
                    mode="lines",
                    stackgroup=f"slots-{group_idx}",
                    legendgroup=group,
                    visible=True if group_idx == 0 else "legendonly",
                    line={"color": color, "width": 0.5, "shape": "hv"},
                    fillcolor=color,
                    name=display_text(f"{group}: {name}" if group else name),
                    hovertemplate=f"t %{{x:.3f}} s<br>{name} %{{y:.1%}}<extra></extra>",
                )
            )
    fig.update_yaxes(tickformat=".0%")
    return fig


def kv_breakdown(runs: Sequence[RunRecords]) -> go.Figure:
    """Of the KV memory each run held or made unusable, what share held real tokens?

    Time-averaged (steps weighted by duration) shares of real + internal + reservation +
    external slots, as in the vLLM paper's Figure 2 (contiguous Max/Pow2/Oracle vs paged)."""
    fig = new_figure(
        "Time-averaged KV memory breakdown (vLLM paper, Figure 2)",
        "share of KV memory held or made unusable",
        "",
        barmode="stack",
        height=max(260, 120 + 60 * len(runs)),
    )
    labels = [display_text(run.label) for run in runs]
    shares: dict[str, list[float]] = {c: [] for c in FIGURE2_KINDS}
    for run in runs:
        parts = {c: _slots(run.steps, c) for c in FIGURE2_KINDS}
        held = np.asarray(sum(parts.values()), dtype=np.float64)
        weights = _weights(run.steps) * (held > 0)
        held[held == 0] = 1.0
        for column, values in parts.items():
            mean = np.average(values / held, weights=weights) if weights.sum() > 0 else 0.0
            shares[column].append(float(mean))
    for column in FIGURE2_KINDS:
        name, color = SLOT_KINDS[column]
        fig.add_trace(
            go.Bar(
                y=labels,
                x=shares[column],
                orientation="h",
                marker={"color": color},
                name=name,
                text=[f"{v:.1%}" if v >= 0.04 else "" for v in shares[column]],
                textposition="inside",
                hovertemplate=f"%{{y}}<br>{name} %{{x:.1%}}<extra></extra>",
            )
        )
    fig.update_xaxes(range=[0, 1], tickformat=".0%")
    fig.update_yaxes(autorange="reversed")
    return fig
