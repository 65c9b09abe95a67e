"""Per-GPU kernel efficiencies read from op-level tables (an LLMServingSim profile bundle, Vidur's
mlp.csv and attention.csv): each ``HardwareSpec`` efficiency is the value at which the roofline's
own kernel formula meets, at the median, the measured ops whose time it alone governs
(docs/hardware_efficiency.md)."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from core.model.spec import ModelSpec
from sim.costmodel.layer_ops import LINEAR_OPS, LayerOps
from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import HardwareSpec

MEMORY_BOUND_MAX_TOKENS: Final = 16
"""Linear layers at this many tokens or fewer only read their weights: m tokens make m FLOP per
weight byte, under a ninth of every preset's ridge point (peak FLOP/s over bandwidth, >= 150)."""
COMPUTE_BOUND_MIN_TOKENS: Final = 1024
"""Linear layers at this many tokens or more are bound by their FLOPs: 1024 FLOP per weight byte
is over three times the ridge point of every GPU with tables here (<= 315, the RTX PRO 6000)."""
LATENCY_SHARE: Final = 10.0
"""An attention point governs a throughput when that term, at the datasheet's peak, is at least
this many times the kernel's fixed latency (so the latency moves the fit by under a tenth)."""
ROW_OPS: Final = {
    "elementwise_bandwidth_efficiency": ("input_layernorm", "post_attention_layernorm", "mlp_act",
                                         "attn_qk_norm"),
    "rotary_bandwidth_efficiency": ("attn_rope",),
}  # fmt: skip
"""The row kernels whose large calls each efficiency governs (one thread block a token)."""
BUNDLE_ROWS: Final = {
    "layernorm": "input_layernorm", "act_fn": "mlp_act", "qk_norm": "attn_qk_norm",
    "rotary_emb": "attn_rope",
}  # fmt: skip
"""An LLMServingSim bundle's row-kernel layers under the roofline's names (its ``layernorm`` is
vLLM's RMSNorm, both of a layer's calls alike)."""
FIELDS: Final = (
    "memory_bandwidth_efficiency",
    "gemm_flops_efficiency",
    "gemm_overlap_efficiency",
    "elementwise_bandwidth_efficiency",
    "rotary_bandwidth_efficiency",
    "attention_bandwidth_efficiency",
    "attention_flops_efficiency",
    "mixed_attention_bandwidth_efficiency",
)
"""The efficiencies fitted, in this order: each fit prices its points with those before it."""


class EfficiencyFitError(ValueError):
    """Op tables that govern no point of an efficiency, or that no efficiency can meet."""


@dataclass(frozen=True, slots=True)
class OpTable:
    """Measured op times of one model at one TP degree on one GPU, per layer and rank.

    ``linear``: (tokens, seconds) of the layer's four projections together; ``decode``:
    (sequences, context tokens each, seconds) of decode-only attention; ``prefill``: (chunk
    tokens, cached tokens before it, seconds) of one chunk's attention with no decodes;
    ``mixed``: (chunk tokens, cached before it, decodes, their context, seconds) of a step's
    attention with both; ``row``: (op, tokens, seconds) of one call of a row kernel, under
    the roofline's names (``ROW_OPS``)."""

    source: str
    model: ModelSpec
    tp: int
    block_size: int
    linear: tuple[tuple[int, float], ...] = ()
    decode: tuple[tuple[int, int, float], ...] = ()
    prefill: tuple[tuple[int, int, float], ...] = ()
    mixed: tuple[tuple[int, int, int, int, float], ...] = ()
    row: tuple[tuple[str, int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.tp < 1 or self.block_size < 1:
            raise ValueError(f"OpTable needs tp, block_size >= 1, got {self.tp}, {self.block_size}")
        for name in ("linear", "decode", "prefill", "mixed"):
            for point in getattr(self, name):
                if not (math.isfinite(point[-1]) and point[-1] > 0):
                    raise ValueError(f"OpTable.{name}: times must be > 0, got {point!r}")

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's K and V in one layer, on one rank."""
        model = self.model
        return 2 * model.kv_heads_per_shard(self.tp) * model.head_dim * model.dtype_bytes


@dataclass(frozen=True, slots=True)
class EfficiencyFit:
    """One fitted efficiency: its value, how many points it stands on, the roofline's median
    signed error over them (%) before (at the starting spec's value) and after, and whether
    the points asked for more than the datasheet's peak (then the value is 1)."""

    field: str
    value: float
    num_points: int
    before_pct: float
    after_pct: float
    clipped: bool


# How the roofline prices one measured point (given its table's roofline and layer ops), and
# the point's measured seconds.
Price = Callable[[RooflineCostModel, LayerOps], float]
Point = tuple[OpTable, Price, float]


def _linear(tokens: int) -> Price:
    return lambda _, ops: sum(ops.op_s(op, tokens) for op in LINEAR_OPS)


def _row(op: str, tokens: int) -> Price:
    return lambda _, ops: ops.op_s(op, tokens)


def _attention(
    chunk: int, cached: int, seqs: int, context: int, block_size: int, layers: int
) -> Price:
    """A step's attention, per layer: one chunk's and ``seqs`` decodes' (``mixed`` when both)."""
    kv_read = seqs * -(-context // block_size) * block_size

    def price(roof: RooflineCostModel, _: LayerOps) -> float:
        prefill = roof.prefill_attention_s(((chunk, cached),)) if chunk else 0.0
        decode = roof.decode_attention_s(seqs, seqs * context, kv_read, mixed=chunk > 0)
        return (prefill + decode) / layers

    return price


def _points(field: str, table: OpTable, hw: HardwareSpec) -> list[Point]:
    """The points of ``table`` whose time ``field`` governs (the constants above say which)."""
    bs, layers = table.block_size, table.model.num_layers
    latency = LATENCY_SHARE * hw.attention_latency_s
    if field == "memory_bandwidth_efficiency":
        return [(table, _linear(m), t) for m, t in table.linear if m <= MEMORY_BOUND_MAX_TOKENS]
    if field == "gemm_flops_efficiency":
        return [(table, _linear(m), t) for m, t in table.linear if m >= COMPUTE_BOUND_MIN_TOKENS]
    if field == "gemm_overlap_efficiency":
        # Between the two: priced with both throughputs fitted above.
        return [
            (table, _linear(m), t)
            for m, t in table.linear
            if MEMORY_BOUND_MAX_TOKENS < m < COMPUTE_BOUND_MIN_TOKENS
        ]
    if field in ROW_OPS:
        # Calls long enough for bandwidth to govern them: as the compute-bound GEMMs.
        return [
            (table, _row(op, m), t)
            for op, m, t in table.row
            if op in ROW_OPS[field] and m >= COMPUTE_BOUND_MIN_TOKENS and t > 0
        ]
    if field == "attention_bandwidth_efficiency":
        floor = latency * hw.hbm_bandwidth_bytes_per_s / table.kv_bytes_per_token
        return [
            (table, _attention(0, 0, n, c, bs, layers), t)
            for n, c, t in table.decode
            if n * c >= floor
        ]
    if field == "attention_flops_efficiency":
        flops_per_pair = 4 * table.model.q_size // table.tp
        floor = latency * hw.peak_flops(table.model.dtype_bytes) / flops_per_pair
        return [
            (table, _attention(q, c, 0, 0, bs, layers), t)
            for q, c, t in table.prefill
            if q * (q + c) >= floor
        ]
    if field == "mixed_attention_bandwidth_efficiency":
        # The decodes govern: their reads at peak over LATENCY_SHARE latencies, and longer
        # at the decode-only efficiency than the chunk's attention as ``hw`` prices it.
        roof = RooflineCostModel(table.model, hw, table.tp, block_size=bs)
        rate = hw.hbm_bandwidth_bytes_per_s
        points: list[Point] = []
        for q, c, n, kvd, t in table.mixed:
            kv_bytes = n * kvd * table.kv_bytes_per_token
            reads = kv_bytes / (rate * hw.attention_bandwidth_efficiency)
            chunk = roof.prefill_attention_s(((q, c),)) / layers
            if kv_bytes >= latency * rate and reads >= chunk:
                points.append((table, _attention(q, c, n, kvd, bs, layers), t))
        return points
    raise ValueError(f"no fit for HardwareSpec.{field}; fitted: {', '.join(FIELDS)}")


def _with(hw: HardwareSpec, field: str, value: float) -> HardwareSpec:
    changes: dict[str, Any] = {field: value}
    return replace(hw, **changes)


def _median_error(points: list[Point], hw: HardwareSpec) -> float:
    """The median of log(predicted / measured) over ``points``, priced on ``hw``."""
    models: dict[int, tuple[RooflineCostModel, LayerOps]] = {}
    errors = []
    for table, price, measured in points:
        pair = models.get(id(table))
        if pair is None:
            roof = RooflineCostModel(table.model, hw, table.tp, block_size=table.block_size)
            pair = models[id(table)] = (roof, roof.layer_ops)
        errors.append(math.log(price(*pair) / measured))
    return statistics.median(errors)


def fit_efficiency(
    field: str, tables: Iterable[OpTable], hw: HardwareSpec, tolerance: float = 1e-4
) -> EfficiencyFit:
    """The value of ``field`` at which the roofline's median error over the points it governs
    is zero, the other fields as ``hw`` has them (bisection: a higher efficiency never makes
    a kernel slower); 1 when even the datasheet's peak leaves the roofline slower."""
    points = [point for table in tables for point in _points(field, table, hw)]
    if not points:
        raise EfficiencyFitError(f"no measured point governs HardwareSpec.{field}")

    def error(value: float) -> float:
        return _median_error(points, _with(hw, field, value))

    before = _median_error(points, hw)
    low, high = 0.01, 1.0
    clipped = error(high) > 0
    if not clipped and error(low) < 0:
        raise EfficiencyFitError(f"HardwareSpec.{field}: the tables are slower than 1% of peak")
    while not clipped and high - low > tolerance:
        mid = (low + high) / 2
        low, high = (mid, high) if error(mid) > 0 else (low, mid)
    value = 1.0 if clipped else (low + high) / 2
    after = error(value)
    return EfficiencyFit(
        field, value, len(points), 100 * math.expm1(before), 100 * math.expm1(after), clipped
    )


def fit_efficiencies(
    tables: Iterable[OpTable], hw: HardwareSpec, digits: int = 2, max_passes: int = 20
) -> dict[str, EfficiencyFit]:
    """Every efficiency of FIELDS that the tables govern, in that order, each fitted on ``hw``
    with the others as last fitted, pass after pass until none moves by more than a tenth of
    the last digit (the GEMM's three price the same points a little each: the weight reads
    at 16 tokens hold a share of FLOPs the overlap does not hide), rounded to ``digits`` as a
    preset states them. ``before_pct`` is the first pass's."""
    tables = list(tables)
    fits: dict[str, EfficiencyFit] = {}
    first: dict[str, float] = {}
    for _ in range(max_passes):
        moved = 0.0
        for field in FIELDS:
            try:
                fit = fit_efficiency(field, tables, hw)
            except EfficiencyFitError:
                continue
            first.setdefault(field, fit.before_pct)
            last = fits[field].value if field in fits else math.inf
            moved = max(moved, abs(fit.value - last))
            fits[field] = fit
            hw = _with(hw, field, fit.value)
        if moved < 0.1 * 10.0**-digits:
            break
    for field, fit in fits.items():
        hw = _with(hw, field, round(fit.value, digits))
    return {
        field: replace(fit, value=round(fit.value, 6), before_pct=first[field])
        for field, fit in fits.items()
    }


def bundle_tables(folder: str | Path, model: ModelSpec | None = None) -> list[OpTable]:
    """One OpTable per TP folder of an LLMServingSim bundle (``meta.yaml`` beside ``tp<N>/``),
    read as ``python -m sim profile import-llmservingsim`` reads it: the four projections'
    rows summed, and the attention points (a decode's context: the cached tokens plus the one
    it decodes)."""
    from core.model.presets import load_model_spec
    from sim.costmodel.llmservingsim_import import llmservingsim_profile

    root = Path(folder)
    tables = []
    for tp_dir in sorted(root.glob("tp*")):
        if not tp_dir.name[2:].isdigit():
            continue
        tp = int(tp_dir.name[2:])
        profile = llmservingsim_profile(root, tp, "efficiency fit", model)
        spec = model if model is not None else load_model_spec(profile["model"])
        linear, attention = profile["ops"]["linear"], profile["ops"]["attention"]
        decode, prefill, mixed = [], [], []
        for pc, kp, nd, kvd, t in zip(*attention.values(), strict=True):
            if pc == 0:
                decode.append((nd, kvd + 1, t))
            elif nd == 0:
                prefill.append((pc, kp, t))
            else:
                mixed.append((pc, kp, nd, kvd + 1, t))
        lin = tuple(zip(linear["num_tokens"], linear["time_s"], strict=True))
        block_size = profile["block_size"]
        tables.append(
            OpTable(
                f"{root}/{tp_dir.name}", spec, tp, block_size, lin, tuple(decode), tuple(prefill),
                tuple(mixed), _bundle_rows(tp_dir / "dense.csv"),
            )
        )  # fmt: skip
    if not tables:
        raise EfficiencyFitError(f"{root}: no tp<N> folder")
    return tables


def _bundle_rows(dense: Path) -> tuple[tuple[str, int, float], ...]:
    """The row kernels' calls in a bundle's ``dense.csv`` (read after the import checked it)."""
    with dense.open(newline="") as handle:
        return tuple(
            (BUNDLE_ROWS[row["layer"]], int(row["tokens"]), float(row["time_us"]) * 1e-6)
            for row in csv.DictReader(handle)
            if row["layer"] in BUNDLE_ROWS
        )


def servesim_table(path: str | Path) -> OpTable:
    """The linear layers of a servesim profile timed on a GPU (``python -m sim calibrate``):
    its ``linear`` table, the layer's four projections (cuBLAS GEMMs, as in vLLM), made
    monotone in tokens as the cost model reads a GPU profile (``calibrated.monotone``). Its
    attention tables time servesim's own Triton kernels, not the ones the roofline's
    attention efficiencies describe, so they are left out."""
    from sim.costmodel.calibrated import monotone
    from sim.costmodel.profile import Table1D

    profile, table = gpu_profile_op(path, "linear", Table1D)
    assert isinstance(table, Table1D)
    linear = monotone(table)
    points = tuple((round(x), t) for x, t in zip(linear.xs, linear.times_s, strict=True))
    spec = model_of(profile)
    return OpTable(str(path), spec, profile.tp, profile.block_size, linear=points)


def gpu_profile_op(path: str | Path, op: str, kind: type) -> tuple[Any, Any]:
    """A servesim profile timed on a GPU and its ``op`` table, which must be a ``kind``."""
    from sim.costmodel.calibrated_host import is_cpu_profile
    from sim.costmodel.profile import load_profile

    profile = load_profile(path)
    if is_cpu_profile(profile):
        raise EfficiencyFitError(f"{path}: field 'device': timed on a CPU, not a GPU")
    table = profile.ops.get(op)
    if not isinstance(table, kind):
        raise EfficiencyFitError(f"{path}: field 'ops.{op}': missing")
    return profile, table


def model_of(profile: Any) -> ModelSpec:
    from core.model.presets import load_model_spec

    return load_model_spec(profile.model)


def vidur_tables(vidur_dir: str | Path, model: ModelSpec, gpu: str) -> list[OpTable]:
    """One OpTable per TP degree of ``model``'s Vidur files on ``gpu`` (``compute/<gpu>/``,
    matched by shape as ``import-vidur`` matches them): mlp.csv's four projections summed,
    attention.csv's decode and prefill rows (it times no step with both)."""
    from sim.costmodel.vidur_profiles import find_vidur_files, read_attention_csv, read_mlp_csv

    found = find_vidur_files(vidur_dir, model, gpu)
    linear: dict[int, list[tuple[int, float]]] = {}
    rows: dict[int, list[tuple[str, int, float]]] = {}
    kernels = [op for ops in ROW_OPS.values() for op in ops]
    if found.mlp is not None:
        for row in read_mlp_csv(found.mlp):
            if all(row.op_s.get(op, 0) > 0 for op in LINEAR_OPS):
                seconds = sum(row.op_s[op] for op in LINEAR_OPS)
                linear.setdefault(row.tp, []).append((row.num_tokens, seconds))
            calls = [(op, row.num_tokens, row.op_s.get(op, 0.0)) for op in kernels]
            rows.setdefault(row.tp, []).extend(call for call in calls if call[2] > 0)
    decode: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    prefill: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    if found.attention is not None:
        for a in read_attention_csv(found.attention):
            if a.time_s <= 0:
                continue
            if a.is_prefill:
                point = (a.prefill_chunk_size, a.kv_cache_size, a.time_s)
                prefill.setdefault((a.tp, a.block_size), []).append(point)
            else:
                point = (a.batch_size, a.kv_cache_size, a.time_s)
                decode.setdefault((a.tp, a.block_size), []).append(point)
    tables = [
        OpTable(f"{found.mlp} tp{tp}", model, tp, 16, tuple(points), row=tuple(rows.get(tp, ())))
        for tp, points in sorted(linear.items())
        if model.num_heads % tp == 0
    ]
    for tp, bs in sorted(set(decode) | set(prefill)):
        decodes, prefills = tuple(decode.get((tp, bs), ())), tuple(prefill.get((tp, bs), ()))
        tables.append(OpTable(f"{found.attention} tp{tp}", model, tp, bs, (), decodes, prefills))
    return tables
