"""Kernel efficiencies derived from op-level tables: the fit recovers the efficiencies that made
a table, stops at the datasheet's peak, and the presets that state derived values state what
their tables give (on ../shared's tables, when present)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.model.presets import load_model_spec
from sim.costmodel.config import CostModelConfig
from sim.costmodel.efficiency_fit import (
    FIELDS,
    ROW_OPS,
    EfficiencyFitError,
    OpTable,
    bundle_tables,
    fit_efficiencies,
    fit_efficiency,
    servesim_table,
    vidur_tables,
)
from sim.costmodel.layer_ops import LINEAR_OPS, LayerOps
from sim.costmodel.own_kernel_fit import fit_decode_latency, servesim_decode_table
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import HardwareSpec, get_hardware_preset

MODEL = load_model_spec("Llama-3-8B")
A100 = get_hardware_preset("A100-80GB")
TRUTH = {
    "memory_bandwidth_efficiency": 0.83,
    "gemm_flops_efficiency": 0.68,
    "gemm_overlap_efficiency": 0.7,
    "elementwise_bandwidth_efficiency": 0.6,
    "rotary_bandwidth_efficiency": 0.35,
    "attention_bandwidth_efficiency": 0.7,
    "attention_flops_efficiency": 0.45,
    "mixed_attention_bandwidth_efficiency": 0.5,
}
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "profiles"


def _table(hw: HardwareSpec, speedup: float = 1.0) -> OpTable:
    """Op times of MODEL as the roofline prices them on ``hw``, divided by ``speedup``."""
    roof = RooflineCostModel(MODEL, hw, 1, block_size=16)
    ops, layers = LayerOps(MODEL, hw, 1), MODEL.num_layers

    def attention(chunk: int, cached: int, seqs: int, context: int) -> float:
        prefill = roof.prefill_attention_s(((chunk, cached),)) if chunk else 0.0
        reads = seqs * -(-context // 16) * 16
        decode = roof.decode_attention_s(seqs, seqs * context, reads, mixed=chunk > 0)
        return (prefill + decode) / layers / speedup

    tokens = (1, 2, 4, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096)
    linear = tuple((m, sum(ops.op_s(op, m) for op in LINEAR_OPS) / speedup) for m in tokens)
    kernels = [op for names in ROW_OPS.values() for op in names]
    calls = [(op, m, ops.op_s(op, m) / speedup) for op in kernels for m in tokens]
    row = tuple(call for call in calls if call[2] > 0)  # (no QK norm in this model)
    decode = [(n, c, attention(0, 0, n, c)) for n in (16, 64, 256) for c in (1024, 4096, 16384)]
    prefill = [(q, c, attention(q, c, 0, 0)) for q in (1024, 2048, 4096) for c in (0, 4096)]
    mixed = [(64, 0, n, c, attention(64, 0, n, c)) for n in (64, 256) for c in (4096, 16384)]
    return OpTable(
        "synthetic", MODEL, 1, 16, linear, tuple(decode), tuple(prefill), tuple(mixed), row
    )


def test_the_fit_recovers_the_efficiencies_that_made_the_tables() -> None:
    tables = [_table(dataclasses.replace(A100, **TRUTH))]
    fits = fit_efficiencies(tables, A100)
    assert list(fits) == list(FIELDS)
    for field, value in TRUTH.items():
        assert fits[field].value == pytest.approx(value, abs=2e-3), field
        assert fits[field].after_pct == pytest.approx(0.0, abs=0.1)
        assert not fits[field].clipped
    # Before, at the defaults, a lower efficiency than the truth prices slower (+), a higher
    # one faster: flops 0.37 against 0.45; a mixed step's decodes at the decode-only 0.7.
    assert fits["attention_flops_efficiency"].before_pct > 10
    assert fits["mixed_attention_bandwidth_efficiency"].before_pct < -10


def test_tables_faster_than_the_datasheet_clip_at_one() -> None:
    fast = _table(dataclasses.replace(A100, gemm_flops_efficiency=1.0), speedup=1.5)
    fit = fit_efficiency("gemm_flops_efficiency", [fast], A100)
    assert fit.clipped and fit.value == 1.0 and fit.after_pct > 0


def test_an_efficiency_no_point_governs_is_left_out() -> None:
    linear_only = dataclasses.replace(_table(A100), decode=(), prefill=(), mixed=(), row=())
    with pytest.raises(EfficiencyFitError, match="no measured point governs"):
        fit_efficiency("attention_bandwidth_efficiency", [linear_only], A100)
    assert set(fit_efficiencies([linear_only], A100)) == {
        "memory_bandwidth_efficiency",
        "gemm_flops_efficiency",
        "gemm_overlap_efficiency",
    }
    with pytest.raises(ValueError, match=r"no fit for HardwareSpec\.streaming"):
        fit_efficiency("streaming_bandwidth_efficiency", [linear_only], A100)


def test_a_mixed_steps_decodes_read_at_the_mixed_efficiency() -> None:
    shape = StepShape(prefill_chunks=((64, 0),), decode_context_tokens=(2000,) * 32)
    decode_only = StepShape(decode_context_tokens=(2000,) * 32)
    plain = RooflineCostModel(MODEL, A100, 1, block_size=16)
    same = dataclasses.replace(A100, mixed_attention_bandwidth_efficiency=0.75)
    slow = dataclasses.replace(A100, mixed_attention_bandwidth_efficiency=0.375)
    for hw, factor in ((same, 1.0), (slow, 2.0)):
        roof = RooflineCostModel(MODEL, hw, 1, block_size=16)
        assert roof.step_time_s(decode_only) == plain.step_time_s(decode_only)
        latency = MODEL.num_layers * A100.attention_latency_s
        reads = plain.step_breakdown(shape)["decode_attention"] - latency
        mixed = roof.step_breakdown(shape)["decode_attention"] - latency
        assert mixed == pytest.approx(factor * reads)
    with pytest.raises(ValueError, match="mixed_attention_bandwidth_efficiency"):
        dataclasses.replace(A100, mixed_attention_bandwidth_efficiency=1.5)


@pytest.mark.shared
def test_the_rtx_pro_6000_server_preset_states_what_its_tables_give() -> None:
    root = SHARED / "llmservingsim" / "RTXPRO6000"
    if not root.is_dir():
        pytest.skip(f"LLMServingSim bundles not found at {root}")
    tables = [
        t for meta in sorted(root.glob("*/*/bf16/meta.yaml")) for t in bundle_tables(meta.parent)
    ]
    preset = get_hardware_preset("RTX-PRO-6000-Server")
    defaults = {f.name: f.default for f in dataclasses.fields(HardwareSpec) if f.name in FIELDS}
    fits = fit_efficiencies(tables, dataclasses.replace(preset, **defaults))
    assert set(fits) == set(FIELDS)
    for field, fit in fits.items():
        assert getattr(preset, field) == round(fit.value, 2), field


def test_the_h200_preset_states_what_our_calibrations_linear_tables_give() -> None:
    """The H200's GEMM efficiencies are those of the four calibrations committed with the GPU
    check (benchmarks/derive_efficiencies.py --gpu H200)."""
    check = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    check = check / "gpu-h200-2026-11-27" / "call2"
    tables = [
        servesim_table(check / calibration / name)
        for calibration in ("calibrate", "calibrate-eager")
        for name in ("profile.json", "profile-repeat2.json")
    ]
    # Read monotone: the timing round's slow first call (linear at one token) is gone.
    times = [t for _, t in tables[0].linear]
    assert times == sorted(times)
    preset = get_hardware_preset("H200")
    defaults = {f.name: f.default for f in dataclasses.fields(HardwareSpec) if f.name in FIELDS}
    fits = fit_efficiencies(tables, dataclasses.replace(preset, **defaults))
    gemm = {"memory_bandwidth_efficiency", "gemm_flops_efficiency", "gemm_overlap_efficiency"}
    assert set(fits) == gemm  # the linear tables govern nothing else
    for field, fit in fits.items():
        assert getattr(preset, field) == round(fit.value, 2), field


def _decode_table(hw: HardwareSpec) -> OpTable:
    """servesim's decode attention as the roofline prices it on an eager engine on ``hw``,
    per layer: short contexts (the latency governs) and long ones (the reads do)."""
    config = CostModelConfig(engine="servesim-eager")
    roof = RooflineCostModel(MODEL, hw, 1, config, block_size=16)
    points = []
    for n in (1, 4, 16, 64):
        for c in (16, 64, 256, 4096, 16384):
            reads = n * -(-c // 16) * 16
            points.append((n, c, roof.decode_attention_s(n, n * c, reads, False, c) / 32))
    return OpTable("synthetic decode", MODEL, 1, 16, decode=tuple(points))


def test_the_decode_latency_fit_recovers_the_latency_that_made_the_table() -> None:
    h200 = get_hardware_preset("H200")
    table = _decode_table(dataclasses.replace(h200, decode_latency_s=6.5e-6))
    fit = fit_decode_latency([table], dataclasses.replace(h200, decode_latency_s=15e-6))
    assert fit.value == pytest.approx(6.5e-6, rel=1e-9)
    assert fit.after_pct == pytest.approx(0.0, abs=1e-9)
    assert fit.before_pct > 0  # 15 us prices those points slow
    # Only the points whose reads take under a tenth of their time stand in the fit: the
    # long contexts at 64 decodes do not.
    assert 0 < fit.num_points < len(table.decode)


def test_the_decode_latency_needs_a_decode_walk_and_points_it_governs() -> None:
    h200 = get_hardware_preset("H200")
    table = _decode_table(h200)
    with pytest.raises(EfficiencyFitError, match="decode_tile_s is 0"):
        fit_decode_latency([table], dataclasses.replace(h200, decode_tile_s=0.0))
    long_only = dataclasses.replace(table, decode=((64, 16384, 1e-4),))
    with pytest.raises(EfficiencyFitError, match="no measured point governs"):
        fit_decode_latency([long_only], h200)


def test_the_h200_preset_states_the_decode_latency_of_our_calibrations_decode_tables() -> None:
    """The four calibrations of the 2026-11-27 GPU check (benchmarks/derive_efficiencies.py
    --gpu H200), pooled, to the tenth of a microsecond; each alone within 0.3 us of it."""
    check = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    check = check / "gpu-h200-2026-11-27" / "call2"
    paths = [
        check / calibration / name
        for calibration in ("calibrate", "calibrate-eager")
        for name in ("profile.json", "profile-repeat2.json")
    ]
    tables = [servesim_decode_table(p) for p in paths]
    preset = get_hardware_preset("H200")
    pooled = fit_decode_latency(tables, preset)
    assert preset.decode_latency_s == round(pooled.value, 7)
    for table in tables:
        assert fit_decode_latency([table], preset).value == pytest.approx(pooled.value, abs=3e-7)


def test_a_cpu_profile_is_no_source_of_gpu_efficiencies(tmp_path: Path) -> None:
    data = json.loads((Path(__file__).parent / "data" / "llama2_7b_a100_tp1.json").read_text())
    data["device"]["name"] = "cpu (x86_64)"
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    with pytest.raises(EfficiencyFitError, match="timed on a CPU"):
        servesim_table(path)
    with pytest.raises(EfficiencyFitError, match="timed on a CPU"):
        servesim_decode_table(path)


@pytest.mark.shared
def test_vidurs_a100_tables_give_back_the_defaults_within_a_twentieth() -> None:
    vidur = SHARED / "vidur"
    if not (vidur / "compute" / "a100").is_dir():
        pytest.skip(f"Vidur's tables not found at {vidur}")
    tables = [
        t
        for name in ("Llama-2-7B", "Llama-2-70B", "Llama-3-8B")
        for t in vidur_tables(vidur, load_model_spec(name), "a100")
    ]
    fits = fit_efficiencies(tables, A100)
    assert "mixed_attention_bandwidth_efficiency" not in fits  # Vidur times no mixed step
    for field, fit in fits.items():
        stated = getattr(A100, field)
        stated = 1.0 if stated is None else stated  # gemm_overlap_efficiency: all hidden
        assert abs(fit.value - stated) <= 0.05, field


def test_a_gemm_between_the_bounds_hides_only_its_overlap_of_the_shorter_time() -> None:
    """gemm_s: the longer of compute and memory, plus (1 - overlap) of the shorter; None and 1
    are the plain roofline's max."""
    from sim.costmodel.kernel_costs import gemm_s

    n = k = 4096
    plain = gemm_s(A100, 256, n, k, 2)
    assert gemm_s(dataclasses.replace(A100, gemm_overlap_efficiency=1.0), 256, n, k, 2) == plain
    half = gemm_s(dataclasses.replace(A100, gemm_overlap_efficiency=0.5), 256, n, k, 2)
    none = gemm_s(dataclasses.replace(A100, gemm_overlap_efficiency=0.0), 256, n, k, 2)
    extra = none - plain  # the whole shorter term
    assert 0 < extra < plain
    assert half - plain == pytest.approx(extra / 2)
    with pytest.raises(ValueError, match="gemm_overlap_efficiency"):
        dataclasses.replace(A100, gemm_overlap_efficiency=1.2)
