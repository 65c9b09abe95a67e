"""How a capacity search judges a rate: how long each probe must be for its verdict to be the
steady state's (``probe_requests``: the trace is repeated until a probe is that long), and how
sure the answer is (``confidence_bounds``: the probes whose SLO attainment interval clears the
target, from ``records.attainment``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sim.experiments.sweep_spec import RATE
from sim.run import RunConfig

# How long a probe must be to judge the steady state, not the transient of a short trace
# (see `probe_repeats`). On the bundled example (200 requests, max_num_seqs 256, TTFT 500 ms,
# TPOT 50 ms) the capacity came out at 131 req/s alone, 55 at 1,000 requests, 51 at 2,000 and
# 49.7 at both 5,000 and 10,000 (docs/sweep.md): 20 × the 256 sequences a replica runs at once.
MIN_PROBE_REQUESTS = 1000
CONCURRENCY_MULTIPLE = 20
# The window must also outlast the TTFT SLO many times over: a deployment that meets it leaves
# about TTFT / window of the offered prompt tokens unserved at the last arrival, which must stay
# well inside the overload check's 10% (records.overload.SERVED_SHARE_FLOOR).
WINDOW_TTFT_MULTIPLE = 20


def concurrency(config: RunConfig) -> int:
    """The most sequences the deployment runs at once by its batch limits (a batch's size for
    static and dynamic batching, ``max_num_seqs`` otherwise), over its replicas (the larger
    pool for disagg); KV memory may hold fewer."""
    policy = config.pool_policy if config.policy == "disagg" else config.policy
    per_replica = config.batch_size if policy in ("static", "dynamic") else config.max_num_seqs
    if config.policy == "disagg":
        return per_replica * max(config.num_prefill, config.num_decode)
    return per_replica * config.num_replicas


def probe_requests(config: RunConfig, rate: float, min_requests: int | None = None) -> int:
    """How many requests a probe at ``rate`` replays, at least: ``CONCURRENCY_MULTIPLE`` times
    the deployment's `concurrency` and ``MIN_PROBE_REQUESTS`` (or ``min_requests`` in their
    place, when given), and enough for the arrivals to span ``WINDOW_TTFT_MULTIPLE`` TTFT
    SLOs."""
    rule = max(MIN_PROBE_REQUESTS, CONCURRENCY_MULTIPLE * concurrency(config))
    count = rule if min_requests is None else min_requests
    if config.slo_ttft_s is not None:
        count = max(count, math.ceil(WINDOW_TTFT_MULTIPLE * config.slo_ttft_s * rate))
    return count


def probe_repeats(
    num_requests: int, config: RunConfig, rate: float, min_requests: int | None = None
) -> int:
    """How many times a probe replays a trace of ``num_requests`` (`probe_requests`)."""
    return max(1, math.ceil(probe_requests(config, rate, min_requests) / num_requests))


def clearly_passes(row: Mapping[str, Any], goodput: float) -> bool:
    """A probe that ran, was not overloaded, and whose whole attainment interval reaches
    ``goodput``."""
    low = row.get("slo_attainment_low")
    ok = row.get("status") == "ok" and row.get("overloaded") is not True
    return ok and low is not None and float(low) >= goodput


def clearly_fails(row: Mapping[str, Any], goodput: float) -> bool:
    """A probe that was overloaded, or whose whole attainment interval misses ``goodput``."""
    if row.get("status") != "ok":
        return False
    high = row.get("slo_attainment_high")
    return row.get("overloaded") is True or (high is not None and float(high) < goodput)


def confidence_bounds(
    probes: Sequence[Mapping[str, Any]], capacity_rate: float, goodput: float
) -> tuple[float | None, float | None]:
    """The rates between which the capacity lies with 95% confidence, as far as the probes
    tell: the fastest probe at or below ``capacity_rate`` that clearly passes, and the slowest
    above it that clearly fails (None where no probe is that clear). Narrower than the
    bracket it cannot be; it is wider where probes near the answer pass or fail by less than
    their attainment's sampling error."""
    rates = [(float(row[RATE]), row) for row in probes if row.get(RATE) is not None]
    passed = [r for r, row in rates if r <= capacity_rate and clearly_passes(row, goodput)]
    failed = [r for r, row in rates if r > capacity_rate and clearly_fails(row, goodput)]
    return (max(passed) if passed else None), (min(failed) if failed else None)
