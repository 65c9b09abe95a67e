"""Measured op timings (`Profile`) read from a JSON profile file, with the interpolating tables
that look them up. The format is documented, with an example, in docs/profile_format.md."""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from core.text_files import read_text
from sim.costmodel.host_time import HostParams
from sim.costmodel.profile_v5 import v5_fields
from sim.costmodel.step_attention import (
    DecodeSkew,
    StepAttentionTable,
    read_decode_skew,
    read_step_attention,
)

FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
DECODE_CONTEXT_RULES = ("mean", "max", "per_sequence")
TIMERS = ("cuda_events", "wall", "thread_cpu", "kernel_trace", "unknown")
"""How a profile's times were taken (v3 ``timer``); ``kernel_trace`` (v5): each kernel's own
duration from a profiler trace, without the host's time between kernels (LLMServingSim's)."""
EXTRAPOLATIONS = ("proportional", "roofline")
"""Past a table's measured sizes (v5 ``extrapolation``): ``proportional``, the throughput at the
table's edge holds (before v5, always); ``roofline``, the time at the edge scaled by the
analytic model's ratio between the size asked and the edge, on both sides of the table."""
STEP_FITS = ("overhead", "joint")
"""How the calibrated model uses a profile's whole ``steps`` (v4 ``step_fit``): ``overhead``
fits only the step overhead to them; ``joint`` fits the token and attention terms' scales and
the overhead together (``sim.costmodel.calibrated``)."""

OP_AXES: dict[str, tuple[str, ...]] = {
    "linear": ("num_tokens",),
    "elementwise": ("num_tokens",),
    "store_kv": ("num_bytes",),
    "prefill_attention": ("num_query_tokens", "num_context_tokens"),
    "decode_attention": ("num_seqs", "context_tokens"),
    "lm_head": ("num_seqs",),
    "allreduce": ("num_bytes",),
    "copy_blocks": ("num_bytes",),
    "swap": ("num_bytes",),
    # Version 2:
    "swap_out": ("num_bytes",),
    "swap_in": ("num_bytes",),
    "prepare": ("num_seqs",),
    # Version 5, optional: a decode graph's own plan (engine with CUDA graphs); a mixture of
    # experts' MoE layer on one GPU holding every expert (``sim.costmodel.moe_table``).
    "decode_attention_graph": ("num_seqs", "context_tokens"),
    "experts": ("num_tokens", "activated_experts"),
}
"""Each op a profile may time, and the axes of its table, in order."""

_V1_OPS = (
    "linear",
    "elementwise",
    "store_kv",
    "prefill_attention",
    "decode_attention",
    "lm_head",
    "allreduce",
    "copy_blocks",
    "swap",
)
V5_OPS = ("decode_attention_graph", "experts")
"""The ops version 5 added (an older profile naming one is refused as an unknown op)."""
_STEP_KEYS = ("prefill_chunks", "num_decode_seqs", "sum_decode_context_tokens", "measured_s")


def _segment(xs: tuple[float, ...], x: float) -> tuple[int, float]:
    """Index i and weight w with x = (1-w) xs[i] + w xs[i+1]; x is clamped to the table."""
    if x <= xs[0] or len(xs) == 1:
        return 0, 0.0
    if x >= xs[-1]:
        return len(xs) - 2, 1.0
    i = bisect_right(xs, x) - 1
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


def _beyond_edge(xs: tuple[float, ...], x: float) -> float:
    """Past the largest measured size, time grows in proportion (the edge's throughput holds)."""
    return x / xs[-1] if x > xs[-1] else 1.0


@dataclass(frozen=True, slots=True)
class Table1D:
    """Seconds measured at increasing sizes `xs`. Between points: linear. Below the first point:
    the first time (a smaller op is no faster than launch latency). Past the last: the last
    point's throughput."""

    xs: tuple[float, ...]
    times_s: tuple[float, ...]

    def __call__(self, x: float) -> float:
        if x <= 0:
            return 0.0
        return self.within(x) * _beyond_edge(self.xs, x)

    def within(self, x: float) -> float:
        """The time at ``x`` clamped to the measured sizes (no scaling past the edge)."""
        i, w = _segment(self.xs, x)
        return self.times_s[i] if w == 0.0 else (1 - w) * self.times_s[i] + w * self.times_s[i + 1]


@dataclass(frozen=True, slots=True)
class Table2D:
    """Seconds on a grid: `times_s[i][j]` at (xs[i], ys[j]). Bilinear inside; clamped below each
    axis; past the top of an axis scaled in proportion, as in Table1D."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    times_s: tuple[tuple[float, ...], ...]

    def __call__(self, x: float, y: float) -> float:
        if x <= 0:
            return 0.0
        return self.within(x, y) * _beyond_edge(self.xs, x) * _beyond_edge(self.ys, y)

    def within(self, x: float, y: float) -> float:
        """The time at (x, y) clamped to the measured grid (no scaling past its edges)."""
        i, wx = _segment(self.xs, x)
        j, wy = _segment(self.ys, y)
        rows = self.times_s
        i1, j1 = min(i + 1, len(self.xs) - 1), min(j + 1, len(self.ys) - 1)
        low = (1 - wy) * rows[i][j] + wy * rows[i][j1]
        high = (1 - wy) * rows[i1][j] + wy * rows[i1][j1]
        return (1 - wx) * low + wx * high


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One measured whole step; decode contexts are given as a count and a sum, and (version 2)
    each one, when the file lists them."""

    prefill_chunks: tuple[tuple[int, int], ...]
    num_decode_seqs: int
    sum_decode_context_tokens: int
    measured_s: float
    decode_context_tokens: tuple[int, ...] | None = None
    # v5: the step's spread over the calibration's rounds, the host's part of it, and the
    # runner's input preparation (the reference a run's host speed is measured against).
    spread_s: float | None = None
    host_s: float | None = None
    prepare_s: float | None = None


@dataclass(frozen=True, slots=True)
class DecodeCheck:
    """One measured decode batch of uneven contexts (v3), and what each context rule predicts
    for it from uniform batches timed beside it, when the file says."""

    context_tokens: tuple[int, ...]
    time_s: float
    predicted_mean_s: float | None = None
    predicted_max_s: float | None = None
    predicted_per_sequence_s: float | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    """A loaded profile: where and how it was measured, per-op tables, whole-step timings."""

    path: str
    device: dict[str, str]
    software: dict[str, str]
    command: str
    model: str
    tp: int
    block_size: int
    ops: dict[str, Table1D | Table2D]
    steps: tuple[StepTiming, ...]
    format_version: int = FORMAT_VERSION
    # Which context of a decode batch its attention costs as: "mean" (a kernel reading each
    # sequence's own blocks, cost linear in context), "max" (one padded to the longest), or
    # "per_sequence" (the mean over its sequences of the batch's cost at each one's context).
    decode_attention_context: str = "mean"
    engine: dict[str, str] | None = None
    # v3: how the times were taken: CUDA events, the wall clock, or the thread's CPU time.
    timer: str = "unknown"
    # v3: skewed decode batches as measured, which chose ``decode_attention_context``.
    decode_attention_checks: tuple[DecodeCheck, ...] = ()
    # v4: what the whole steps are fitted to (STEP_FITS); files before version 4: "overhead".
    step_fit: str = "overhead"
    # v5: the host clock the calibration fitted (``host``: HostParams, and the scale it put
    # on the GPU time), which clock gave the GPU time (calibrated_host.GPU_CLOCKS), what the
    # tables time (profile_v5.TABLES_TIMES), each table point's spread (op -> values like
    # ``time_s``),
    # and the commit of the engine that was timed.
    host: HostParams | None = None
    host_device_scale: float = 1.0
    gpu_clock: str | None = None
    tables_time: str = "span"
    spreads: dict[str, Any] = field(default_factory=dict)
    commit: str | None = None
    # v5: a step's whole attention layer from one 4-D table (``ops.attention``), which then
    # prices prefill and decode attention and the KV write together; and the correction of
    # uneven decode contexts that goes with it.
    attention: StepAttentionTable | None = None
    decode_skew: DecodeSkew | None = None
    # v5: how tables are read past their measured sizes (EXTRAPOLATIONS).
    extrapolation: str = "proportional"


class _Reader:
    """Checks one profile file, naming the file and the field in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, problem: str) -> ValueError:
        return ValueError(f"{self.path}: field {field!r}: {problem}")

    def get(self, obj: dict[str, Any], key: str, kind: type | tuple[type, ...], field: str) -> Any:
        if key not in obj:
            raise self.fail(field, "missing")
        value = obj[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise self.fail(field, f"expected {_kind_name(kind)}, got {value!r}")
        return value

    def axis(self, table: dict[str, Any], key: str, field: str) -> tuple[float, ...]:
        values = self.numbers(self.get(table, key, list, field), field)
        if not values:
            raise self.fail(field, "empty axis")
        if any(b <= a for a, b in pairwise(values)) or values[-1] <= 0:
            raise self.fail(field, f"axis must be strictly increasing and end above 0: {values}")
        return values

    def numbers(self, values: list[Any], field: str) -> tuple[float, ...]:
        for value in values:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise self.fail(field, f"expected numbers, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise self.fail(field, f"expected finite non-negative numbers, got {value!r}")
        return tuple(float(value) for value in values)

    def table(self, op: str, table: Any) -> Table1D | Table2D:
        field = f"ops.{op}"
        if not isinstance(table, dict):
            raise self.fail(field, f"expected an object, got {table!r}")
        axes = [self.axis(table, name, f"{field}.{name}") for name in OP_AXES[op]]
        times = self.get(table, "time_s", list, f"{field}.time_s")
        if len(axes) == 1:
            if len(times) != len(axes[0]):
                raise self.fail(f"{field}.time_s", f"needs {len(axes[0])} values, got {len(times)}")
            return Table1D(axes[0], self.numbers(times, f"{field}.time_s"))
        rows: list[tuple[float, ...]] = []
        for i, row in enumerate(times):
            row_field = f"{field}.time_s[{i}]"
            if not isinstance(row, list) or len(row) != len(axes[1]):
                raise self.fail(row_field, f"needs a list of {len(axes[1])} values, got {row!r}")
            rows.append(self.numbers(row, row_field))
        if len(rows) != len(axes[0]):
            raise self.fail(f"{field}.time_s", f"needs {len(axes[0])} rows, got {len(rows)}")
        return Table2D(axes[0], axes[1], tuple(rows))

    def step(self, i: int, step: Any) -> StepTiming:
        field = f"steps[{i}]"
        if not isinstance(step, dict):
            raise self.fail(field, f"expected an object, got {step!r}")
        for key in _STEP_KEYS:
            if key not in step:
                raise self.fail(f"{field}.{key}", "missing")
        chunks = self.get(step, "prefill_chunks", list, f"{field}.prefill_chunks")
        if not all(
            isinstance(c, list) and len(c) == 2 and all(_is_count(v) for v in c) for c in chunks
        ):
            raise self.fail(f"{field}.prefill_chunks", f"expected [new, context] pairs: {chunks}")
        contexts = None
        if "decode_context_tokens" in step:
            raw = self.get(step, "decode_context_tokens", list, f"{field}.decode_context_tokens")
            if not all(_is_count(c) and c > 0 for c in raw):
                raise self.fail(f"{field}.decode_context_tokens", "expected positive integers")
            contexts = tuple(raw)
        timing = StepTiming(
            tuple((new, context) for new, context in chunks),
            self.get(step, "num_decode_seqs", int, f"{field}.num_decode_seqs"),
            self.get(step, "sum_decode_context_tokens", int, f"{field}.sum_decode_context_tokens"),
            float(self.get(step, "measured_s", (int, float), f"{field}.measured_s")),
            contexts,
            *(
                self.seconds(step, key, f"{field}.{key}")
                for key in ("spread_s", "host_s", "prepare_s")
            ),
        )
        if contexts is not None and (
            len(contexts) != timing.num_decode_seqs
            or sum(contexts) != timing.sum_decode_context_tokens
        ):
            raise self.fail(
                f"{field}.decode_context_tokens",
                "disagrees with num_decode_seqs / sum_decode_context_tokens",
            )
        return timing

    def seconds(self, obj: dict[str, Any], key: str, field: str) -> float | None:
        """An optional non-negative number of seconds (None when absent)."""
        if key not in obj:
            return None
        return self.numbers([self.get(obj, key, (int, float), field)], field)[0]

    def decode_check(self, i: int, check: Any) -> DecodeCheck:
        field = f"decode_attention_checks[{i}]"
        if not isinstance(check, dict):
            raise self.fail(field, f"expected an object, got {check!r}")
        contexts = self.get(check, "context_tokens", list, f"{field}.context_tokens")
        if not contexts or not all(_is_count(c) and c > 0 for c in contexts):
            raise self.fail(f"{field}.context_tokens", "expected positive integers")
        time_s = self.numbers([self.get(check, "time_s", (int, float), f"{field}.time_s")], field)
        predicted = {}
        for key in ("predicted_mean_s", "predicted_max_s", "predicted_per_sequence_s"):
            if key in check:
                value = self.get(check, key, (int, float), f"{field}.{key}")
                predicted[key] = self.numbers([value], f"{field}.{key}")[0]
        return DecodeCheck(tuple(contexts), time_s[0], **predicted)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile file; every error is a ValueError naming the file and field."""
    path = Path(path)
    reader = _Reader(path)
    try:
        data = json.loads(read_text(path, "profile"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a JSON profile ({error})") from error
    if not isinstance(data, dict):
        raise reader.fail("<top level>", "expected a JSON object")
    version = reader.get(data, "format_version", int, "format_version")
    if version not in READABLE_VERSIONS:
        *older, newest = (str(v) for v in READABLE_VERSIONS)
        known = f"{', '.join(older)} and {newest}" if older else newest
        raise reader.fail("format_version", f"this reader knows {known}, got {version}")
    device = reader.get(data, "device", dict, "device")
    software = reader.get(data, "software", dict, "software")
    for key in ("name", "driver"):
        reader.get(device, key, str, f"device.{key}")
    for key in ("torch", "triton", "cuda"):
        reader.get(software, key, str, f"software.{key}")
    ops = dict(reader.get(data, "ops", dict, "ops"))
    attention = None
    if version >= 5 and "attention" in ops:
        attention = read_step_attention(ops.pop("attention"), reader.fail)
    known_ops = OP_AXES if version >= 2 else {k: v for k, v in OP_AXES.items() if k in _V1_OPS}
    if version < 5:
        known_ops = {k: v for k, v in known_ops.items() if k not in V5_OPS}
    unknown = sorted(set(ops) - set(known_ops))
    if unknown:
        raise reader.fail(f"ops.{unknown[0]}", f"unknown op; known ops: {', '.join(known_ops)}")
    tp = reader.get(data, "tp", int, "tp")
    block_size = reader.get(data, "block_size", int, "block_size")
    for key, value in (("tp", tp), ("block_size", block_size)):
        if value <= 0:
            raise reader.fail(key, f"must be positive, got {value}")
    steps = reader.get(data, "steps", list, "steps") if "steps" in data else []
    engine = None
    if version >= 2 and "engine" in data:
        engine_obj = reader.get(data, "engine", dict, "engine")
        engine = {k: str(v) for k, v in engine_obj.items()}
    return Profile(
        path=str(path),
        device={k: str(v) for k, v in device.items()},
        software={k: str(v) for k, v in software.items()},
        command=reader.get(data, "command", str, "command"),
        model=reader.get(data, "model", str, "model"),
        tp=tp,
        block_size=block_size,
        ops={op: reader.table(op, table) for op, table in ops.items()},
        steps=tuple(reader.step(i, step) for i, step in enumerate(steps)),
        format_version=version,
        engine=engine,
        attention=attention,
        **_later_fields(reader, data, version),
        **(v5_fields(data, reader.fail) if version >= 5 else {}),
    )


def _later_fields(reader: _Reader, data: dict[str, Any], version: int) -> dict[str, Any]:
    """The optional settings versions 2 to 5 added, as ``Profile`` fields; a key of a later
    version than the file's is ignored."""
    fields: dict[str, Any] = {}
    if version >= 2 and "decode_attention_context" in data:
        rule = reader.get(data, "decode_attention_context", str, "decode_attention_context")
        rules = DECODE_CONTEXT_RULES if version >= 3 else ("mean", "max")
        if rule not in rules:
            raise reader.fail(
                "decode_attention_context",
                f"must be one of {rules} in version {version}, got {rule!r}",
            )
        fields["decode_attention_context"] = rule
    if version >= 3 and "timer" in data:
        timer = reader.get(data, "timer", str, "timer")
        timers = TIMERS if version >= 5 else tuple(t for t in TIMERS if t != "kernel_trace")
        if timer not in timers:
            raise reader.fail(
                "timer", f"must be one of {timers} in version {version}, got {timer!r}"
            )
        fields["timer"] = timer
    if version >= 3 and "decode_attention_checks" in data:
        raw_checks = reader.get(data, "decode_attention_checks", list, "decode_attention_checks")
        fields["decode_attention_checks"] = tuple(
            reader.decode_check(i, c) for i, c in enumerate(raw_checks)
        )
    if version >= 4 and "step_fit" in data:
        step_fit = reader.get(data, "step_fit", str, "step_fit")
        if step_fit not in STEP_FITS:
            raise reader.fail("step_fit", f"must be one of {STEP_FITS}, got {step_fit!r}")
        fields["step_fit"] = step_fit
    if version >= 5 and "decode_skew" in data:
        fields["decode_skew"] = read_decode_skew(data["decode_skew"], reader.fail)
    if version >= 5 and "extrapolation" in data:
        rule = reader.get(data, "extrapolation", str, "extrapolation")
        if rule not in EXTRAPOLATIONS:
            raise reader.fail("extrapolation", f"must be one of {EXTRAPOLATIONS}, got {rule!r}")
        fields["extrapolation"] = rule
    return fields
