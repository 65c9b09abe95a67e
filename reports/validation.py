"""The validation section: the simulator against the real engine, from ``validation.json``'s
content (``fidelity.validate``): predicted-vs-measured scatters, error CDFs, and the cost model's
step-time error by batch size and by context."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from reports.html import Section, render_page
from reports.theme import new_figure, run_color

METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL (longest gap)", "e2e": "E2E"}


def _models(result: dict[str, Any]) -> list[tuple[int, str, dict[str, Any]]]:
    return [(i, name, model) for i, (name, model) in enumerate(result["models"].items())]


def request_scatter(result: dict[str, Any], metric: str) -> go.Figure:
    """Per request, the simulated ``metric`` against the engine's (the diagonal is exact)."""
    name = METRIC_NAMES[metric]
    fig = new_figure(f"{name}: simulated vs measured", "measured (ms)", "simulated (ms)")
    top = 0.0
    for idx, label, model in _models(result):
        rows = [
            r
            for r in model["requests"]["rows"]
            if r[f"{metric}_meas"] is not None and r[f"{metric}_pred"] is not None
        ]
        xs = [r[f"{metric}_meas"] for r in rows]
        ys = [r[f"{metric}_pred"] for r in rows]
        top = max([top, *xs, *ys])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=label,
                marker={"color": run_color(idx), "size": 5},
                text=[r["request_id"] for r in rows],
            )
        )
    fig.add_trace(
        go.Scatter(x=[0, top], y=[0, top], mode="lines", name="exact", line={"dash": "dot"})
    )
    return fig


def error_cdf(result: dict[str, Any], metric: str) -> go.Figure:
    """Distribution of the per-request signed % error of ``metric``, per cost model."""
    name = METRIC_NAMES[metric]
    fig = new_figure(f"{name}: error CDF", "error (%): simulated vs measured", "share of requests")
    for idx, label, model in _models(result):
        errors = sorted(
            100.0 * (r[f"{metric}_pred"] - r[f"{metric}_meas"]) / r[f"{metric}_meas"]
            for r in model["requests"]["rows"]
            if r[f"{metric}_meas"] and r[f"{metric}_pred"] is not None
        )
        shares = np.arange(1, len(errors) + 1) / max(1, len(errors))
        fig.add_trace(
            go.Scatter(
                x=errors,
                y=shares.tolist(),
                mode="lines",
                name=label,
                line={"color": run_color(idx), "shape": "hv"},
            )
        )
    return fig


def step_error_by(result: dict[str, Any], axis: str, title: str) -> go.Figure:
    """The cost model's % error on each of the engine's own steps, against ``axis`` of the
    step (``num_seqs``, ``num_tokens`` or ``sum_context``)."""
    fig = new_figure(f"Step-time error by {title}", title, "error (%): predicted vs measured")
    for idx, label, model in _models(result):
        rows = [r for r in model["steps"]["rows"] if r["measured_s"] > 0]
        fig.add_trace(
            go.Scatter(
                x=[r[axis] for r in rows],
                y=[100.0 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rows],
                mode="markers",
                name=label,
                marker={"color": run_color(idx), "size": 4, "opacity": 0.6},
                text=[r["kind"] for r in rows],
            )
        )
    return fig


def step_scatter(result: dict[str, Any]) -> go.Figure:
    """Per engine step, the cost model's time against the measured one (ms)."""
    fig = new_figure("Step time: predicted vs measured", "measured (ms)", "predicted (ms)")
    top = 0.0
    for idx, label, model in _models(result):
        rows = model["steps"]["rows"]
        xs = [1000 * r["measured_s"] for r in rows]
        ys = [1000 * r["predicted_s"] for r in rows]
        top = max([top, *xs, *ys])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=label,
                marker={"color": run_color(idx), "size": 4, "opacity": 0.6},
                text=[r["kind"] for r in rows],
            )
        )
    fig.add_trace(
        go.Scatter(x=[0, top], y=[0, top], mode="lines", name="exact", line={"dash": "dot"})
    )
    return fig


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def error_table(result: dict[str, Any]) -> str:
    """Median / p90 absolute and signed bias, per metric and cost model, and per step kind."""
    head = "<tr><th>cost model</th><th>quantity</th><th>n</th><th>median |err|</th>"
    head += "<th>p90 |err|</th><th>bias</th></tr>"
    rows = []
    for _, label, model in _models(result):
        items = [(METRIC_NAMES[m], s) for m, s in model["requests"]["metrics"].items()] + [
            (f"step: {k}", s) for k, s in model["steps"]["by_kind"].items()
        ]
        items.append(("step: all", model["steps"]["all"]))
        for name, stats in items:
            rows.append(
                f"<tr><td>{escape(label)}</td><td>{escape(name)}</td><td>{stats['n']}</td>"
                f"<td>{_pct(stats['median_abs_pct'])}</td><td>{_pct(stats['p90_abs_pct'])}</td>"
                f"<td>{_pct(stats['bias_pct'])}</td></tr>"
            )
    return f"<table>{head}{''.join(rows)}</table>"


def compared_text(result: dict[str, Any]) -> str:
    """What was compared, in words: the engine's kind, clock and decode split, the profile's
    own spread and its GPU time's scale, the run's slow tail under the calibrated model, the
    engine against itself (the noise floor) where it was run twice, and the run's host against
    the calibration's where it was measured."""
    kind, clock = result.get("engine_kind", "servesim-eager"), result.get("engine_clock", "wall")
    parts = [f"Engine {kind} (clock {clock}, decode split {result.get('decode_split', 'fixed')})."]
    spread = result.get("profile_spread") or {}
    if "steps_spread_pct" in spread:
        parts.append(
            f"The profile's whole steps scatter {spread['steps_spread_pct']:.1f}% (median) "
            "around its host fit."
        )
    if "table_spread_pct" in spread:
        parts.append(f"Its table points spread {spread['table_spread_pct']:.1f}% (median).")
    if spread.get("device_scale", 1.0) != 1.0:
        parts.append(
            f"Its GPU time is scaled by {spread['device_scale']:.2f}, as its GPU-bound whole "
            "steps measured."
        )
    tail = (result.get("models", {}).get("calibrated") or {}).get("tail") or {}
    if "tail_pts" in tail:
        text = (
            f"The run's decode-only steps took {tail['total_pct']:+.1f}% against the calibrated "
            f"model in total and {tail['median_step_pct']:+.1f}% by median step: its slow steps "
            f"add {tail['tail_pts']:+.1f} points to a TPOT"
        )
        if "tail_without_hiccups_pts" in tail:
            text += (
                f", {tail['tail_without_hiccups_pts']:+.1f} without the "
                f"{100 * tail['hiccup_share']:.1f}% whose input preparation ran slow too "
                "(the host's stalls)"
            )
        parts.append(text + ".")
    floor = (result.get("engine_floor") or {}).get("requests", {}).get("metrics", {})
    cells = [
        f"{METRIC_NAMES[m]} {floor[m]['median_abs_pct']:.1f}%"
        for m in ("ttft", "tpot", "e2e")
        if m in floor
    ]
    if cells:
        parts.append(
            "The engine against itself (its noise floor), median |difference| per request: "
            + ", ".join(cells)
            + "."
        )
    else:
        parts.append("No second run of the engine was given, so there is no noise floor.")
    speed = result.get("host_speed") or {}
    if "slowdown" in speed:
        parts.append(
            f"The run's host was {speed['slowdown']:.2f}x as slow as the calibration's, from "
            "their input preparation; the simulator priced it at "
            f"{speed.get('applied', 1.0):.2f}x."
        )
    elif speed.get("applied", 1.0) != 1.0:
        parts.append(f"The simulator priced the run's host at {speed['applied']:.2f}x.")
    return " ".join(parts)


def validation_sections(result: dict[str, Any]) -> list[Section]:
    metrics = [
        m for m in METRIC_NAMES if any(m in x["requests"]["metrics"] for _, _, x in _models(result))
    ]
    lead = (
        f"Trace {result['trace']}, {result['num_requests']} requests: the simulator "
        "(calibrated profile and analytic roofline) against the real engine. Error is "
        "100 x (simulated - measured) / measured; bias is its mean. " + compared_text(result)
    )
    return [
        Section("validation", "Validation against the engine", lead, body_html=error_table(result)),
        Section(
            "validation-requests",
            "Per request",
            "Simulated against measured, one point per request, and the error's distribution.",
            tuple(
                [(f"fig-val-scatter-{m}", request_scatter(result, m)) for m in metrics]
                + [(f"fig-val-cdf-{m}", error_cdf(result, m)) for m in metrics]
            ),
            grid=True,
        ),
        Section(
            "validation-steps",
            "Per step: the cost model on the engine's own batches",
            "Each engine step priced by the cost model: its pure error, without scheduling drift.",
            (
                ("fig-val-steps", step_scatter(result)),
                ("fig-val-steps-seqs", step_error_by(result, "num_seqs", "batch size (seqs)")),
                ("fig-val-steps-tokens", step_error_by(result, "num_tokens", "tokens in step")),
                ("fig-val-steps-context", step_error_by(result, "sum_context", "total context")),
            ),
            grid=True,
        ),
    ]


def write_validation_report(result: dict[str, Any], path: str | Path) -> Path:
    """One self-contained HTML page of the validation sections."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    title = f"servesim validation: {result['trace']}"
    lead = "How far the simulator is from the real engine, per request and per step."
    out.write_text(render_page(title, lead, validation_sections(result)), encoding="utf-8")
    return out
