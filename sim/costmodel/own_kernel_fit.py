"""servesim's own GPU kernels, fitted to the op tables of its calibrations (``python -m sim
calibrate`` on a GPU): the decode kernel's fixed cost a layer, the fused row kernels' fixed cost
and bandwidth, and the LM head's fixed cost. The roofline prices these kernels wherever it
prices servesim's decode walk, for servesim's engines only (docs/hardware_efficiency.md);
vLLM's kernels keep the efficiencies ``efficiency_fit`` derives."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from core.model.spec import ModelSpec
from sim.costmodel.config import CostModelConfig
from sim.costmodel.efficiency_fit import (
    COMPUTE_BOUND_MIN_TOKENS,
    LATENCY_SHARE,
    EfficiencyFit,
    EfficiencyFitError,
    OpTable,
    gpu_profile_op,
    model_of,
)
from sim.costmodel.layer_ops import LayerOps
from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import HardwareSpec

OWN_OPS = ("elementwise", "lm_head")
"""The one-dimensional tables ``KernelTable`` reads: a layer's fused row kernels by tokens,
the LM head and sampler by sequences."""


@dataclass(frozen=True, slots=True)
class KernelTable:
    """One of a servesim profile's one-dimensional op tables: (size, seconds) points, per
    layer for ``elementwise`` (by tokens), per step for ``lm_head`` (by sequences)."""

    source: str
    op: str
    model: ModelSpec
    tp: int
    block_size: int
    points: tuple[tuple[int, float], ...]


def servesim_kernel_table(path: str | Path, op: str) -> KernelTable:
    """``op`` (one of ``OWN_OPS``) of a servesim profile timed on a GPU, as timed."""
    from sim.costmodel.profile import Table1D

    if op not in OWN_OPS:
        raise ValueError(f"op must be one of {OWN_OPS}, got {op!r}")
    profile, table = gpu_profile_op(path, op, Table1D)
    points = tuple((round(x), t) for x, t in zip(table.xs, table.times_s, strict=True) if t > 0)
    return KernelTable(str(path), op, model_of(profile), profile.tp, profile.block_size, points)


def servesim_decode_table(path: str | Path) -> OpTable:
    """The decode-attention table of a servesim profile timed on a GPU: servesim's own split-KV
    kernel, timed eagerly (each point's splits planned for its own context), per layer. Only
    ``fit_decode_latency`` reads it: the roofline's attention efficiencies describe vLLM's
    kernels."""
    from sim.costmodel.profile import Table2D

    profile, table = gpu_profile_op(path, "decode_attention", Table2D)
    points = tuple(
        (round(n), round(c), t)
        for n, row in zip(table.xs, table.times_s, strict=True)
        for c, t in zip(table.ys, row, strict=True)
    )
    return OpTable(str(path), model_of(profile), profile.tp, profile.block_size, decode=points)


def _own_roofline(model: ModelSpec, hw: HardwareSpec, tp: int, bs: int) -> RooflineCostModel:
    """The roofline of servesim's eager engine, which prices servesim's kernels."""
    config = CostModelConfig(engine="servesim-eager")
    roof = RooflineCostModel(model, hw, tp, config, block_size=bs)
    if roof.decode_chain is None:
        raise EfficiencyFitError(f"{hw.name}: no decode walk to price (decode_tile_s is 0)")
    return roof


def _signed_pct(prices: Iterable[float], measured: Iterable[float]) -> float:
    """The median of log(price / measured), as a signed percentage."""
    logs = [math.log(p / t) for p, t in zip(prices, measured, strict=True)]
    return 100 * math.expm1(statistics.median(logs))


def fit_decode_latency(tables: Iterable[OpTable], hw: HardwareSpec) -> EfficiencyFit:
    """``HardwareSpec.decode_latency_s``, servesim's decode kernel's fixed cost a layer, from
    its eagerly timed decode tables (``servesim_decode_table``): the median over the points it
    governs (their KV reads at the datasheet's peak take at most 1/LATENCY_SHARE of the point)
    of the point less the rest of the roofline's price of it on an eager engine (its longest
    walk, reads and FLOPs). ``before_pct`` and ``after_pct``: the roofline's median signed
    error over those points at ``hw``'s value and at the fit."""
    rows: list[tuple[float, float, float]] = []  # (measured, rest of the price, at hw's value)
    for table in tables:
        model, bs, layers = table.model, table.block_size, table.model.num_layers
        roof = _own_roofline(model, replace(hw, decode_latency_s=0.0), table.tp, bs)
        for n, c, t in table.decode:
            reads = n * c * table.kv_bytes_per_token / hw.hbm_bandwidth_bytes_per_s
            if t <= 0 or LATENCY_SHARE * reads > t:
                continue
            kv_read = n * -(-c // bs) * bs
            rest = roof.decode_attention_s(n, n * c, kv_read, False, c) / layers
            rows.append((t, rest, rest + hw.decode_latency_s))
    if not rows:
        raise EfficiencyFitError("no measured point governs HardwareSpec.decode_latency_s")
    value = max(0.0, statistics.median(t - rest for t, rest, _ in rows))
    measured = [t for t, _, _ in rows]
    before = _signed_pct((at for _, _, at in rows), measured)
    after = _signed_pct((rest + value for _, rest, _ in rows), measured)
    return EfficiencyFit("decode_latency_s", value, len(rows), before, after, False)


def fit_fused_rows(
    tables: Iterable[KernelTable], hw: HardwareSpec
) -> tuple[EfficiencyFit, EfficiencyFit]:
    """``fused_row_latency_s`` and ``fused_row_bandwidth_efficiency`` from servesim's
    ``elementwise`` tables (a layer's fused kernels, ``LayerOps.fused_elementwise_s``): the
    fixed cost is the median over the points it governs (their bytes at the datasheet's peak
    take at most 1/LATENCY_SHARE of the point) of the point less its bytes at ``hw``'s
    efficiency, a kernel's share; the efficiency, the median over the points of
    COMPUTE_BOUND_MIN_TOKENS tokens or more of their bytes at peak over the point less those
    fixed costs (at most 1). Both fits' ``before_pct`` and ``after_pct``: the roofline's median
    signed error over every point with vLLM's row kernels (as it priced servesim's before) and
    with the fused kernels at the fits."""
    rows: list[tuple[int, float, int, float]] = []  # (tokens, seconds, kernels, bytes a token)
    unfused: list[float] = []  # each point priced as vLLM's row kernels
    for table in tables:
        if table.op != "elementwise":
            raise ValueError(f"{table.source}: fit_fused_rows reads elementwise, not {table.op}")
        ops = LayerOps(table.model, hw, table.tp, fused=True)
        rows += [(n, t, ops.num_fused_kernels, ops.fused_bytes_per_token) for n, t in table.points]
        vllm = LayerOps(table.model, hw, table.tp)
        unfused += [vllm.elementwise_s(n) for n, _ in table.points]
    peak = hw.hbm_bandwidth_bytes_per_s
    rate = peak * hw.fused_row_bandwidth_efficiency
    fixed = [(t - n * b / rate) / k for n, t, k, b in rows if LATENCY_SHARE * n * b / peak <= t]
    if not fixed:
        raise EfficiencyFitError("no measured point governs HardwareSpec.fused_row_latency_s")
    latency = max(0.0, statistics.median(fixed))
    shares = [
        n * b / peak / (t - k * latency)
        for n, t, k, b in rows
        if n >= COMPUTE_BOUND_MIN_TOKENS and t > k * latency
    ]
    if not shares:
        raise EfficiencyFitError(
            "no measured point governs HardwareSpec.fused_row_bandwidth_efficiency"
        )
    share = statistics.median(shares)
    efficiency = min(1.0, share)

    def priced(lat: float, eff: float) -> list[float]:
        return [k * lat + n * b / (peak * eff) for n, _, k, b in rows]

    measured = [t for _, t, _, _ in rows]
    before = _signed_pct(unfused, measured)
    after = _signed_pct(priced(latency, efficiency), measured)
    return (
        EfficiencyFit("fused_row_latency_s", latency, len(fixed), before, after, False),
        EfficiencyFit(
            "fused_row_bandwidth_efficiency", efficiency, len(shares), before, after, share > 1
        ),
    )


def fit_lm_head_latency(tables: Iterable[KernelTable], hw: HardwareSpec) -> EfficiencyFit:
    """``lm_head_latency_s`` from servesim's ``lm_head`` tables (the final norm, the logits
    GEMM and the sampler, by sequences): the median over every point of the point less the
    rest of the roofline's price of it (the GEMM and the sampler's bytes), which stays about
    the same from 1 to 256 sequences on an H200. ``before_pct``: the roofline's median signed
    error over the points without it, ``after_pct`` with the fit."""
    rows: list[tuple[float, float]] = []  # (measured, rest of the price)
    for table in tables:
        if table.op != "lm_head":
            raise ValueError(f"{table.source}: fit_lm_head_latency reads lm_head, not {table.op}")
        bare = replace(hw, lm_head_latency_s=0.0)
        roof = _own_roofline(table.model, bare, table.tp, table.block_size)
        rows += [(t, roof.lm_head_s(n)) for n, t in table.points]
    if not rows:
        raise EfficiencyFitError("no measured point governs HardwareSpec.lm_head_latency_s")
    value = max(0.0, statistics.median(t - rest for t, rest in rows))
    measured = [t for t, _ in rows]
    before = _signed_pct((rest for _, rest in rows), measured)
    after = _signed_pct((rest + value for _, rest in rows), measured)
    return EfficiencyFit("lm_head_latency_s", value, len(rows), before, after, False)
