"""A step's whole attention layer from one measured 4-D table (profile version 5 ``attention``:
prefill chunk, its context, decode count, their context; LLMServingSim's ``attention.csv``)
and the fitted correction for decode batches of uneven contexts (``decode_skew``)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

ATTENTION_AXES = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
"""The columns of a version-5 ``attention`` table, besides ``time_s``, in order."""

SKEW_AXES = ("n", "skew_rate", "kv_big", "kp")
"""The bucketed axes of ``decode_skew.bucket_axes``: ``<axis>_bins`` and ``<axis>_labels``."""

Fail = Callable[[str, str], ValueError]


def _bracket(values: Sequence[float], x: float) -> tuple[int, int, float]:
    """Indices (lo, hi) and weight w with x = (1 - w) values[lo] + w values[hi]; a query
    outside the values is clamped to the nearest end (callers extrapolate)."""
    if len(values) == 1 or x <= values[0]:
        return 0, 0, 0.0
    if x >= values[-1]:
        return len(values) - 1, len(values) - 1, 0.0
    hi = bisect_right(values, x)
    lo = hi - 1
    return lo, hi, (x - values[lo]) / (values[hi] - values[lo])


@dataclass(frozen=True, slots=True)
class _Row:
    """Times at increasing decode contexts, for one (prefill chunk, decodes, chunk context)."""

    kv_decode: tuple[float, ...]
    times_s: tuple[float, ...]

    def __call__(self, kv_decode: float) -> float:
        lo, hi, w = _bracket(self.kv_decode, kv_decode)
        return (1 - w) * self.times_s[lo] + w * self.times_s[hi]


@dataclass(frozen=True, slots=True)
class _Slice:
    """The rows of one (prefill chunk, decode count) pair, by increasing chunk context."""

    kv_prefill: tuple[float, ...]
    rows: tuple[_Row, ...]

    def __call__(self, kv_prefill: float, kv_decode: float) -> float:
        lo, hi, w = _bracket(self.kv_prefill, kv_prefill)
        low = self.rows[lo](kv_decode)
        return low if w == 0.0 else (1 - w) * low + w * self.rows[hi](kv_decode)


@dataclass(frozen=True, slots=True)
class StepAttentionTable:
    """Seconds of one layer's attention for a step with one prefill chunk of ``prefill_chunk``
    new tokens over ``kv_prefill`` cached ones and ``n_decode`` decodes each over ``kv_decode``
    cached tokens (the KV-cache write included), measured on a ragged grid.

    Inside the grid each axis is bracketed by its two nearest measured values and blended
    linearly, as LLMServingSim's simulator does: the chunk and decode-count axes over the
    values measured anywhere (a missing corner takes the nearest measured pair), the two
    context axes within each pair's own rows. Outside, ``__call__`` answers at the nearest
    point of the grid (``clamp``); the cost model scales that by its analytic shape."""

    prefill_chunks: tuple[float, ...]
    decode_counts: tuple[float, ...]
    slices: dict[tuple[float, float], _Slice]
    # Per axis, the smallest and largest value measured, and (decode context) the smallest
    # measured where there are decodes: 0 context is only measured with no decode.
    lower: tuple[float, float, float, float]
    upper: tuple[float, float, float, float]

    def clamp(
        self, prefill_chunk: float, kv_prefill: float, n_decode: float, kv_decode: float
    ) -> tuple[float, float, float, float]:
        """The point of the grid the table answers for this query."""
        point = [prefill_chunk, kv_prefill, n_decode, kv_decode]
        for i, value in enumerate(point):
            point[i] = min(max(value, self.lower[i]), self.upper[i])
        if point[2] > 0:
            point[3] = max(point[3], self.lower[3])
        return point[0], point[1], point[2], point[3]

    def __call__(
        self, prefill_chunk: float, kv_prefill: float, n_decode: float, kv_decode: float
    ) -> float:
        pc, kp, nd, kvd = self.clamp(prefill_chunk, kv_prefill, n_decode, kv_decode)
        lo_pc, hi_pc, w_pc = _bracket(self.prefill_chunks, pc)
        lo_nd, hi_nd, w_nd = _bracket(self.decode_counts, nd)

        def corner(i: int, j: int) -> float:
            return self.slices[(self.prefill_chunks[i], self.decode_counts[j])](kp, kvd)

        low = corner(lo_pc, lo_nd)
        if w_nd:
            low = (1 - w_nd) * low + w_nd * corner(lo_pc, hi_nd)
        if not w_pc:
            return low
        high = corner(hi_pc, lo_nd)
        if w_nd:
            high = (1 - w_nd) * high + w_nd * corner(hi_pc, hi_nd)
        return (1 - w_pc) * low + w_pc * high


def read_step_attention(table: Any, fail: Fail) -> StepAttentionTable:
    """The ``ops.attention`` table of a version-5 profile: columns ``prefill_chunk``,
    ``kv_prefill``, ``n_decode``, ``kv_decode`` (non-negative integers) and ``time_s``, one
    entry per measured point."""
    field = "ops.attention"
    if not isinstance(table, dict):
        raise fail(field, f"expected an object, got {table!r}")
    columns: list[list[Any]] = []
    for name in (*ATTENTION_AXES, "time_s"):
        column = table.get(name)
        if not isinstance(column, list):
            raise fail(f"{field}.{name}", "missing, or not a list")
        columns.append(column)
    size = len(columns[0])
    if size == 0 or any(len(column) != size for column in columns):
        raise fail(
            field, f"columns must be non-empty and of one length, got {[len(c) for c in columns]}"
        )
    points: dict[tuple[int, int, int, int], float] = {}
    for i in range(size):
        key = tuple(columns[k][i] for k in range(4))
        time_s = columns[4][i]
        where = f"{field}[{i}]"
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in key):
            raise fail(where, f"axes must be non-negative integers, got {list(key)}")
        if isinstance(time_s, bool) or not isinstance(time_s, int | float):
            raise fail(f"{where}.time_s", f"expected a number, got {time_s!r}")
        if not (math.isfinite(time_s) and time_s >= 0):
            raise fail(f"{where}.time_s", f"expected a finite non-negative number, got {time_s!r}")
        pc, kp, nd, kvd = key
        if (pc == 0 and kp) or (nd == 0 and kvd) or (pc == 0 and nd == 0):
            raise fail(
                where, f"no chunk has no chunk context, no decode no decode context: {list(key)}"
            )
        if key in points:
            raise fail(where, f"measured twice: {list(key)}")
        points[key] = float(time_s)
    return build_step_attention(points)


def build_step_attention(points: dict[tuple[int, int, int, int], float]) -> StepAttentionTable:
    """The table of measured ``(prefill_chunk, kv_prefill, n_decode, kv_decode) -> seconds``."""
    grouped: dict[tuple[int, int], dict[int, dict[int, float]]] = {}
    for (chunk, kp, count, kvd), time_s in points.items():
        grouped.setdefault((chunk, count), {}).setdefault(kp, {})[kvd] = time_s
    measured: dict[tuple[int, int], _Slice] = {}
    for pair, rows in grouped.items():
        kps = tuple(sorted(rows))
        measured[pair] = _Slice(tuple(float(k) for k in kps), tuple(_row(rows[kp]) for kp in kps))
    chunks = sorted({pc for pc, _ in measured})
    counts = sorted({nd for _, nd in measured})
    # Every (chunk, count) corner the interpolation can reach; one never measured takes the
    # nearest measured pair, as LLMServingSim's lookup does.
    slices: dict[tuple[float, float], _Slice] = {}
    for pc in chunks:
        for nd in counts:
            near = min(measured, key=lambda k: ((k[0] - pc) ** 2 + (k[1] - nd) ** 2, k))
            slices[(float(pc), float(nd))] = measured[(pc, nd) if (pc, nd) in measured else near]
    axes = [sorted({key[i] for key in points}) for i in range(4)]
    positive_kvd = [key[3] for key in points if key[2] > 0]
    lower = (axes[0][0], axes[1][0], axes[2][0], min(positive_kvd, default=axes[3][0]))
    upper = (axes[0][-1], axes[1][-1], axes[2][-1], axes[3][-1])
    return StepAttentionTable(
        tuple(float(v) for v in chunks),
        tuple(float(v) for v in counts),
        slices,
        (float(lower[0]), float(lower[1]), float(lower[2]), float(lower[3])),
        (float(upper[0]), float(upper[1]), float(upper[2]), float(upper[3])),
    )


def _row(times: dict[int, float]) -> _Row:
    contexts = sorted(times)
    return _Row(tuple(float(c) for c in contexts), tuple(times[c] for c in contexts))


def _label(bins: tuple[float, ...], labels: tuple[str, ...], value: float) -> str:
    """The label of the bin (bins[i], bins[i + 1]] holding ``value``; past the last, the last."""
    for i, label in enumerate(labels):
        if value <= bins[i + 1]:
            return label
    return labels[-1]


@dataclass(frozen=True, slots=True)
class DecodeSkew:
    """How far a decode batch of uneven contexts sits from the time of a uniform batch at its
    mean context toward one at its longest: ``t = t_mean + alpha (t_max - t_mean)``, alpha
    fitted per bucket of (prefill chunk, decode count, skew rate, longest context, chunk
    context) on measured skewed batches (LLMServingSim's ``skew_fit.csv``), else
    ``alpha_default``. The skew rate is (mean - min) / (max - min), in [0, 1]."""

    bins: dict[str, tuple[float, ...]]
    labels: dict[str, tuple[str, ...]]
    alpha_default: float
    alpha_by_bucket: dict[str, float]

    def alpha(self, prefill_chunk: int, n: int, skew_rate: float, kv_big: int, kp: int) -> float:
        parts = [f"pc={prefill_chunk}"]
        for axis, value in zip(
            SKEW_AXES, (n, min(1.0, max(0.0, skew_rate)), kv_big, kp), strict=True
        ):
            parts.append(_label(self.bins[axis], self.labels[axis], value))
        return self.alpha_by_bucket.get("|".join(parts), self.alpha_default)


def read_decode_skew(obj: Any, fail: Fail) -> DecodeSkew:
    """A version-5 ``decode_skew`` object: ``bucket_axes`` (``<axis>_bins``, increasing, and
    ``<axis>_labels``, one fewer, for each of SKEW_AXES), ``alpha_default`` and
    ``alpha_by_bucket`` (``"pc=<chunk>|<n label>|<skew-rate label>|<kv_big label>|<kp label>"``
    to alpha; alphas are not clamped: a skewed batch may cost more than the uniform longest)."""
    if not isinstance(obj, dict):
        raise fail("decode_skew", f"expected an object, got {obj!r}")
    axes = obj.get("bucket_axes")
    if not isinstance(axes, dict):
        raise fail("decode_skew.bucket_axes", "missing, or not an object")
    bins, labels = {}, {}
    for axis in SKEW_AXES:
        where = f"decode_skew.bucket_axes.{axis}"
        edges, names = axes.get(f"{axis}_bins"), axes.get(f"{axis}_labels")
        if not isinstance(edges, list) or not all(_is_number(v) for v in edges):
            raise fail(f"{where}_bins", f"expected a list of numbers, got {edges!r}")
        if len(edges) < 2 or any(b <= a for a, b in pairwise(edges)):
            raise fail(f"{where}_bins", f"must be strictly increasing, at least two: {edges}")
        if not isinstance(names, list) or len(names) != len(edges) - 1:
            raise fail(f"{where}_labels", f"needs {len(edges) - 1} labels, got {names!r}")
        bins[axis] = tuple(float(v) for v in edges)
        labels[axis] = tuple(str(v) for v in names)
    default = obj.get("alpha_default")
    if not isinstance(default, int | float) or not _is_number(default):
        raise fail("decode_skew.alpha_default", f"expected a finite number, got {default!r}")
    alphas = obj.get("alpha_by_bucket", {})
    if not isinstance(alphas, dict):
        raise fail("decode_skew.alpha_by_bucket", f"expected an object, got {alphas!r}")
    for key, value in alphas.items():
        if not _is_number(value):
            raise fail(
                f"decode_skew.alpha_by_bucket.{key}", f"expected a finite number, got {value!r}"
            )
    return DecodeSkew(bins, labels, float(default), {str(k): float(v) for k, v in alphas.items()})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


Roof = Callable[[float, float, float, float], float]
"""The analytic attention time of (prefill chunk, its context, decodes, their context)."""


def equivalent_chunk(chunks: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """One chunk (new tokens, context) standing for a step's prefill chunks in a table timed
    with one: the same new tokens and the same causal (query, key) pairs, the work a varlen
    kernel does. Summing the contexts instead would count pairs between one request's new
    tokens and another's context, which no kernel computes (three times the work of a
    310-token tail over 2,048 cached beside a fresh 1,738-token prompt). Where even no context
    leaves too many pairs (several fresh prompts), the one fresh chunk of that many pairs."""
    if not chunks:
        return 0, 0
    if len(chunks) == 1:
        return chunks[0]
    new = sum(q for q, _ in chunks)
    pairs = sum(q * k + q * (q + 1) // 2 for q, k in chunks)
    context = (pairs - new * (new + 1) // 2) / new
    if context >= 0:
        return new, round(context)
    return max(1, round((math.sqrt(1 + 8 * pairs) - 1) / 2)), 0


def step_attention_s(
    table: StepAttentionTable,
    skew: DecodeSkew | None,
    chunks: Sequence[tuple[int, int]],
    decode_contexts: Sequence[int],
    roof: Roof | None,
) -> tuple[float, float]:
    """One layer's attention of a step as (prefill part, decode part), seconds: the table at
    the step's equivalent chunk and its decodes' mean cached context (each decode's context
    less its new token), moved toward the table at their longest by the skew fit's alpha.
    ``roof``, when given, extends the table past its grid by the analytic model's shape; the
    prefill part of a mixed step is what the step costs beyond its decodes alone."""

    def at(pc: float, kp: float, nd: float, kvd: float) -> float:
        time_s = table(pc, kp, nd, kvd)
        if roof is not None:
            inside = table.clamp(pc, kp, nd, kvd)
            if inside != (pc, kp, nd, kvd) and (edge := roof(*inside)) > 0:
                time_s *= roof(pc, kp, nd, kvd) / edge
        return time_s

    pc, kp = equivalent_chunk(chunks)
    nd = len(decode_contexts)
    if not nd:
        return (at(pc, kp, 0, 0), 0.0) if pc else (0.0, 0.0)
    longest, shortest = max(decode_contexts) - 1, min(decode_contexts) - 1
    mean = (sum(decode_contexts) - nd) // nd
    total = at(pc, kp, nd, mean)
    if skew is not None and nd > 1 and longest != mean:
        rate = (mean - shortest) / (longest - shortest)
        alpha = skew.alpha(pc, nd, rate, longest, kp)
        if alpha and (t_max := at(pc, kp, nd, longest)) > total:
            total += alpha * (t_max - total)
    if not pc:
        return 0.0, total
    decode = min(total, at(0, 0, nd, mean))
    return total - decode, decode
