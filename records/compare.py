"""Per-request error of one run against another (a simulation against a measured run, or the
engine against the simulator): both request frames joined by ``request_id``.

For each metric and each request finished in both runs, the signed error is
``100 x (predicted - measured) / measured`` percent. A metric's row gives the median and p90 of
the absolute errors and the bias, the median signed error (positive: predicted too slow).
Metrics are the ``requests.csv`` columns: TTFT (first token - arrival), TPOT ((finish - first
token) / (emissions - 1)), ITL (the request's largest gap between emissions, where both runs
record gaps) and E2E (finish - arrival).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

COMPARED_METRICS: tuple[tuple[str, str], ...] = (
    ("TTFT", "ttft_ms"),
    ("TPOT", "tpot_ms"),
    ("ITL max", "itl_max_ms"),
    ("E2E", "e2el_ms"),
)
_FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class MetricError:
    """One metric's per-request error summary; percentages, NaN when no request compares."""

    metric: str
    num_requests: int
    median_abs_pct: float
    p90_abs_pct: float
    bias_pct: float
    measured_median_ms: float
    predicted_median_ms: float

    def __post_init__(self) -> None:
        if self.num_requests < 0:
            raise ValueError(f"MetricError.num_requests must be >= 0, got {self.num_requests!r}")


@dataclass(frozen=True, slots=True)
class Comparison:
    """Error rows plus how the join went: requests in both runs, and those only in one."""

    errors: tuple[MetricError, ...]
    num_joined: int
    only_measured: int
    only_predicted: int

    def by_metric(self) -> dict[str, MetricError]:
        return {e.metric: e for e in self.errors}


def _finished(frame: pd.DataFrame, which: str) -> pd.DataFrame:
    if "request_id" not in frame.columns:
        raise ValueError(f"{which} requests have no request_id column")
    if frame["request_id"].duplicated().any():
        duplicate = frame.loc[frame["request_id"].duplicated(), "request_id"].iloc[0]
        raise ValueError(f"{which} requests repeat request_id {duplicate!r}")
    if "status" in frame.columns:
        frame = frame[frame["status"] == _FINISHED]
    return frame.set_index(frame["request_id"].astype(str))


def metric_error(metric: str, measured: pd.Series, predicted: pd.Series) -> MetricError:
    """Error of aligned ``predicted`` against ``measured`` values (same index); pairs where
    either is missing, or the measured value is not positive, are left out."""
    meas = pd.to_numeric(measured, errors="coerce").to_numpy(float)
    pred = pd.to_numeric(predicted, errors="coerce").to_numpy(float)
    keep = np.isfinite(meas) & np.isfinite(pred) & (meas > 0)
    meas, pred = meas[keep], pred[keep]
    if not meas.size:
        nan = math.nan
        return MetricError(metric, 0, nan, nan, nan, nan, nan)
    signed = 100.0 * (pred - meas) / meas
    absolute = np.abs(signed)
    return MetricError(
        metric,
        int(meas.size),
        float(np.median(absolute)),
        float(np.percentile(absolute, 90)),
        float(np.median(signed)),
        float(np.median(meas)),
        float(np.median(pred)),
    )


def compare_requests(measured: pd.DataFrame, predicted: pd.DataFrame) -> Comparison:
    """Join finished requests by id and summarise each metric's per-request error."""
    meas = _finished(measured, "measured")
    pred = _finished(predicted, "predicted")
    joined = meas.index.intersection(pred.index)
    if not len(joined):
        raise ValueError(
            "no request is finished in both runs under the same request_id "
            f"(measured has {len(meas)}, predicted {len(pred)})"
        )
    errors = []
    for name, column in COMPARED_METRICS:
        if column in meas.columns and column in pred.columns:
            errors.append(metric_error(name, meas.loc[joined, column], pred.loc[joined, column]))
    return Comparison(
        tuple(errors),
        len(joined),
        len(meas.index.difference(pred.index)),
        len(pred.index.difference(meas.index)),
    )


def format_comparison(comparison: Comparison) -> str:
    """A plain-text table, one metric a row (metrics no request compares on are left out)."""
    lines = [
        f"{'metric':<8} {'requests':>8} {'median |err|':>13} {'p90 |err|':>10} {'bias':>8} "
        f"{'measured':>11} {'predicted':>11}",
    ]
    for e in comparison.errors:
        if not e.num_requests:
            continue
        lines.append(
            f"{e.metric:<8} {e.num_requests:>8} {e.median_abs_pct:>12.1f}% {e.p90_abs_pct:>9.1f}% "
            f"{e.bias_pct:>+7.1f}% {e.measured_median_ms:>8.1f} ms {e.predicted_median_ms:>8.1f} ms"
        )
    lines.append(
        f"{comparison.num_joined} requests compared; {comparison.only_measured} finished only in "
        f"the measured run, {comparison.only_predicted} only in the prediction. bias: median "
        "signed error (+: predicted slower); measured/predicted: medians."
    )
    return "\n".join(lines)
