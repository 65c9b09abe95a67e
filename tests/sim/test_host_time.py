"""The host-time model: its parameter sets, the launches it counts, how host and GPU time combine,
and the roofline pricing a step with it (by shape when the host reads more than aggregates)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from core.model.presets import load_model_spec
from sim.costmodel.config import CostModelConfig
from sim.costmodel.host_time import (
    ENGINE_KINDS,
    SERVESIM_EAGER_HOST,
    VLLM_HOST,
    HostParams,
    HostTime,
    HostTimeModel,
    host_params,
)
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import get_hardware_preset


def test_every_kind_has_a_parameter_set() -> None:
    for kind in ENGINE_KINDS:
        assert isinstance(host_params(kind), HostParams)
    assert host_params("vllm").async_scheduling
    assert not host_params("vllm", async_scheduling=False).async_scheduling
    assert host_params("servesim-graphs").cuda_graphs
    with pytest.raises(ValueError, match="engine kind must be one of"):
        host_params("tgi")
    with pytest.raises(ValueError, match="no async scheduling"):
        host_params("servesim-eager", async_scheduling=True)


@pytest.mark.parametrize(
    ("field", "value"), [("step_s", -1e-3), ("layer_s", float("inf")), ("overlap_loss", 1.5)]
)
def test_bad_parameters_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"HostParams.{field}"):
        HostParams(**{field: value})


def test_async_scheduling_takes_the_longer_clock() -> None:
    model = HostTimeModel(HostParams(step_s=2e-3, async_scheduling=True), 32, 8)
    host = model.host_time(0, 4, 400, 28)
    assert model.duration_s(host, 1e-3) == pytest.approx(2e-3)
    assert model.duration_s(host, 5e-3) == pytest.approx(5e-3)


def test_a_serial_host_adds_to_the_gpu() -> None:
    model = HostTimeModel(HostParams(step_s=2e-3, seq_s=1e-5), 32, 8)
    host = model.host_time(1, 3, 300, 40)
    assert host.before_s == pytest.approx(2e-3 + 4e-5)
    assert model.duration_s(host, 5e-3) == pytest.approx(5e-3 + 2.04e-3)


def test_eager_launching_overlaps_the_kernels_but_not_preparation() -> None:
    params = HostParams(step_s=1e-3, layer_s=1e-4, overlap_loss=0.5, sampled_row_s=1e-5)
    model = HostTimeModel(params, 10, 8)
    host = model.host_time(0, 2, 200, 14)
    assert host.launch_s == pytest.approx(1e-3)  # 10 layers x 1e-4 (no attention launch cost)
    # Launch-bound: before + launch + half the GPU's shorter time + after.
    assert model.duration_s(host, 4e-4) == pytest.approx(1e-3 + 1e-3 + 2e-4 + 2e-5)
    # GPU-bound: the launches hide under the kernels but for half of them.
    assert model.duration_s(host, 5e-3) == pytest.approx(1e-3 + 5e-3 + 5e-4 + 2e-5)


def test_graphs_replace_a_decode_steps_launches_only() -> None:
    params = HostParams(layer_s=1e-4, graph_replay_s=5e-5, cuda_graphs=True)
    model = HostTimeModel(params, 32, 8)
    decode = model.host_time(0, 8, 800, 56)
    assert decode.graphs and decode.launch_s == 5e-5
    assert model.duration_s(decode, 1e-3) == pytest.approx(1e-3 + 5e-5)
    prefill = model.host_time(1, 8, 800, 60)
    assert not prefill.graphs and prefill.launch_s == pytest.approx(32e-4)


def test_stalls_add_their_share_of_the_host_time() -> None:
    model = HostTimeModel(HostParams(step_s=1e-3, stall_share=0.1), 32, 8)
    assert model.duration_s(HostTime(1e-3, 0.0, 0.0), 2e-3) == pytest.approx(3.1e-3)


def test_attention_launches_follow_the_engine() -> None:
    model = HostTimeModel(HostParams(split_programs=264, split_min_context=449), 32, 8)
    assert not model.splits(4, 100)  # short contexts: no split
    assert model.splits(4, 2000)  # 32 programs < 264: split
    assert not model.splits(40, 2000)  # 320 programs: no split
    assert model.attention_launches(1, 0, split=False) == 2  # store + prefill
    assert model.attention_launches(0, 4, split=False) == 2  # store + decode
    assert model.attention_launches(0, 4, split=True) == 3  # + the split's reduction
    assert model.attention_launches(1, 40, split=False) == 6  # mixed: buffer and two copies
    never = HostTimeModel(HostParams(), 32, 8)
    assert not never.splits(1, 5000)


def test_a_mixed_step_whose_decodes_split_pays_its_extra() -> None:
    params = HostParams(attention_launch_s=1e-5, split_programs=264, mixed_split_s=2e-4)
    model = HostTimeModel(params, 32, 8)
    mixed_split = model.host_time(1, 4, 2000, 0).launch_s
    assert mixed_split == pytest.approx(32 * (7 * 1e-5 + 2e-4))
    assert model.host_time(1, 40, 2000, 0).launch_s == pytest.approx(32 * 6 * 1e-5)
    assert model.host_time(0, 4, 2000, 0).launch_s == pytest.approx(32 * 3 * 1e-5)


def test_piecewise_graphs_price_a_small_steps_layers_as_replays() -> None:
    params = HostParams(
        layer_s=1e-4, attention_launch_s=1e-5, graph_replay_s=5e-5, cuda_graphs=True,
        piecewise_graphs=True, piece_replay_s=2e-6, piecewise_max_tokens=64,
    )  # fmt: skip
    model = HostTimeModel(params, 32, 8)
    # Between the pieces: the decode and prefill kernels and a mixed step's two slice
    # copies; the KV store and the output buffer are in the graphs.
    assert model.attention_launches(1, 40, split=False, piecewise=True) == 4
    assert model.attention_launches(1, 0, split=False, piecewise=True) == 1
    assert model.attention_launches(0, 40, split=True, piecewise=True) == 2
    mixed = model.host_time(1, 4, 300, 30, num_tokens=36)
    assert not mixed.graphs  # launched piece by piece, overlapping the GPU as eager steps do
    assert mixed.launch_s == pytest.approx(32 * (2e-6 + 4 * 1e-5) + 2e-6)
    eager = model.host_time(1, 4, 300, 30, num_tokens=65)  # past the largest size
    assert eager.launch_s == pytest.approx(32 * (1e-4 + 6 * 1e-5))
    assert model.host_time(1, 4, 300, 30).launch_s == eager.launch_s  # no token count: eager
    assert model.host_time(0, 4, 300, 30, num_tokens=4).graphs  # decodes: the full graph
    off = HostTimeModel(replace(params, piecewise_graphs=False), 32, 8)
    assert off.host_time(1, 4, 300, 30, num_tokens=36).launch_s == eager.launch_s


def test_the_piecewise_engine_kind_and_its_roofline() -> None:
    params = host_params("servesim-piecewise")
    assert params.piecewise_graphs and params.cuda_graphs and params.piece_replay_s > 0
    assert replace(params, piecewise_graphs=False, piece_replay_s=0.0) == host_params(
        "servesim-graphs"
    )
    with pytest.raises(ValueError, match=r"HostParams\.piecewise_max_tokens"):
        HostParams(piecewise_max_tokens=-1)
    graphs, pieces = (
        _roofline(CostModelConfig(engine=kind, async_scheduling=False))
        for kind in ("servesim-graphs", "servesim-piecewise")
    )
    small = StepShape(prefill_chunks=((40, 0),), decode_context_tokens=(300,) * 8)
    assert pieces.step_time_s(small) < 0.7 * graphs.step_time_s(small)
    large = StepShape(prefill_chunks=((600, 0),), decode_context_tokens=(300,) * 8)
    assert pieces.step_time_s(large) == graphs.step_time_s(large)
    decode = StepShape(decode_context_tokens=(300,) * 8)
    assert pieces.step_time_s(decode) == graphs.step_time_s(decode)
    # The same through the host model's own entry, from a shape.
    device = 5e-3
    assert pieces.host.step_overhead_s(small, 16, device) < graphs.host.step_overhead_s(
        small, 16, device
    )


def _roofline(config: CostModelConfig) -> RooflineCostModel:
    return RooflineCostModel(
        load_model_spec("llama-3-8b"), get_hardware_preset("H200"), 1, config, block_size=16
    )


def test_vllm_default_is_the_per_step_and_per_sequence_overhead() -> None:
    model = _roofline(CostModelConfig())
    assert model.host.params == VLLM_HOST
    shape = StepShape(decode_context_tokens=(100,))
    terms = model.step_breakdown(shape)
    device = sum(v for k, v in terms.items() if k != "overhead")
    assert model.step_time_s(shape) == pytest.approx(max(device, 2e-3 + 1e-5))


def test_our_engine_is_host_bound_at_small_batch() -> None:
    vllm = _roofline(CostModelConfig())
    eager = _roofline(CostModelConfig(engine="servesim-eager", async_scheduling=False))
    shape = StepShape(decode_context_tokens=(2000,))
    assert eager.host.params == SERVESIM_EAGER_HOST
    # A batch-1 decode of Llama-3-8B on the H200: ~6 ms of kernels, ~16 ms measured.
    assert eager.step_time_s(shape) > 2.5 * vllm.step_time_s(shape)
    terms = eager.step_breakdown(shape)
    assert sum(terms.values()) == pytest.approx(eager.step_time_s(shape))


def test_an_eager_host_is_priced_by_shape() -> None:
    """The eager host reads each step's longest context, which aggregates do not carry: the
    roofline refuses them and the simulator's executor prices such steps by shape."""
    from sim.executor import CostModelExecutor

    model = _roofline(CostModelConfig(engine="servesim-eager", async_scheduling=False))
    assert not model.prices_aggregates
    with pytest.raises(ValueError, match="price by StepShape"):
        model.aggregate_step_time_s((), 2, 200, 14)
    with pytest.raises(ValueError, match="price by StepShape"):
        model.decode_repeat_durations(2, np.array([200]), np.array([14]))
    assert not CostModelExecutor(model).prices_from_shape
    assert _roofline(CostModelConfig()).prices_aggregates


def test_an_eager_run_is_the_same_with_and_without_fast_forward() -> None:
    from core.settings import build
    from sim.run import RunConfig, simulate
    from traces.loaders import load_trace

    trace = load_trace("traces/data/example.csv")
    config = build(RunConfig, policy="chunked", model="llama-3-8b", hardware="H200")
    cost = CostModelConfig(engine="servesim-eager", async_scheduling=False)
    runs = [
        simulate(trace, replace(config, fast_forward=ff), cost_config=cost) for ff in (True, False)
    ]
    assert runs[0].requests_frame().equals(runs[1].requests_frame())
