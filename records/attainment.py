"""SLO attainment with its confidence interval, by batch means: the requests in arrival order
are cut into ``NUM_BATCHES`` consecutive batches, and the interval is Student's t over the
batches' attainments. Consecutive requests share a queue, so they are not independent draws
(a binomial interval would be far too narrow); batches of many requests each nearly are
(Law and Kelton, "Simulation Modeling and Analysis", the method of batch means). A run whose
queue grows shows it too: its early batches pass and its late ones fail, which widens the
interval."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from core.request import Request, RequestStatus

NUM_BATCHES = 10
T_975 = 2.2622  # Student's t: the 97.5th percentile with NUM_BATCHES - 1 = 9 degrees of freedom
CONFIDENCE = 0.95


def good_in_arrival_order(
    requests: Sequence[Request], slo_ttft_s: float | None, slo_tpot_s: float | None
) -> np.ndarray:
    """Whether each request, in arrival order, finished within both SLOs, as the summary's
    goodput counts it (a request with no TTFT or no TPOT meets that SLO)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)  # (stable: ties keep trace order)
    good = np.empty(len(ordered), dtype=bool)
    for idx, request in enumerate(ordered):
        ttft, tpot = request.ttft_s, request.tpot_s
        good[idx] = (
            request.status is RequestStatus.FINISHED
            and (slo_ttft_s is None or ttft is None or ttft <= slo_ttft_s)
            and (slo_tpot_s is None or tpot is None or tpot <= slo_tpot_s)
        )
    return good


def attainment_interval(good: np.ndarray) -> tuple[float, float] | None:
    """The ``CONFIDENCE`` interval of the share of good requests by batch means, clipped to
    [0, 1]; None with fewer requests than batches."""
    if good.size < NUM_BATCHES:
        return None
    means = np.array([batch.mean() for batch in np.array_split(good, NUM_BATCHES)])
    half = T_975 * float(means.std(ddof=1)) / math.sqrt(NUM_BATCHES)
    centre = float(means.mean())
    return max(0.0, centre - half), min(1.0, centre + half)
