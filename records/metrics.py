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

import functools
import itertools
import math
import operator
import struct
from array import array
from collections.abc import Iterator, Sequence

import numpy as np

from core.request import Request, RequestStatus

PERCENTILES = (50, 90, 99)


def _stats(prefix: str, values: np.ndarray, out: dict[str, float | int | None]) -> None:
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
    statuses = list(map(_STATUS, requests))
    finished = list(
        itertools.compress(requests, map(operator.is_, statuses, _repeat(RequestStatus.FINISHED)))
    )
    out: dict[str, float | int | None] = {
        "num_requests": len(requests),
        "completed": len(finished),
        "rejected": statuses.count(RequestStatus.REJECTED),
        "duration_s": duration_s,
    }
    # Whole columns at once (the request properties, per request, cost more than the rest of
    # the summary at 100k requests); each value is the property's, bit for bit.
    output_tokens = sum(map(operator.mul, map(_OUTPUTS, finished), map(_N, finished)))
    input_tokens = sum(map(_PROMPT, finished))
    out["total_input_tokens"] = input_tokens
    out["total_output_tokens"] = output_tokens
    out["request_throughput"] = len(finished) / duration_s if duration_s > 0 else None
    out["output_throughput"] = output_tokens / duration_s if duration_s > 0 else None
    out["total_token_throughput"] = (
        (input_tokens + output_tokens) / duration_s if duration_s > 0 else None
    )
    # (the ITL groups first, while little else is held: they hold a float for every step)
    runs = _Runs(finished)
    tpot = runs.tpot_s()
    _itl_stats(runs, out)
    del runs
    arrival = _column(finished, _ARRIVAL)
    ttft = _column(finished, _FIRST_TOKEN) - arrival  # (NaN: none)
    _stats("ttft", ttft[~np.isnan(ttft)], out)
    _stats("tpot", tpot[~np.isnan(tpot)], out)
    e2el = _column(finished, _FINISH) - arrival
    _stats("e2el", e2el[~np.isnan(e2el)], out)
    del e2el
    queueing = _column(finished, _FIRST_SCHEDULED) - arrival
    _stats("queueing", queueing[~np.isnan(queueing)], out)
    del queueing, arrival
    # (a request without a TTFT or TPOT meets that SLO, as ``r.ttft_s or 0.0`` would say)
    good = np.ones(len(finished), dtype=bool)
    if slo_ttft_s is not None:
        good &= np.nan_to_num(ttft, nan=0.0) <= slo_ttft_s
    if slo_tpot_s is not None:
        good &= np.nan_to_num(tpot, nan=0.0) <= slo_tpot_s
    out["request_goodput"] = int(good.sum()) / duration_s if duration_s > 0 else None
    out["num_preemptions"] = sum(map(_PREEMPTIONS, requests))
    out["num_recomputed_tokens"] = sum(map(_RECOMPUTED, requests))
    out["num_blocks_swapped_out"] = sum(map(_SWAPPED_OUT, requests))
    hit_tokens = sum(map(_HITS, requests))
    lookup_tokens = sum(map(_LOOKUPS, requests))
    out["num_prefix_hit_tokens"] = hit_tokens
    out["prefix_hit_rate"] = hit_tokens / lookup_tokens if lookup_tokens else 0.0
    return out


# What ``by_priority`` keeps of each class's summary.
PRIORITY_KEYS = (
    "num_requests",
    "completed",
    "rejected",
    "request_throughput",
    *(
        f"{name}_{metric}_ms"
        for metric in ("ttft", "tpot", "e2el")
        for name in ("median", "p90", "p99")
    ),
    "num_preemptions",
)


def by_priority(
    requests: Sequence[Request], duration_s: float
) -> dict[str, dict[str, float | int | None]]:
    """Each priority class's own summary (``PRIORITY_KEYS`` of `summarize`, over its requests
    alone, throughput over the whole run's duration), keyed by the priority as text, lowest
    (served first) first; empty when every request has one priority."""
    classes: dict[int, list[Request]] = {}
    for request in requests:
        classes.setdefault(request.priority, []).append(request)
    if len(classes) < 2:
        return {}
    out = {}
    for priority in sorted(classes):
        summary = summarize(classes[priority], duration_s)
        out[str(priority)] = {key: summary[key] for key in PRIORITY_KEYS}
    return out


_STATUS = operator.attrgetter("status")
_OUTPUTS = operator.attrgetter("num_output_tokens")
_N = operator.attrgetter("n")
_PROMPT = operator.attrgetter("num_prompt_tokens")
_ARRIVAL = operator.attrgetter("arrival_s")
_FIRST_TOKEN = operator.attrgetter("first_token_s")
_FINISH = operator.attrgetter("finish_s")
_FIRST_SCHEDULED = operator.attrgetter("first_scheduled_s")
_PREEMPTIONS = operator.attrgetter("num_preemptions")
_RECOMPUTED = operator.attrgetter("num_recomputed_tokens")
_SWAPPED_OUT = operator.attrgetter("num_blocks_swapped_out")
_HITS = operator.attrgetter("num_prefix_hit_tokens")
_LOOKUPS = operator.attrgetter("num_prefix_lookup_tokens")
_TOKENS = operator.attrgetter("tokens")
_repeat = itertools.repeat


def _column(requests: Sequence[Request], field: operator.attrgetter[float | None]) -> np.ndarray:
    """One float field of every request; None reads as NaN."""
    return np.array(list(map(field, requests)), dtype=np.float64)


class _Runs:
    """The token timelines of ``requests``, flattened: every run of consecutive emissions
    (``TokenTimeline``), request after request, and the step end times of every clock (a
    replica's ``step_end_s``) concatenated, so that emission times are read at once."""

    def __init__(self, requests: Sequence[Request]) -> None:
        timelines = list(map(_TOKENS, requests))
        n = len(timelines)
        starts = list(map(operator.attrgetter("run_starts"), timelines))
        counts = list(map(operator.attrgetter("run_counts"), timelines))
        self.num_runs = np.fromiter(map(len, starts), dtype=np.int64, count=n)
        total = int(self.num_runs.sum())
        # (concatenated by in-place adds to one list: twice as fast as chaining iterators)
        self.starts = np.array(functools.reduce(operator.iadd, starts, []), np.int64)
        del starts
        self.counts = np.array(functools.reduce(operator.iadd, counts, []), np.int64)
        del counts
        assert self.starts.size == self.counts.size == total
        self.emissions = np.fromiter(
            map(operator.attrgetter("num_emissions"), timelines), np.int64, n
        )
        self.external = np.array(
            list(map(operator.attrgetter("external_first_s"), timelines)), dtype=np.float64
        )
        # Each request's clock, as an index into the clocks in order of first use (most
        # often there is one).
        clocks: list[array[float]] = list(map(operator.attrgetter("step_end_s"), timelines))
        ids = list(map(id, clocks))
        by_id = dict(zip(ids, clocks, strict=True))
        if len(by_id) <= 1:
            which = np.zeros(n, dtype=np.int64)
        else:
            index = {key: i for i, key in enumerate(by_id)}
            which = np.fromiter(map(index.__getitem__, ids), np.int64, n)
        self.clocks = [np.frombuffer(a, dtype=np.float64) for a in by_id.values()]
        del timelines, clocks, ids, by_id
        # Each run's clock (None: all on the one clock).
        self.run_clock = np.repeat(which, self.num_runs) if len(self.clocks) > 1 else None
        self.first_run = np.cumsum(self.num_runs) - self.num_runs  # (valid where num_runs > 0)

    def end_s(self, runs: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The end of step ``steps[i]`` on the clock of run ``runs[i]``, for each i (read
        clock by clock: a clock is as long as its replica's steps, never copied)."""
        if len(self.clocks) == 1:
            one: np.ndarray = self.clocks[0][steps]
            return one
        assert self.run_clock is not None
        out = np.empty(steps.size)
        clock_of = self.run_clock[runs]
        for index, clock in enumerate(self.clocks):
            mine = clock_of == index
            out[mine] = clock[steps[mine]]
        return out

    def tpot_s(self) -> np.ndarray:
        """Each request's ``tpot_s``: (last emission - first) / (emissions - 1); NaN if none."""
        has_runs = self.num_runs > 0
        first = np.full(self.emissions.size, np.nan)
        last = np.full(self.emissions.size, np.nan)
        if self.starts.size:
            first_runs = self.first_run[has_runs]
            last_runs = first_runs + self.num_runs[has_runs] - 1
            first[has_runs] = self.end_s(first_runs, self.starts[first_runs])
            last_steps = self.starts[last_runs] + self.counts[last_runs] - 1
            last[has_runs] = self.end_s(last_runs, last_steps)
        external = ~np.isnan(self.external)
        first[external] = self.external[external]
        last[external & ~has_runs] = self.external[external & ~has_runs]
        out = np.full(self.emissions.size, np.nan)
        many = self.emissions >= 2
        out[many] = (last[many] - first[many]) / (self.emissions[many] - 1)
        return out

    def irregular_gaps_s(self) -> np.ndarray:
        """The gaps that are not between two steps of one run: from a request's last
        emission of a run to the first of its next, and from a first token emitted elsewhere
        to the first run."""
        if not self.starts.size:
            return np.empty(0)
        later = np.ones(self.starts.size, dtype=bool)
        later[self.first_run[self.num_runs > 0]] = False
        (k,) = np.nonzero(later)  # (run k - 1 is the same request's, on the same clock)
        between = self.end_s(k, self.starts[k]) - self.end_s(
            k, self.starts[k - 1] + self.counts[k - 1] - 1
        )
        external = (self.num_runs > 0) & ~np.isnan(self.external)
        firsts = self.first_run[external]
        after_external = self.end_s(firsts, self.starts[firsts]) - self.external[external]
        return np.concatenate([between, after_external])


def itl_groups(requests: Sequence[Request] | _Runs) -> list[tuple[int, np.ndarray]]:
    """Every inter-token latency of ``requests`` in seconds, without expanding runs, grouped
    by multiplicity: (count, the sorted gaps that occur ``count`` times each), by count.

    Within a run of consecutive steps a request's gap is that step's end minus the previous
    step's end, so those gaps are the replica's step gaps weighted by how many requests were
    mid-run in each step; gaps between runs (after a preemption) count once each. The steps
    are taken a slice at a time, their weights from the runs that start and stop in the
    slice, straight into the groups: beyond the groups (one float per step), memory holds
    two integers per run.
    """
    runs = requests if isinstance(requests, _Runs) else _Runs(requests)
    irregular = runs.irregular_gaps_s()
    sources: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # ends, run bounds
    for index, ends in enumerate(runs.clocks):
        # A run of ``count`` emissions from step ``start`` has gaps ending at steps
        # start + 1 .. start + count - 1: it is mid-run there.
        if runs.run_clock is None:
            starts, counts = runs.starts, runs.counts
        else:
            mine = runs.run_clock == index
            starts, counts = runs.starts[mine], runs.counts[mine]
        firsts_at = np.sort(starts + 1)
        stops_at = np.sort(starts + counts)
        sources.append((ends, firsts_at, stops_at))
    sizes: dict[int, int] = {}
    for ends, firsts_at, stops_at in sources:
        for _, weights in _weighted_slices(ends.size, firsts_at, stops_at):
            counts = np.bincount(weights)
            for count in np.flatnonzero(counts).tolist():
                sizes[count] = sizes.get(count, 0) + int(counts[count])
    if irregular.size:
        sizes[1] = sizes.get(1, 0) + irregular.size
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
    if irregular.size:
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


def _itl_stats(runs: _Runs, out: dict[str, float | int | None]) -> None:
    groups = itl_groups(runs)
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
