"""Shared look of every figure: one colour per run, the layout defaults, axis titles."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

RUN_COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


def display_text(text: str) -> str:
    """Text for plotly labels: plotly renders a subset of HTML tags in names and titles, so
    strings from traces and configs are entity-escaped (plotly shows the entities as text)."""
    return html.escape(text, quote=True)


def new_figure(title: str, x_title: str, y_title: str, **layout: Any) -> go.Figure:
    """An empty figure with the report's layout: title, axis titles with units, legend on top."""
    fig = go.Figure()
    defaults: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "template": "plotly_white",
        "height": 380,
        "margin": {"l": 70, "r": 20, "t": 60, "b": 55},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 1.0, "xanchor": "right"},
        "hovermode": "closest",
    }
    fig.update_layout(**(defaults | layout))
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig
