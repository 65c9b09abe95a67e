"""A slower (or faster) host: ``CostModelConfig.host_slowdown`` stretches every second of the
host's clock and nothing of the GPU's, on the roofline and on calibrated profiles (a GPU
profile's stored host set; a CPU profile's whole step, since one processor runs both)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from core.model.presets import load_model_spec
from sim.costmodel.base import CostModelConfig, StepShape, make_cost_model
from sim.costmodel.host_time import HOST_SECONDS, SERVESIM_GRAPHS_HOST, HostParams
from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import get_hardware_preset

ROOT = Path(__file__).resolve().parents[2]
GPU_PROFILE = ROOT / "benchmarks/results/gpu-h200-2026-11-27/call2/calibrate/profile.json"
CPU_PROFILE = ROOT / "benchmarks/results/cpu-calibrations-2026-11-27/3-idle/profile.json"

DECODE = StepShape(prefill_chunks=(), decode_context_tokens=(300, 700, 1200))
MIXED = StepShape(prefill_chunks=((200, 0),), decode_context_tokens=(300, 700))
PREFILL = StepShape(prefill_chunks=((2048, 0),), decode_context_tokens=())


def test_at_speed_scales_the_hosts_seconds_and_keeps_shares_counts_and_flags() -> None:
    base = dataclasses.replace(SERVESIM_GRAPHS_HOST, step_s=1e-3, block_entry_s=2e-7)
    slow = base.at_speed(1.5)
    for field in dataclasses.fields(HostParams):
        before, after = getattr(base, field.name), getattr(slow, field.name)
        if field.name in HOST_SECONDS:
            assert after == pytest.approx(1.5 * before), field.name
        else:
            assert after == before, field.name
    assert base.at_speed(1) is base
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="host slowdown must be finite and > 0"):
            base.at_speed(bad)


@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf])
def test_an_impossible_slowdown_is_refused_naming_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match=r"CostModelConfig\.host_slowdown must be finite and > 0"):
        CostModelConfig(host_slowdown=bad)


def _roofline(**config: object) -> RooflineCostModel:
    spec, hardware = load_model_spec("llama-3-8b"), get_hardware_preset("H200")
    return RooflineCostModel(spec, hardware, 1, CostModelConfig(**config), block_size=16)


def test_the_roofline_stretches_the_host_and_not_the_gpu() -> None:
    # vLLM's host set without async scheduling: the overhead term is all of the host's time.
    base, slow = (_roofline(async_scheduling=False, host_slowdown=s) for s in (1.0, 2.0))
    for shape in (DECODE, MIXED, PREFILL):
        a, b = base.step_breakdown(shape), slow.step_breakdown(shape)
        assert {k: v for k, v in a.items() if k != "overhead"} == {
            k: v for k, v in b.items() if k != "overhead"
        }
        assert b["overhead"] == pytest.approx(2 * a["overhead"])
    # An eager engine's launch-bound decode step stretches with its host; a long prefill,
    # GPU-bound, barely moves.
    eager = [_roofline(engine="servesim-eager", host_slowdown=s) for s in (1.0, 1.5)]
    decode = [m.step_time_s(DECODE) for m in eager]
    prefill = [m.step_time_s(PREFILL) for m in eager]
    assert decode[1] / decode[0] > 1.35
    assert prefill[1] / prefill[0] < decode[1] / decode[0]


def test_a_gpu_profiles_host_set_is_stretched_and_its_tables_are_not() -> None:
    spec, hardware = load_model_spec("llama-3-8b"), get_hardware_preset("H200")
    models = [
        make_cost_model(
            spec,
            hardware,
            1,
            GPU_PROFILE,
            CostModelConfig(engine="servesim-graphs", host_slowdown=s),
            block_size=16,
        )
        for s in (1.0, 1.4)
    ]
    params = [m.host.model.params for m in models]  # type: ignore[attr-defined]
    assert params[1].layer_s == pytest.approx(1.4 * params[0].layer_s)
    assert params[1].seq_s == pytest.approx(1.4 * params[0].seq_s)
    assert params[1].stall_share == params[0].stall_share
    for shape in (DECODE, MIXED):
        a, b = models[0].step_breakdown(shape), models[1].step_breakdown(shape)
        assert [a[k] for k in a if k != "overhead"] == [b[k] for k in b if k != "overhead"]
        assert b["overhead"] > a["overhead"]


def test_a_cpu_profiles_whole_step_is_stretched() -> None:
    spec, hardware = load_model_spec("tiny-llama"), get_hardware_preset("CPU-1T")
    models = [
        make_cost_model(
            spec,
            hardware,
            1,
            CPU_PROFILE,
            CostModelConfig(engine="servesim-eager", price_padding=False, host_slowdown=s),
            block_size=16,
        )
        for s in (1.0, 1.25)
    ]
    for shape in (
        StepShape(prefill_chunks=(), decode_context_tokens=(30, 70)),
        StepShape(prefill_chunks=((64, 0),), decode_context_tokens=(20,)),
    ):
        assert models[1].step_time_s(shape) == pytest.approx(1.25 * models[0].step_time_s(shape))
