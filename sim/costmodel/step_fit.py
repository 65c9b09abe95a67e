"""The shape of a profile's joint step fit (``step_fit: joint``, `CalibratedCostModel`): how
its scales vary with a step's size, and the robust least-absolute fit behind them.

Why scales that vary: on a CPU the tables are timed one op at a time, each hot in the cache,
while a whole step runs every layer's weights and KV once. One token scale left the whole steps
of tiny-llama 31% slower than the model at one token and 20% faster at four to eight (three
calibrations on the 2-core machine, 2026-11-27), and one decode-attention scale could not fit
one long sequence (-30%) and sixteen at once (+13%). With a scale on each of a few knots over
log2(tokens), and a decode-attention scale linear in log2(the batch's context tokens), each
profile's own steps scatter 3-7% around its model instead of 8-18%, and two calibrations of the
same machine predict the same steps 2-3% apart instead of 2-8% (docs/validation.md)."""

from __future__ import annotations

import math
import statistics
from typing import Final

import numpy as np

TOKEN_KNOTS: Final = (0.0, 2.0, 4.0, 6.0, 8.0, 11.0)
"""log2 of a step's batched tokens at which the token scale is fitted (1 to 2048 tokens;
linear in between, constant beyond)."""
DECODE_KNOTS: Final = (4.0, 20.0)
"""log2 of a step's decode context tokens (16 to 1M) between which the decode-attention
scale is linear."""
L1_ROUNDS: Final = 100
L1_FLOOR: Final = 1e-3
"""A residual under this share of its step weighs as if it were this large (IRLS)."""


def hat(value: float, knots: tuple[float, ...]) -> np.ndarray:
    """The weights of ``log2(value)`` on ``knots``' piecewise-linear basis (clamped at the
    ends; each row sums to 1)."""
    x = math.log2(max(value, 1.0))
    x = min(max(x, knots[0]), knots[-1])
    out = np.zeros(len(knots))
    j = min(max(0, int(np.searchsorted(knots, x, side="right")) - 1), len(knots) - 2)
    t = (x - knots[j]) / (knots[j + 1] - knots[j])
    out[j], out[j + 1] = 1.0 - t, t
    return out


def pinned_lstsq(
    data: np.ndarray, target: np.ndarray, weight: np.ndarray, pinned_at: np.ndarray
) -> np.ndarray:
    """Weighted least squares of ``data @ coef = target``; a coefficient that comes out
    negative is pinned at its ``pinned_at`` value and the rest fitted again."""
    free = np.ones(data.shape[1], dtype=bool)
    coef = pinned_at.copy()
    while free.any():
        rows = data * weight[:, None]
        rhs = (target - data[:, ~free] @ pinned_at[~free]) * weight
        solved, *_ = np.linalg.lstsq(rows[:, free], rhs, rcond=None)
        coef = pinned_at.copy()
        coef[free] = solved
        negative = free & (coef < 0)
        if not negative.any():
            return coef
        free &= ~negative
    return coef


def least_absolute(
    data: np.ndarray,
    target: np.ndarray,
    measured: np.ndarray,
    weight: np.ndarray,
    pinned_at: np.ndarray,
) -> np.ndarray:
    """The coefficients that minimise the weighted sum of |residual| (``weight x |data @ coef -
    target|``; ``weight`` is 1 / ``measured`` or a multiple, so each is a relative residual),
    by iteratively reweighted least squares from the least-squares start: a step slowed by
    load moves them no more than any other step does, so that small differences between two
    calibrations' data give small differences in their fits. The pinning of negative
    coefficients can stop the iteration from descending: the best iterate is returned."""
    coef = pinned_lstsq(data, target, weight, pinned_at)
    best, best_cost = coef, float(np.sum(weight * np.abs(data @ coef - target)))
    for _ in range(L1_ROUNDS):
        # Weights whose least squares is this iterate's weighted sum of |residual|.
        residual = np.maximum(np.abs(data @ coef - target), L1_FLOOR * measured)
        coef = pinned_lstsq(data, target, np.sqrt(weight / residual), pinned_at)
        cost = float(np.sum(weight * np.abs(data @ coef - target)))
        if cost < best_cost:
            best, best_cost = coef, cost
    return best


PREPARE_KNOT_STEPS: Final = 3
"""A batch size with fewer of a profile's decode-only steps than this is no knot of its
preparation table (``prepare_table``)."""


def median_by_size(
    sizes: list[int], times_s: list[float], min_count: int = PREPARE_KNOT_STEPS
) -> tuple[tuple[int, float], ...]:
    """``(size, median seconds)`` for each size seen ``min_count`` times or more, ascending: a
    table of the steps' times by their batch size (also ``fidelity.host_speed``'s probe)."""
    by_size: dict[int, list[float]] = {}
    for size, time_s in zip(sizes, times_s, strict=True):
        by_size.setdefault(size, []).append(time_s)
    return tuple(
        (size, float(np.median(times)))
        for size, times in sorted(by_size.items())
        if len(times) >= min_count
    )


def prepare_table(sizes: list[int], prepare_s: list[float]) -> tuple[tuple[int, float], ...] | None:
    """The median input preparation of a profile's decode-only whole steps by their batch size
    (``median_by_size``); None for fewer than two sizes seen ``PREPARE_KNOT_STEPS`` times."""
    knots = median_by_size(sizes, prepare_s)
    return knots if len(knots) >= 2 else None


def prepare_at(knots: tuple[tuple[int, float], ...], num_seqs: int) -> float:
    """``prepare_table``'s seconds at ``num_seqs`` sequences: linear between its knots, the end
    knot's beyond them."""
    sizes = [size for size, _ in knots]
    return float(np.interp(num_seqs, sizes, [time_s for _, time_s in knots]))


def theil_sen(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(intercept, slope)`` of a line through ``(x, y)`` points with two or more distinct
    ``x``: the median pairwise slope, floored at zero, then the median intercept under it
    (robust to a few points slowed by load)."""
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    slope = max(0.0, statistics.median(slopes))
    return statistics.median(y - slope * x for x, y in points), slope
