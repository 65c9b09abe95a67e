"""The run summary, named after vLLM's serving benchmark (``mean_ttft_ms``, ``p99_itl_ms``,
``request_throughput``...).

Definitions (all latencies from the request's own timestamps):
- TTFT: first token time − arrival time.
- TPOT: (last token time − first token time) / (token emissions − 1), per request; a request
  with one output token has none. With ``n > 1`` one emission is one step's tokens for all
  samples.
- ITL: every gap between consecutive token emissions of a request, pooled over all requests.
- E2EL: finish time − arrival time (a static batch finishes its members when it ends).
- Goodput: finished requests per second whose TTFT and TPOT meet the given SLOs.
- Prefix hit rate: prefix-cache hit tokens over looked-up tokens, both summed over every
  admission of every request (as vLLM's prefix-cache stats count queries). A request admitted
  again after a recompute preemption looks its known tokens up again, and hits on its own
  blocks count once more in both, so the rate stays within [0, 1]: it is the share of the
  tokens presented to the cache that the cache supplied, not a share of the trace's prompts.
"""

from __future__ import annotations

import itertools
import math
import struct
from array import array
from collections.abc import Iterator, Sequence

import numpy as np

from engine.core.request import Request, RequestStatus

PERCENTILES = (50, 90, 99)


def _stats(prefix: str, values: list[float], out: dict[str, float | int | None]) -> None:
    arr = np.asarray(values, dtype=float) * 1000.0
    out[f"mean_{prefix}_ms"] = float(arr.mean()) if arr.size else None
    out[f"std_{prefix}_ms"] = float(arr.std()) if arr.size else None
    for p in PERCENTILES:
        name = "median" if p == 50 else f"p{p}"
        out[f"{name}_{prefix}_ms"] = float(np.percentile(arr, p)) if arr.size else None


def summarize(
    requests: Sequence[Request],
    duration_s: float,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict[str, float | int | None]:
    finished = [r for r in requests if r.status is RequestStatus.FINISHED]
    out: dict[str, float | int | None] = {
        "num_requests": len(requests),
        "completed": len(finished),
        "rejected": sum(r.status is RequestStatus.REJECTED for r in requests),
        "duration_s": duration_s,
    }
    output_tokens = sum(r.num_output_tokens * r.n for r in finished)
    input_tokens = sum(r.num_prompt_tokens for r in finished)
    out["total_input_tokens"] = input_tokens
    out["total_output_tokens"] = output_tokens
    out["request_throughput"] = len(finished) / duration_s if duration_s > 0 else None
    out["output_throughput"] = output_tokens / duration_s if duration_s > 0 else None
    out["total_token_throughput"] = (
        (input_tokens + output_tokens) / duration_s if duration_s > 0 else None
    )
    _stats("ttft", [r.ttft_s for r in finished if r.ttft_s is not None], out)
    _stats("tpot", [r.tpot_s for r in finished if r.tpot_s is not None], out)
    _stats("e2el", [r.e2e_s for r in finished if r.e2e_s is not None], out)
    _stats("queueing", [r.queueing_s for r in finished if r.queueing_s is not None], out)
    _itl_stats(finished, out)
    good = [
        r
        for r in finished
        if (slo_ttft_s is None or (r.ttft_s or 0.0) <= slo_ttft_s)
        and (slo_tpot_s is None or (r.tpot_s or 0.0) <= slo_tpot_s)
    ]
    out["request_goodput"] = len(good) / duration_s if duration_s > 0 else None
    out["num_preemptions"] = sum(r.num_preemptions for r in requests)
    out["num_recomputed_tokens"] = sum(r.num_recomputed_tokens for r in requests)
    out["num_blocks_swapped_out"] = sum(r.num_blocks_swapped_out for r in requests)
    hit_tokens = sum(r.num_prefix_hit_tokens for r in requests)
    lookup_tokens = sum(r.num_prefix_lookup_tokens for r in requests)
    out["num_prefix_hit_tokens"] = hit_tokens
    out["prefix_hit_rate"] = hit_tokens / lookup_tokens if lookup_tokens else 0.0
    return out


def itl_groups(requests: Sequence[Request]) -> list[tuple[int, np.ndarray]]:
    """Every inter-token latency of ``requests`` in seconds, without expanding runs, grouped
    by multiplicity: (count, the sorted gaps that occur ``count`` times each), by count.

    Within a run of consecutive steps a request's gap is that step's end minus the previous
    step's end, so those gaps are the replica's step gaps weighted by how many requests were
    mid-run in each step; gaps between runs (after a preemption) count once each. The steps
    are taken a slice at a time, their weights from the runs that start and stop in the
    slice, straight into the groups: beyond the groups (one float per step), memory holds
    two integers per run.
    """
    sources: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # ends, run bounds
    irregular: list[float] = []
    by_clock: dict[int, list[Request]] = {}
    for r in requests:
        by_clock.setdefault(id(r.tokens.step_end_s), []).append(r)
    for group in by_clock.values():
        ends = np.frombuffer(group[0].tokens.step_end_s, dtype=np.float64)
        # A run of ``count`` emissions from step ``start`` has gaps ending at steps
        # start + 1 .. start + count - 1: it is mid-run there.
        firsts = array("q")
        stops = array("q")
        for r in group:
            t = r.tokens
            prev_last: int | None = None
            for start, count in zip(t.run_starts, t.run_counts, strict=True):
                if prev_last is not None:
                    irregular.append(float(ends[start] - ends[prev_last]))
                elif t.external_first_s is not None:  # first token from a prefill replica
                    irregular.append(float(ends[start]) - t.external_first_s)
                firsts.append(start + 1)
                stops.append(start + count)
                prev_last = start + count - 1
        firsts_at = np.sort(np.frombuffer(firsts, dtype=np.int64))
        stops_at = np.sort(np.frombuffer(stops, dtype=np.int64))
        del firsts, stops
        sources.append((ends, firsts_at, stops_at))
    sizes: dict[int, int] = {}
    for ends, firsts_at, stops_at in sources:
        for _, weights in _weighted_slices(ends.size, firsts_at, stops_at):
            counts = np.bincount(weights)
            for count in np.flatnonzero(counts).tolist():
                sizes[count] = sizes.get(count, 0) + int(counts[count])
    if irregular:
        sizes[1] = sizes.get(1, 0) + len(irregular)
    parts = {count: np.empty(size) for count, size in sizes.items() if count}
    filled = dict.fromkeys(parts, 0)
    for ends, firsts_at, stops_at in sources:
        for a, weights in _weighted_slices(ends.size, firsts_at, stops_at):
            b = a + weights.size
            order = np.argsort(weights, kind="stable")
            by_weight = weights[order]
            gaps = (ends[a:b] - ends[a - 1 : b - 1])[order]  # (as np.diff(ends)[a - 1 : b - 1])
            edges = [0, *(np.flatnonzero(by_weight[1:] != by_weight[:-1]) + 1).tolist(), b - a]
            for lo, hi in itertools.pairwise(edges):
                count = int(by_weight[lo])
                if count:  # (a gap no request was mid-run over is no sample)
                    at = filled[count]
                    parts[count][at : at + hi - lo] = gaps[lo:hi]
                    filled[count] = at + hi - lo
    if irregular:
        parts[1][filled[1] :] = irregular
    for part in parts.values():
        part.sort()
    return sorted(parts.items())


def _weighted_slices(
    num_steps: int, firsts: np.ndarray, stops: np.ndarray
) -> Iterator[tuple[int, np.ndarray]]:
    """(a, the weights of the gaps ending at steps a, a + 1, ...) a slice at a time, over
    steps 1 .. ``num_steps`` - 1: how many runs are mid-run there, each run being mid-run
    from its ``firsts`` up to (not including) its ``stops`` (both sorted)."""
    carry = 0
    i = k = 0
    for a in range(1, num_steps, _SLICE):
        b = min(a + _SLICE, num_steps)
        i_next = int(np.searchsorted(firsts, b))
        k_next = int(np.searchsorted(stops, b))
        diff = np.zeros(b - a, dtype=np.int64)
        np.add.at(diff, firsts[i:i_next] - a, 1)
        np.add.at(diff, stops[k:k_next] - a, -1)
        weights = np.cumsum(diff, out=diff)
        weights += carry
        carry = int(weights[-1])
        i, k = i_next, k_next
        yield a, weights


_SLICE = 1 << 16  # step gaps sorted into groups at a time


def _itl_stats(finished: Sequence[Request], out: dict[str, float | int | None]) -> None:
    groups = itl_groups(finished)
    if not groups:
        for key in ("mean", "std", "median", "p90", "p99"):
            out[f"{key}_itl_ms"] = None
        return
    total = 0
    weighted = 0.0
    for count, part in groups:
        part *= 1000.0  # (in place: these are ours)
        total += count * part.size
        weighted += count * float(part.sum())
    mean = weighted / total
    out["mean_itl_ms"] = mean
    spread = 0.0
    for count, part in groups:
        for a in range(0, part.size, _SLICE):
            deviation = part[a : a + _SLICE] - mean
            spread += count * float(np.dot(deviation, deviation))
    out["std_itl_ms"] = math.sqrt(max(0.0, spread / total))
    names = ["median" if p == 50 else f"p{p}" for p in PERCENTILES]
    values = _grouped_percentiles(groups, total, PERCENTILES)
    for name, value in zip(names, values, strict=True):
        out[f"{name}_itl_ms"] = value


def _grouped_percentiles(
    groups: Sequence[tuple[int, np.ndarray]], total: int, qs: Sequence[float]
) -> list[float]:
    """The ``qs``-th percentiles (numpy's linear method) of the values of ``groups``
    (``itl_groups``), each repeated its count times, ``total`` samples in all, found by
    bisection over the order of float64 values rather than in one expanded, sorted copy (a
    long run's ITLs can number tens of millions)."""

    def at_rank(rank: int) -> float:
        """The sample at 0-based ``rank`` in sorted order: the smallest value x with more
        than ``rank`` samples <= x (one of the values: that count steps only at them)."""
        lo = _order_key(min(float(part[0]) for _, part in groups)) - 1  # no sample <= it
        hi = _order_key(max(float(part[-1]) for _, part in groups))  # every sample <= it
        while hi - lo > 1:
            mid = (lo + hi) // 2
            x = _from_order_key(mid)
            below = sum(count * int(np.searchsorted(part, x, "right")) for count, part in groups)
            if below > rank:
                hi = mid
            else:
                lo = mid
        return _from_order_key(hi) + 0.0  # (+ 0.0: -0.0, equal to +0.0, reads as +0.0)

    out: list[float] = []
    for q in qs:
        h = (total - 1) * q / 100.0
        lo, hi = math.floor(h), math.ceil(h)
        v_lo, v_hi = at_rank(lo), at_rank(hi)
        out.append(float(v_lo + (v_hi - v_lo) * (h - lo)))
    return out


_SIGN = 1 << 63


def _order_key(x: float) -> int:
    """An integer in the order of float64 values (-0.0 just below +0.0)."""
    bits: int = struct.unpack("<Q", struct.pack("<d", x))[0]
    return bits if bits < _SIGN else -(bits - _SIGN) - 1


def _from_order_key(key: int) -> float:
    bits = key if key >= 0 else (-key - 1) + _SIGN
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value
