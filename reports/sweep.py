"""Reports for many runs at once: a sweep (sortable table, Pareto fronts, each metric against
each swept option) and a capacity search (SLO attainment and latency percentiles against rate).
Figures are pure functions of the ``sweep.csv`` frame (``records.sweep_table``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from records.sweep_table import load_sweep_csv, option_columns, option_text
from reports.html import Section, render_page

# (column, label, higher is better)
THROUGHPUT = ("request_throughput", "throughput (req/s)", True)
GOODPUT = ("request_goodput", "goodput (req/s within SLOs)", True)
P99_TTFT = ("p99_ttft_ms", "p99 TTFT (ms)", False)
P99_TPOT = ("p99_tpot_ms", "p99 TPOT (ms)", False)
COST = ("num_gpus", "cost (GPUs)", False)
KEY_METRICS = (THROUGHPUT, GOODPUT, P99_TTFT, P99_TPOT, ("mean_e2el_ms", "mean E2E (ms)", False))

SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.style.cursor = "pointer";
    th.title = "click to sort";
    th.addEventListener("click", function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var dir = th.getAttribute("data-dir") === "asc" ? -1 : 1;
      th.setAttribute("data-dir", dir === 1 ? "asc" : "desc");
      rows.sort(function (a, b) {
        var x = a.cells[col].textContent, y = b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        if (x === "" && y !== "") { return 1; }
        if (y === "" && x !== "") { return -1; }
        if (!isNaN(nx) && !isNaN(ny)) { return dir * (nx - ny); }
        return dir * x.localeCompare(y);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def pareto_front(frame: pd.DataFrame, x: str, y: str, x_high: bool, y_high: bool) -> pd.DataFrame:
    """Rows no other row beats on both ``x`` and ``y`` (rows missing either are left out),
    sorted by ``x``. ``*_high`` says whether more is better on that axis."""
    data = frame.dropna(subset=[x, y])
    sx = data[x].to_numpy(float) * (1 if x_high else -1)
    sy = data[y].to_numpy(float) * (1 if y_high else -1)
    keep = []
    for i in range(len(data)):
        beaten = ((sx >= sx[i]) & (sy >= sy[i]) & ((sx > sx[i]) | (sy > sy[i]))).any()
        keep.append(not beaten)
    return data[keep].sort_values(x)


def point_labels(frame: pd.DataFrame, options: Sequence[str]) -> list[str]:
    """One hover label per row: ``point N: option=value, ...``."""
    return [
        f"point {row['point']}: "
        + ", ".join(f"{o}={option_text(row[o])}" for o in options if pd.notna(row[o]))
        for _, row in frame.iterrows()
    ]


def axis_text(value: Any) -> str:
    """An option's value on a category axis: as typed on a command line (64, not 64.0), and
    "default" where a point does not set the option (NaN in the frame)."""
    return option_text(value) or "default"


def pareto_figure(
    frame: pd.DataFrame,
    options: Sequence[str],
    x: tuple[str, str, bool],
    y: tuple[str, str, bool],
) -> go.Figure:
    """Every point of the sweep on ``x`` against ``y``, with its Pareto front drawn through."""
    data = frame[frame["status"] == "ok"].dropna(subset=[x[0], y[0]])
    front = pareto_front(data, x[0], y[0], x[2], y[2])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=data[x[0]],
            y=data[y[0]],
            mode="markers",
            name="points",
            text=point_labels(data, options),
            hoverinfo="text+x+y",
            marker={"size": 8, "opacity": 0.6},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=front[x[0]],
            y=front[y[0]],
            mode="lines+markers",
            name="Pareto front",
            text=point_labels(front, options),
            hoverinfo="text+x+y",
            line={"shape": "hv" if x[0] == COST[0] else "linear"},
            marker={"size": 10, "symbol": "diamond"},
        )
    )
    fig.update_layout(
        title=f"{y[1]} against {x[1]}",
        xaxis_title=x[1],
        yaxis_title=y[1],
        height=420,
        margin={"t": 50, "b": 40},
    )
    return fig


def metric_vs_option(
    frame: pd.DataFrame, option: str, metrics: Sequence[tuple[str, str, bool]] = KEY_METRICS
) -> go.Figure:
    """Each metric against the values of one swept option (every point is a marker, so the
    spread over the other options shows)."""
    data = frame[frame["status"] == "ok"]
    present = [m for m in metrics if m[0] in data.columns]
    fig = make_subplots(rows=1, cols=max(1, len(present)), subplot_titles=[m[1] for m in present])
    values = data[option].map(axis_text)
    for col, (column, label, _) in enumerate(present, start=1):
        fig.add_trace(
            go.Box(
                x=values,
                y=data[column],
                name=label,
                boxpoints="all",
                jitter=0.3,
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text=option, type="category", row=1, col=col)
    fig.update_layout(title=f"Metrics against {option}", height=360, margin={"t": 70, "b": 40})
    return fig


def sweep_table_html(frame: pd.DataFrame, options: Sequence[str]) -> str:
    """The sortable table: options, key metrics, cost and each point's error."""
    metric_columns = [m[0] for m in KEY_METRICS if m[0] in frame.columns]
    extra = [c for c in ("slo_attainment",) if c in frame.columns]
    columns = ["point", *options, "num_gpus", *metric_columns, *extra, "status", "error"]
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    rows = []
    for _, row in frame.iterrows():
        cells = []
        for column in columns:
            value = row[column]
            text = "" if pd.isna(value) else _short(value)
            css = ' class="num"' if isinstance(value, (int, float)) else ""
            cells.append(f"<td{css}>{escape(text)}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<table class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if not value.is_integer() else str(int(value))
    return str(value)


def swept_options(frame: pd.DataFrame, options: Sequence[str]) -> list[str]:
    """The options that take more than one value in the sweep."""
    return [o for o in options if frame[o].map(axis_text).nunique() > 1]


def sweep_sections(frame: pd.DataFrame, options: Sequence[str]) -> list[Section]:
    ok = int((frame["status"] == "ok").sum())
    table = Section(
        "points",
        "Points",
        f"{len(frame)} points, {ok} ran, {len(frame) - ok} failed. Click a column to sort.",
        body_html=f'<div class="table-wrap">{sweep_table_html(frame, options)}</div>',
    )
    fronts = Section(
        "pareto",
        "Pareto fronts",
        "Which configurations no other beats on both axes: throughput against tail latency, "
        "goodput against the GPUs a deployment holds.",
        (
            ("fig-pareto-ttft", pareto_figure(frame, options, P99_TTFT, THROUGHPUT)),
            ("fig-pareto-tpot", pareto_figure(frame, options, P99_TPOT, THROUGHPUT)),
            ("fig-pareto-cost", pareto_figure(frame, options, COST, GOODPUT)),
        ),
        grid=True,
    )
    by_option = Section(
        "by-option",
        "Each metric against each swept option",
        "One panel per metric; each marker is a point, so the spread is the other options.",
        tuple(
            (f"fig-option-{idx}", metric_vs_option(frame, option))
            for idx, option in enumerate(swept_options(frame, options))
        ),
    )
    return [table, fronts, by_option]


def write_sweep_report(csv_path: str | Path, path: str | Path, title: str | None = None) -> Path:
    """Write the HTML report of the sweep whose ``sweep.csv`` is at ``csv_path``."""
    frame = load_sweep_csv(csv_path)
    options = option_columns(csv_path, frame)
    title = title or f"servesim sweep: {len(frame)} points"
    lead = "Which configuration serves this trace best, and at what cost."
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(title, lead, sweep_sections(frame, options), SORT_JS), "utf-8")
    return out


def attainment_vs_rate(probes: pd.DataFrame, goodput: float) -> go.Figure:
    """Share of requests within both SLOs against arrival rate, one line per configuration,
    each probe with its 95% interval (batch means, where the rows hold it), and the target
    drawn across."""
    fig = go.Figure()
    for config, group in probes.groupby("config", sort=True):
        group = group.sort_values("rate")
        error_y = None
        if {"slo_attainment_low", "slo_attainment_high"} <= set(group.columns):
            error_y = {
                "type": "data",
                "symmetric": False,
                "array": group["slo_attainment_high"] - group["slo_attainment"],
                "arrayminus": group["slo_attainment"] - group["slo_attainment_low"],
            }
        fig.add_trace(
            go.Scatter(
                x=group["rate"],
                y=group["slo_attainment"],
                error_y=error_y,
                mode="lines+markers",
                name=f"config {config}",
            )
        )
    fig.add_hline(y=goodput, line_dash="dash", annotation_text=f"target {goodput:.0%}")
    fig.update_layout(
        title="SLO attainment against arrival rate",
        xaxis_title="arrival rate (req/s)",
        yaxis_title="share of requests within both SLOs",
        height=420,
    )
    return fig


def latency_vs_rate(probes: pd.DataFrame, metric: str) -> go.Figure:
    """Median, p90 and p99 of ``metric`` (``ttft`` or ``tpot``) against arrival rate."""
    fig = go.Figure()
    for config, group in probes.groupby("config", sort=True):
        group = group.sort_values("rate")
        for stat in ("median", "p90", "p99"):
            column = f"{stat}_{metric}_ms"
            if column in group.columns:
                fig.add_trace(
                    go.Scatter(
                        x=group["rate"],
                        y=group[column],
                        mode="lines+markers",
                        name=f"config {config} {stat}",
                    )
                )
    fig.update_layout(
        title=f"{metric.upper()} percentiles against arrival rate",
        xaxis_title="arrival rate (req/s)",
        yaxis_title=f"{metric.upper()} (ms)",
        yaxis_type="log",
        height=420,
    )
    return fig


def write_capacity_report(
    probes: Sequence[Mapping[str, Any]],
    configs: Sequence[Mapping[str, Any]],
    goodput: float,
    path: str | Path,
) -> Path:
    """Write the capacity search's report: each configuration's capacity and its probes."""
    probe_frame = pd.DataFrame(list(probes))
    config_frame = pd.DataFrame(list(configs))
    if probe_frame.empty:
        raise ValueError("no probe ran: nothing to report")
    columns = [c for c in config_frame.columns if c not in ("point", "run_dir", "status")]
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{escape('' if pd.isna(v) else _short(v))}</td>" for v in row)
        + "</tr>"
        for row in config_frame[columns].itertuples(index=False)
    )
    table = f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    sections = [
        Section(
            "capacity",
            "Capacity",
            "The highest probed rate that met the SLOs (the bracket's low end) per configuration.",
            body_html=f'<div class="table-wrap">{table}</div>',
        ),
        Section(
            "probes",
            "Probes",
            "Every probe of the search: attainment and latency percentiles against rate.",
            (
                ("fig-attainment", attainment_vs_rate(probe_frame, goodput)),
                ("fig-ttft-rate", latency_vs_rate(probe_frame, "ttft")),
                ("fig-tpot-rate", latency_vs_rate(probe_frame, "tpot")),
            ),
            grid=True,
        ),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    title = "servesim capacity search"
    lead = f"The highest arrival rate at which at least {goodput:.0%} of requests meet the SLOs."
    out.write_text(render_page(title, lead, sections, SORT_JS), "utf-8")
    return out
