"""The per-request TTFT error that step phase alone makes (``phase_floor``), from an engine run
by itself, and the error of the TTFT distribution (``distribution_error``): a different metric
from the per-request median |error|, reported beside it, never instead."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from records.step_shapes import StepShapeRecord

MEDIAN_GAP_SHARE = 1 - 2**-0.5
"""The median of |U1 - U2| for two independent uniforms on [0, 1] (its CDF is 1 - (1 - x)^2);
its mean is 1/3."""


def step_under_way(
    arrivals_s: Sequence[float], starts_s: Sequence[float], busy_s: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """For each arrival, the busy time D of the step under way when it came (steps start at
    ``starts_s``, in order, and keep the executor ``busy_s``) and the wait until that step ends;
    both 0 when the executor was between steps (idle, or in the microseconds between one step's
    update and the next step's start)."""
    arrivals = np.asarray(arrivals_s, dtype=float)
    starts, busy = np.asarray(starts_s, dtype=float), np.asarray(busy_s, dtype=float)
    if not starts.size:
        return np.zeros(arrivals.size), np.zeros(arrivals.size)
    idx = np.searchsorted(starts, arrivals, side="right") - 1
    safe = np.maximum(idx, 0)
    ends = starts[safe] + busy[safe]
    inside = (idx >= 0) & (arrivals < ends)
    return np.where(inside, busy[safe], 0.0), np.where(inside, ends - arrivals, 0.0)


def engine_steps(steps: Sequence[StepShapeRecord]) -> tuple[list[float], list[float]]:
    """An engine run's step starts and busy times (duration plus the update after it)."""
    return [s.start_s for s in steps], [s.busy_s for s in steps]


def mixture_median(ratios: Sequence[float]) -> float:
    """The median of R |U1 - U2| where R is drawn uniformly from ``ratios`` and U1, U2 are
    independent uniforms on [0, 1]: the t with mean_i F(t / r_i) = 1/2, F(x) = 1 - (1 - x)^2 on
    [0, 1] (F = 1 where r_i = 0), solved by bisection to 1e-12 of the largest ratio."""
    r = np.asarray(ratios, dtype=float)
    if r.size == 0:
        return float("nan")

    def cdf(t: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(r > 0, np.minimum(t / r, 1.0), 1.0)
        return float(np.mean(1 - (1 - x) ** 2))

    low, high = 0.0, float(r.max())
    if cdf(low) >= 0.5:
        return 0.0
    while high - low > 1e-12 * float(r.max()):
        mid = (low + high) / 2
        low, high = (low, mid) if cdf(mid) >= 0.5 else (mid, high)
    return (low + high) / 2


def phase_floor(requests: pd.DataFrame, steps: Sequence[StepShapeRecord]) -> dict[str, Any]:
    """How far two runs that price every step exactly, but whose step boundaries fall
    independently, would differ in per-request TTFT: a request arriving during a step of length
    D waits for it to end, a wait uniform in [0, D] in each run, so the two TTFTs differ by
    D |U1 - U2| (mean D/3). Exact, not sampled: |U1 - U2| has a closed-form distribution.

    ``expected_pct``: the median over requests of (D/3) / measured TTFT; ``median_pct``: the
    median of D |U1 - U2| / TTFT over requests and phases, the statistic the per-request median
    |error| estimates. Requests without a TTFT are left out."""
    frame = requests[["arrival_s", "ttft_ms"]].apply(pd.to_numeric, errors="coerce")
    frame = frame[np.isfinite(frame["ttft_ms"]) & (frame["ttft_ms"] > 0)]
    durations, _ = step_under_way(frame["arrival_s"].to_numpy(), *engine_steps(steps))
    ttft_s = frame["ttft_ms"].to_numpy() / 1e3
    ratios = durations / ttft_s
    if not len(ratios):
        return {"n": 0, "expected_pct": None, "median_pct": None}
    return {
        "n": len(ratios),
        "num_idle": int(np.sum(durations == 0)),
        "median_step_ms": float(np.median(durations[durations > 0]) * 1e3)
        if np.any(durations > 0)
        else 0.0,
        "median_ttft_ms": float(np.median(ttft_s) * 1e3),
        "expected_pct": float(100 * np.median(ratios / 3)),
        "median_pct": float(100 * mixture_median(ratios)),
    }


def distribution_error(rows: Sequence[dict[str, Any]], metric: str = "ttft") -> dict[str, Any]:
    """The error of the metric's distribution over the requests both runs finished: its median
    and p90, predicted against measured, and 100 (predicted - measured) / measured of each. Not
    the per-request error: two runs can share a distribution and differ request by request."""
    pairs = [
        (r[f"{metric}_meas"], r[f"{metric}_pred"])
        for r in rows
        if r.get(f"{metric}_meas") is not None and r.get(f"{metric}_pred") is not None
    ]
    out: dict[str, Any] = {"n": len(pairs)}
    if not pairs:
        return out
    measured, predicted = np.array(pairs, dtype=float).T
    for name, q in (("median", 50), ("p90", 90)):
        meas, pred = float(np.percentile(measured, q)), float(np.percentile(predicted, q))
        out[name] = {
            "measured": meas,
            "predicted": pred,
            "error_pct": 100 * (pred - meas) / meas if meas else None,
        }
    return out


Steps = tuple[Sequence[float], Sequence[float]]
"""A run's step starts and busy times, in order."""


def wait_split(
    measured: pd.DataFrame, measured_steps: Steps, predicted: pd.DataFrame, predicted_steps: Steps
) -> dict[str, Any]:
    """Each request's TTFT in two runs cut where the step under way at its arrival ends: the
    wait for that step, and the rest (TTFT minus that wait). Per part, the median over requests
    of |predicted - measured| / measured TTFT, in percent: how much of the per-request TTFT
    error is step phase (``wait_pct``) and how much is not (``rest_pct``); ``ttft_pct`` is the
    whole, the per-request median |error| itself."""
    columns = ["request_id", "arrival_s", "ttft_ms"]
    parts = []
    for frame, steps in ((measured, measured_steps), (predicted, predicted_steps)):
        frame = frame[columns].assign(request_id=frame["request_id"].astype(str))
        ttft = pd.to_numeric(frame["ttft_ms"], errors="coerce").to_numpy() / 1e3
        _, wait = step_under_way(frame["arrival_s"].to_numpy(dtype=float), *steps)
        parts.append(pd.DataFrame({"request_id": frame["request_id"], "ttft": ttft, "wait": wait}))
    joined = parts[0].merge(parts[1], on="request_id", suffixes=("_meas", "_pred"))
    joined = joined[np.isfinite(joined["ttft_meas"]) & np.isfinite(joined["ttft_pred"])]
    joined = joined[joined["ttft_meas"] > 0]
    if joined.empty:
        return {"n": 0, "ttft_pct": None, "wait_pct": None, "rest_pct": None}
    scale = joined["ttft_meas"]
    wait = (joined["wait_pred"] - joined["wait_meas"]).abs() / scale
    whole = (joined["ttft_pred"] - joined["ttft_meas"]).abs() / scale
    rest = (
        (joined["ttft_pred"] - joined["wait_pred"]) - (joined["ttft_meas"] - joined["wait_meas"])
    ).abs() / scale
    return {
        "n": len(joined),
        "ttft_pct": float(100 * whole.median()),
        "wait_pct": float(100 * wait.median()),
        "rest_pct": float(100 * rest.median()),
    }
