"""The comparison maths of ``python -m sim validate``: per-request error of a simulated run
against a measured one, the cost model's error on the measured run's own steps, aggregates,
and where the two runs' batches first diverge.

Percent error is ``100 * (predicted - measured) / measured``. Per metric we report the median
and p90 of its absolute value and the signed bias (the mean of the signed error: positive when
the simulator is slow, negative when it is fast).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from records.step_shapes import StepShapeRecord, shapes_equal
from sim.costmodel.step_shape import StepShape

REQUEST_METRICS: dict[str, str] = {
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "itl": "itl_max_ms",
    "e2e": "e2el_ms",
}
"""Per-request metrics compared, and their ``requests.csv`` column. ITL per request is its
longest gap between tokens (``itl_max_ms``): the mean gap is TPOT already, and the longest is
where a prefill stalls a decode."""

AGGREGATES = (
    "output_throughput",
    "request_throughput",
    "num_preemptions",
    "num_recomputed_tokens",
    "num_prefix_hit_tokens",
    "prefix_hit_rate",
    "completed",
)
STEP_KINDS = ("prefill-heavy", "decode-only", "mixed")
EARLY_SHARE = 0.2
"""The early part of a run in ``phase_stats``: its first fifth of steps. On the recorded H200
runs the engine's prefill-heavy steps ran 20-25% slower there than later (a warm-up)."""
DECODE_SKEWS = ("uniform", "skewed")
DECODE_BATCHES: tuple[tuple[int, int | None], ...] = (
    (1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, None),
)  # fmt: skip
"""The decode-only steps' batch sizes, grouped (``by_decode_batch``; None: no upper bound)."""
SKEWED_MAX_OVER_MEAN = 1.5
"""A decode batch is ``skewed`` when its longest context is at least this times its mean: where
a cost model that prices decode attention at the mean context (or at the longest) would show
its error, if the kernel's cost does not follow that rule."""


def error_stats(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, Any]:
    """Median and p90 absolute % error, signed bias (mean signed % error) and median signed %
    error, over the pairs where both are finite and the measured value is positive."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    if p.shape != m.shape:
        raise ValueError(f"predicted has {p.size} values, measured {m.size}")
    keep = np.isfinite(p) & np.isfinite(m) & (m > 0)
    if not keep.any():
        return {
            "n": 0,
            "median_abs_pct": None,
            "p90_abs_pct": None,
            "bias_pct": None,
            "median_pct": None,
        }
    pct = 100.0 * (p[keep] - m[keep]) / m[keep]
    return {
        "n": int(keep.sum()),
        "median_abs_pct": float(np.median(np.abs(pct))),
        "p90_abs_pct": float(np.percentile(np.abs(pct), 90)),
        "bias_pct": float(np.mean(pct)),
        "median_pct": float(np.median(pct)),
    }


def join_requests(measured: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """One row per request id present in both frames, columns suffixed ``_meas``/``_pred``.
    Request ids must be unique in each."""
    for name, frame in (("measured", measured), ("predicted", predicted)):
        if "request_id" not in frame.columns:
            raise ValueError(f"{name} requests have no 'request_id' column")
        dupes = frame["request_id"].astype(str)
        if dupes.duplicated().any():
            raise ValueError(
                f"{name} requests: request_id {dupes[dupes.duplicated()].iloc[0]!r} repeats"
            )
    left = measured.assign(request_id=measured["request_id"].astype(str))
    right = predicted.assign(request_id=predicted["request_id"].astype(str))
    return left.merge(right, on="request_id", how="inner", suffixes=("_meas", "_pred"))


def request_errors(measured: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, Any]:
    """Per-metric error stats over the requests both runs finished, and the joined rows."""
    joined = join_requests(measured, predicted)
    out: dict[str, Any] = {"num_joined": len(joined), "metrics": {}}
    for metric, column in REQUEST_METRICS.items():
        if f"{column}_meas" not in joined.columns:
            continue
        out["metrics"][metric] = error_stats(joined[f"{column}_pred"], joined[f"{column}_meas"])
    out["rows"] = [
        {
            "request_id": row["request_id"],
            **{
                f"{metric}_{side}": _num(row.get(f"{column}_{side}"))
                for metric, column in REQUEST_METRICS.items()
                for side in ("meas", "pred")
            },
        }
        for row in joined.to_dict("records")
    ]
    return out


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def shape_of(record: StepShapeRecord) -> StepShape:
    return StepShape(
        prefill_chunks=record.prefill_chunks,
        decode_context_tokens=record.decode_context_tokens,
        num_padding_tokens=record.num_padding_tokens,
        num_copy_blocks=record.num_copy_blocks,
        num_swap_out_blocks=record.num_swap_out_blocks,
        num_swap_in_blocks=record.num_swap_in_blocks,
    )


def step_errors(
    steps: Sequence[StepShapeRecord],
    price: Callable[[StepShape], float],
    breakdown: Callable[[StepShape], dict[str, float]] | None,
) -> dict[str, Any]:
    """The cost model's error on the measured run's own batches (each step's busy time:
    duration plus update), overall and by batch shape, with one row per step."""
    rows = []
    for record in steps:
        shape = shape_of(record)
        row: dict[str, Any] = {
            "step_idx": record.step_idx,
            "kind": record.kind,
            "num_seqs": shape.num_seqs,
            "num_tokens": shape.num_batched_tokens,
            "sum_context": sum(record.decode_context_tokens)
            + sum(n + c for n, c in record.prefill_chunks),
            "measured_s": record.busy_s,
            "predicted_s": price(shape),
            "decode_skew": decode_skew(record.decode_context_tokens),
        }
        if breakdown is not None:
            row["terms"] = breakdown(shape)
        rows.append(row)
    out: dict[str, Any] = {"all": _stats_of(rows), "by_kind": {}, "by_decode_skew": {}}
    for kind in STEP_KINDS:
        out["by_kind"][kind] = _stats_of([r for r in rows if r["kind"] == kind])
    for skew in DECODE_SKEWS:
        out["by_decode_skew"][skew] = _stats_of([r for r in rows if r["decode_skew"] == skew])
    out["by_decode_batch"] = decode_batch_stats(rows)
    out["by_phase"] = phase_stats(rows)
    out["rows"] = rows
    return out


def decode_batch_stats(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The decode-only steps' error by batch size (``DECODE_BATCHES``, labelled "1", "3-4",
    "65+"), the groups with steps only: where a model's error sits by batch, which a median
    over all the steps hides (a fixed cost priced wrong shows at one sequence, a per-sequence
    one at many)."""
    out: dict[str, dict[str, Any]] = {}
    decodes = [r for r in rows if r["kind"] == "decode-only"]
    for low, high in DECODE_BATCHES:
        chosen = [
            r for r in decodes if low <= r["num_seqs"] and (high is None or r["num_seqs"] <= high)
        ]
        if chosen:
            label = f"{low}+" if high is None else str(low) if low == high else f"{low}-{high}"
            out[label] = _stats_of(chosen)
    return out


def phase_stats(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The step error by run phase (``early``: the first EARLY_SHARE of the steps in run order;
    ``rest``) and by step kind: whether the engine ran slower early on than the model."""
    cut = math.ceil(EARLY_SHARE * len(rows))
    return {
        phase: {kind: _stats_of([r for r in picked if r["kind"] == kind]) for kind in STEP_KINDS}
        for phase, picked in (("early", rows[:cut]), ("rest", rows[cut:]))
    }


def decode_skew(contexts: Sequence[int]) -> str | None:
    """``uniform`` or ``skewed`` (see SKEWED_MAX_OVER_MEAN) for a step with two or more decodes;
    None otherwise."""
    if len(contexts) < 2:
        return None
    mean = sum(contexts) / len(contexts)
    return "skewed" if max(contexts) >= SKEWED_MAX_OVER_MEAN * mean else "uniform"


def _stats_of(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    stats = error_stats([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    stats["measured_mean_s"] = float(np.mean([r["measured_s"] for r in rows])) if rows else None
    stats["predicted_mean_s"] = float(np.mean([r["predicted_s"] for r in rows])) if rows else None
    residuals = [r["measured_s"] - r["predicted_s"] for r in rows]
    stats["median_residual_s"] = float(np.median(residuals)) if rows else None
    return stats


def total_and_median(stats: dict[str, Any]) -> tuple[float, float] | None:
    """Of a group of steps (``_stats_of``): how much longer than priced they took in total,
    and how much the median step did (measured / predicted - 1, in %). Their difference is
    the group's slow tail, which a mean over steps (a request's TPOT) carries and a median
    does not. None without steps."""
    measured, predicted = stats.get("measured_mean_s"), stats.get("predicted_mean_s")
    median = stats.get("median_pct")
    if not measured or not predicted or median is None:
        return None
    # median_pct is (predicted - measured) / measured; turned round: measured / predicted - 1.
    return 100 * (measured / predicted - 1), -median / (1 + median / 100)


def tail_stats(
    rows: Sequence[dict[str, Any]], host_ratios: Sequence[float | None] | None, hiccup: float
) -> dict[str, Any]:
    """The decode-only steps' slow tail (``total_and_median`` of them, and its points), and
    with ``host_ratios`` (each step's input preparation against the run's own table, in the
    order of ``rows``) the same without the steps whose preparation ran ``hiccup`` times its
    fit or more: how much of the tail the host's own stalls carry."""
    picked = [i for i, r in enumerate(rows) if r["kind"] == "decode-only"]
    out: dict[str, Any] = {"n": len(picked)}
    figures = total_and_median(_stats_of([rows[i] for i in picked]))
    if figures is None:
        return out
    out["total_pct"], out["median_step_pct"] = figures
    out["tail_pts"] = figures[0] - figures[1]
    if host_ratios is None:
        return out
    calm = [i for i in picked if (host_ratios[i] or 0.0) < hiccup]
    rest = total_and_median(_stats_of([rows[i] for i in calm]))
    out["hiccup"] = hiccup
    out["hiccup_share"] = 1 - len(calm) / len(picked)
    if rest is not None:
        out["tail_without_hiccups_pts"] = rest[0] - rest[1]
    return out


def term_shares(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per step kind, the mean seconds of each cost-model term beside the mean measured and
    predicted step: which term carries the error."""
    out: dict[str, dict[str, float]] = {}
    for kind in STEP_KINDS:
        picked = [r for r in rows if r["kind"] == kind and "terms" in r]
        if not picked:
            continue
        terms = {k: float(np.mean([r["terms"][k] for r in picked])) for k in picked[0]["terms"]}
        out[kind] = {
            "measured_s": float(np.mean([r["measured_s"] for r in picked])),
            "predicted_s": float(np.mean([r["predicted_s"] for r in picked])),
            **{f"term_{k}": v for k, v in terms.items() if v},
        }
    return out


def aggregates(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """Each run-level figure of the two summaries side by side, with the % error when the
    measured one is non-zero."""
    out: dict[str, Any] = {}
    for key in AGGREGATES:
        meas, pred = _num(measured.get(key)), _num(predicted.get(key))
        error = None
        if meas is not None and pred is not None and meas != 0:
            error = 100.0 * (pred - meas) / meas
        out[key] = {"measured": meas, "predicted": pred, "error_pct": error}
    return out


def first_divergence(
    measured: Sequence[StepShapeRecord], predicted: Sequence[StepShapeRecord]
) -> dict[str, Any]:
    """The first step index where the two runs' batches differ (requests, chunk sizes or
    contexts), with both batches; ``step_idx`` None when one run's steps are a prefix of the
    other's and the lengths match."""
    for idx, (a, b) in enumerate(zip(measured, predicted, strict=False)):
        if not shapes_equal(a, b):
            return {
                "step_idx": idx,
                "measured": a.to_json(),
                "predicted": b.to_json(),
                "num_identical_steps": idx,
            }
    if len(measured) != len(predicted):
        idx = min(len(measured), len(predicted))
        return {
            "step_idx": idx,
            "measured": measured[idx].to_json() if idx < len(measured) else None,
            "predicted": predicted[idx].to_json() if idx < len(predicted) else None,
            "num_identical_steps": idx,
        }
    return {"step_idx": None, "num_identical_steps": len(measured)}
