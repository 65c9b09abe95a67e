"""servesim's own kernels in the roofline: its engines are priced with the fused row kernels and
the LM head's fixed cost, vLLM's as before; the fits recover the values that made a table, and
the H200 preset states what its calibrations' tables give."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.model.presets import load_model_spec
from sim.costmodel.config import CostModelConfig
from sim.costmodel.efficiency_fit import EfficiencyFitError
from sim.costmodel.layer_ops import LayerOps
from sim.costmodel.own_kernel_fit import (
    KernelTable,
    fit_fused_rows,
    fit_lm_head_latency,
    servesim_kernel_table,
)
from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import HardwareSpec, get_hardware_preset

MODEL = load_model_spec("Llama-3-8B")
H200 = get_hardware_preset("H200")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu-h200-2026-11-27"
PROFILES = [
    CHECK / "call2" / calibration / name
    for calibration in ("calibrate", "calibrate-eager")
    for name in ("profile.json", "profile-repeat2.json")
]


def _roofline(engine: str, hw: HardwareSpec = H200) -> RooflineCostModel:
    return RooflineCostModel(MODEL, hw, 1, CostModelConfig(engine=engine), block_size=16)


def _rows_table(hw: HardwareSpec) -> KernelTable:
    ops = LayerOps(MODEL, hw, 1, fused=True)
    points = tuple((n, ops.elementwise_s(n)) for n in TOKENS)
    return KernelTable("synthetic rows", "elementwise", MODEL, 1, 16, points)


def _lm_head_table(hw: HardwareSpec) -> KernelTable:
    roof = _roofline("servesim-eager", hw)
    points = tuple((n, roof.lm_head_s(n)) for n in SEQS)
    return KernelTable("synthetic lm head", "lm_head", MODEL, 1, 16, points)


def test_servesim_engines_price_their_fused_rows_and_lm_head_and_vllm_keeps_its_kernels() -> None:
    vllm, graphs = _roofline("vllm"), _roofline("servesim-graphs")
    unfused = LayerOps(MODEL, H200, 1)
    fused = LayerOps(MODEL, H200, 1, fused=True)
    layers = MODEL.num_layers
    for n in (1, 64, 2048):
        # The same embedding beside either layer set.
        layer_sets = layers * (unfused.elementwise_s(n) - fused.elementwise_s(n))
        assert vllm.elementwise_s(n) - graphs.elementwise_s(n) == pytest.approx(layer_sets)
        assert not vllm.layer_ops.fused and graphs.layer_ops.fused
    # Two add+norms, rotary and SiLU-and-mul, each its fixed cost, plus their bytes.
    assert fused.num_fused_kernels == 4
    hidden, inter, qkv = MODEL.hidden_size, MODEL.intermediate_size, MODEL.q_size
    qkv += 2 * MODEL.num_kv_heads * MODEL.head_dim
    q_k = qkv - MODEL.num_kv_heads * MODEL.head_dim
    assert fused.fused_bytes_per_token == 2 * (8 * hidden + 2 * q_k + 3 * inter)
    rate = H200.hbm_bandwidth_bytes_per_s * H200.fused_row_bandwidth_efficiency
    expected = 4 * H200.fused_row_latency_s + 1024 * fused.fused_bytes_per_token / rate
    assert fused.elementwise_s(1024) == pytest.approx(expected)
    # About half the unfused price on an H200, whose calibrations time 13.3 us a layer.
    assert fused.elementwise_s(1) == pytest.approx(13.2e-6, abs=0.1e-6)
    assert unfused.elementwise_s(1) > 2 * fused.elementwise_s(1)
    for n in (1, 256):
        assert graphs.lm_head_s(n) == pytest.approx(vllm.lm_head_s(n) + H200.lm_head_latency_s)


def test_without_servesims_kernels_the_roofline_prices_vllms() -> None:
    """No decode walk (the CPU, or a GPU whose tile time is 0): no fused rows, no LM head
    fixed cost, whatever the engine."""
    cpu_like = dataclasses.replace(H200, decode_tile_s=0.0)
    eager, vllm = _roofline("servesim-eager", cpu_like), _roofline("vllm", cpu_like)
    assert not eager.layer_ops.fused
    for n in (1, 300):
        assert eager.elementwise_s(n) == vllm.elementwise_s(n)
        assert eager.lm_head_s(n) == vllm.lm_head_s(n)


def test_the_fused_row_fit_recovers_the_latency_and_bandwidth_that_made_the_table() -> None:
    truth = dataclasses.replace(
        H200, fused_row_latency_s=4.1e-6, fused_row_bandwidth_efficiency=0.8
    )
    latency, bandwidth = fit_fused_rows([_rows_table(truth)], truth)
    assert latency.field == "fused_row_latency_s"
    assert latency.value == pytest.approx(4.1e-6, rel=1e-9)
    assert bandwidth.value == pytest.approx(0.8, rel=1e-9)
    assert latency.after_pct == pytest.approx(0.0, abs=1e-9)
    assert latency.before_pct > 0  # vLLM's unfused row kernels price them slow
    # The fixed cost stands on the short points, the bandwidth on 1,024 tokens and more.
    assert latency.num_points == 6
    assert bandwidth.num_points == 2
    assert not bandwidth.clipped


def test_the_fused_row_fit_stops_at_the_datasheet_peak_and_refuses_tables_it_cannot_read() -> None:
    fast = dataclasses.replace(H200, fused_row_bandwidth_efficiency=1.0)
    table = _rows_table(fast)
    quicker = dataclasses.replace(table, points=tuple((n, t * 0.9) for n, t in table.points))
    _, bandwidth = fit_fused_rows([quicker], H200)
    assert bandwidth.value == 1.0 and bandwidth.clipped
    with pytest.raises(ValueError, match="reads elementwise, not lm_head"):
        fit_fused_rows([_lm_head_table(H200)], H200)
    short_only = dataclasses.replace(table, points=table.points[:3])
    with pytest.raises(EfficiencyFitError, match="fused_row_bandwidth_efficiency"):
        fit_fused_rows([short_only], H200)


def test_the_lm_head_fit_recovers_the_fixed_cost_that_made_the_table() -> None:
    truth = dataclasses.replace(H200, lm_head_latency_s=1.2e-4)
    fit = fit_lm_head_latency([_lm_head_table(truth)], H200)
    assert fit.value == pytest.approx(1.2e-4, rel=1e-9)
    assert fit.num_points == len(SEQS)
    assert fit.before_pct < 0 < fit.before_pct + 100  # without it, the roofline is fast
    with pytest.raises(EfficiencyFitError, match="decode_tile_s is 0"):
        fit_lm_head_latency([_lm_head_table(truth)], dataclasses.replace(H200, decode_tile_s=0.0))


def test_the_h200_preset_states_what_our_calibrations_tables_give() -> None:
    """The four calibrations of the 2026-11-27 GPU check (benchmarks/derive_efficiencies.py
    --gpu H200), pooled, as the preset states them: 0.1 us and two digits."""
    rows = [servesim_kernel_table(p, "elementwise") for p in PROFILES]
    lm_head = [servesim_kernel_table(p, "lm_head") for p in PROFILES]
    latency, bandwidth = fit_fused_rows(rows, H200)
    assert H200.fused_row_latency_s == pytest.approx(round(latency.value, 7))
    assert H200.fused_row_bandwidth_efficiency == round(bandwidth.value, 2)
    lm_head_fit = fit_lm_head_latency(lm_head, H200)
    assert H200.lm_head_latency_s == pytest.approx(round(lm_head_fit.value, 7))
    # Each table alone: the fixed cost within 0.15 us, the bandwidth within 0.03.
    for table in rows:
        alone_latency, alone_bandwidth = fit_fused_rows([table], H200)
        assert alone_latency.value == pytest.approx(latency.value, abs=1.5e-7)
        assert alone_bandwidth.value == pytest.approx(bandwidth.value, abs=0.03)


def test_a_kernel_table_names_its_op_and_refuses_others(tmp_path: Path) -> None:
    table = servesim_kernel_table(PROFILES[0], "lm_head")
    assert table.op == "lm_head" and table.points[0][0] == 1
    with pytest.raises(ValueError, match="op must be one of"):
        servesim_kernel_table(PROFILES[0], "linear")
    with pytest.raises(ValueError, match=r"missing\.json: cannot read"):
        servesim_kernel_table(tmp_path / "missing.json", "elementwise")
