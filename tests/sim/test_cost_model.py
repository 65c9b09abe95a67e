"""The analytic roofline cost model: sanity targets, monotonicity, TP, block moves, speed path."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.model.presets import get_model_preset, preset_names
from sim.costmodel.base import (
    TERMS,
    CostModel,
    CostModelConfig,
    RooflineCostModel,
    StepShape,
    make_cost_model,
)
from sim.executor import CostModelExecutor
from sim.specs.hardware import HARDWARE_PRESETS

LLAMA = get_model_preset("Llama-2-7B")
A100 = HARDWARE_PRESETS["A100-80GB"]


@pytest.fixture(scope="module")
def roofline() -> RooflineCostModel:
    return RooflineCostModel(LLAMA, A100, block_size=16)


def test_batch1_decode_is_weight_read_bound(roofline: RooflineCostModel) -> None:
    shape = StepShape(decode_context_tokens=(1024,))
    breakdown = roofline.step_breakdown(shape)
    # 12.95 GB of linear weights / (0.8 x 2.039 TB/s) ~= 7.9 ms, plus 4 GEMM latencies a layer
    weights_s = (
        LLAMA.num_layers * LLAMA.params_per_layer * 2 / (0.8 * A100.hbm_bandwidth_bytes_per_s)
    )
    latency_s = 4 * LLAMA.num_layers * A100.gemm_latency_s
    # Never below the weight read (plus the GEMM latencies), and not far above it.
    assert weights_s + latency_s <= breakdown["linear"] <= 1.1 * (weights_s + latency_s)
    assert 5e-3 <= roofline.step_time_s(shape) <= 20e-3
    assert max(breakdown, key=lambda term: breakdown[term]) == "linear"


def test_2048_prefill_is_compute_bound(roofline: RooflineCostModel) -> None:
    shape = StepShape(prefill_chunks=((2048, 0),))
    # Whole waves of 64x128 tiles over 108 SMs at 75% of each SM's peak, per GEMM (n, k).
    tile_s = {k: 2 * 64 * 128 * k / (312e12 / 108 * 0.75) for k in (4096, 11008)}
    gemms = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)]
    waves = [math.ceil(32 * math.ceil(n / 128) / 108) for n, _ in gemms]
    compute_s = LLAMA.num_layers * sum(
        w * tile_s[k] + A100.gemm_latency_s for w, (_, k) in zip(waves, gemms, strict=True)
    )
    weights_s = (
        LLAMA.num_layers * LLAMA.params_per_layer * 2 / (0.8 * A100.hbm_bandwidth_bytes_per_s)
    )
    assert compute_s > 10 * weights_s
    assert roofline.step_breakdown(shape)["linear"] == pytest.approx(compute_s, rel=1e-9)
    assert 0.1 <= roofline.step_time_s(shape) <= 0.2


def test_breakdown_sums_to_step_time(roofline: RooflineCostModel) -> None:
    shape = StepShape(
        prefill_chunks=((100, 50), (7, 0)),
        decode_context_tokens=(5, 17, 300),
        num_padding_tokens=3,
        num_copy_blocks=2,
        num_swap_out_blocks=1,
        num_swap_in_blocks=4,
    )
    breakdown = roofline.step_breakdown(shape)
    assert tuple(breakdown) == TERMS
    assert sum(breakdown.values()) == pytest.approx(roofline.step_time_s(shape), rel=1e-12)
    # The host's work hides under these kernels (async scheduling, the default).
    assert breakdown["overhead"] == 0.0
    busy = {key: value for key, value in breakdown.items() if key not in ("allreduce", "overhead")}
    assert all(value > 0 for value in busy.values())
    sync = RooflineCostModel(
        LLAMA, A100, config=CostModelConfig(async_scheduling=False), block_size=16
    )
    waited = sync.step_breakdown(shape)
    assert waited["overhead"] == pytest.approx(2e-3 + 5 * 1e-5)
    assert sum(waited.values()) == pytest.approx(sync.step_time_s(shape), rel=1e-12)


def test_async_scheduling_makes_a_step_the_longer_of_host_and_kernels() -> None:
    sync = RooflineCostModel(
        LLAMA, A100, config=CostModelConfig(async_scheduling=False), block_size=16
    )
    overlapped = RooflineCostModel(LLAMA, A100, block_size=16)
    host_s = 2e-3 + 1e-5  # one sequence
    # A batch-1 decode: ~8 ms of weight reads hide the 2 ms of host work.
    decode = StepShape(decode_context_tokens=(1024,))
    kernels_s = sync.step_time_s(decode) - host_s
    assert overlapped.step_time_s(decode) == pytest.approx(kernels_s, rel=1e-12)
    # A tiny step on a tiny model: the host is the longer, and the step lasts what it does.
    small = StepShape(decode_context_tokens=(1,))
    tiny = RooflineCostModel(get_model_preset("tiny-llama"), A100, block_size=16)
    assert tiny.step_time_s(small) == pytest.approx(host_s, rel=1e-12)
    assert tiny.step_breakdown(small)["overhead"] > 0.0
    # Host work longer than any kernel time: the step costs exactly the host's time.
    slow_host = CostModelConfig(step_overhead_s=1.0)
    assert RooflineCostModel(LLAMA, A100, config=slow_host, block_size=16).step_time_s(
        decode
    ) == pytest.approx(1.0 + 1e-5, rel=1e-12)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_fast_paths_match_step_time_either_way(async_scheduling: bool) -> None:
    config = CostModelConfig(async_scheduling=async_scheduling, step_overhead_s=0.02)
    model = RooflineCostModel(LLAMA, A100, config=config, block_size=16)
    for contexts in ((7,), tuple(range(100, 100 + 64 * 13, 13))):
        blocks = sum(math.ceil(c / 16) for c in contexts)
        shape = StepShape(decode_context_tokens=contexts)
        exact = model.step_time_s(shape)
        assert model.decode_step_time_s(len(contexts), sum(contexts), blocks) == exact
        step = model.repeat_stepper((), len(contexts))
        assert step((), sum(contexts), blocks) == exact
        many = model.decode_repeat_durations(
            len(contexts), np.array([sum(contexts)]), np.array([blocks])
        )
        assert many[0] == exact


def test_empty_step_costs_nothing(roofline: RooflineCostModel) -> None:
    assert roofline.step_time_s(StepShape()) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    contexts=st.lists(st.integers(1, 8192), min_size=1, max_size=64),
    extra_context=st.integers(0, 4096),
    chunk=st.tuples(st.integers(1, 4096), st.integers(0, 4096)),
    extra_tokens=st.integers(1, 512),
)
def test_monotone_in_tokens_and_context(
    contexts: list[int], extra_context: int, chunk: tuple[int, int], extra_tokens: int
) -> None:
    model = RooflineCostModel(LLAMA, A100, block_size=16)
    base = StepShape(prefill_chunks=(chunk,), decode_context_tokens=tuple(contexts))
    longer = StepShape(
        prefill_chunks=(chunk,), decode_context_tokens=(contexts[0] + extra_context, *contexts[1:])
    )
    bigger_chunk = StepShape(
        prefill_chunks=((chunk[0] + extra_tokens, chunk[1]),), decode_context_tokens=tuple(contexts)
    )
    more_context = StepShape(
        prefill_chunks=((chunk[0], chunk[1] + extra_tokens),), decode_context_tokens=tuple(contexts)
    )
    more_seqs = StepShape(prefill_chunks=(chunk,), decode_context_tokens=(*contexts, 1))
    for other in (longer, bigger_chunk, more_context, more_seqs):
        assert model.step_time_s(other) >= model.step_time_s(base)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(preset_names()),
    tp=st.sampled_from([1, 2, 4]),
    async_scheduling=st.booleans(),
    overhead_s=st.sampled_from([0.0, 1e-4, 0.05]),
    contexts=st.lists(st.integers(1, 100_000), max_size=40),
    chunks=st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 100_000)), max_size=3),
    block_size=st.sampled_from([1, 16, 32]),
)
def test_aggregate_price_equals_the_step_priced_whole_bit_for_bit(
    model: str,
    tp: int,
    async_scheduling: bool,
    overhead_s: float,
    contexts: list[int],
    chunks: list[tuple[int, int]],
    block_size: int,
) -> None:
    """``aggregate_step_time_s`` (and the stepper it shares with fast-forward) adds the
    terms of ``step_time_s`` itself, in its order: the same float, not just a close one."""
    spec = get_model_preset(model)
    if spec.num_heads % tp:
        return  # not a valid sharding of this model
    config = CostModelConfig(async_scheduling=async_scheduling, step_overhead_s=overhead_s)
    cost = RooflineCostModel(
        spec, HARDWARE_PRESETS["A100-80GB"], tp=tp, config=config, block_size=block_size
    )
    shape = StepShape(prefill_chunks=tuple(chunks), decode_context_tokens=tuple(contexts))
    blocks = sum(-(-c // block_size) for c in contexts)
    got = cost.aggregate_step_time_s(tuple(chunks), len(contexts), sum(contexts), blocks)
    assert got == cost.step_time_s(shape)
    if contexts or chunks:  # (a step with work: what a stepper prices)
        stepper = cost.repeat_stepper(tuple(chunks), len(contexts))
        assert stepper(tuple(chunks), sum(contexts), blocks) == got


def test_decode_reads_whole_blocks(roofline: RooflineCostModel) -> None:
    one = roofline.step_breakdown(StepShape(decode_context_tokens=(1,)))["decode_attention"]
    sixteen = roofline.step_breakdown(StepShape(decode_context_tokens=(16,)))["decode_attention"]
    seventeen = roofline.step_breakdown(StepShape(decode_context_tokens=(17,)))["decode_attention"]
    assert one == pytest.approx(sixteen, rel=0.01)
    fixed = LLAMA.num_layers * A100.attention_latency_s  # every layer's call, whatever it reads
    assert seventeen - fixed > 1.5 * (sixteen - fixed)


def test_tp2_halves_linear_and_adds_allreduce(roofline: RooflineCostModel) -> None:
    tp2 = RooflineCostModel(LLAMA, A100, tp=2, block_size=16)
    for shape in (StepShape(prefill_chunks=((2048, 0),)), StepShape(decode_context_tokens=(512,))):
        one, two = roofline.step_breakdown(shape), tp2.step_breakdown(shape)
        # Half the weights and FLOPs; the fixed GEMM latency does not halve.
        assert one["linear"] / 2 <= two["linear"] <= 0.6 * one["linear"]
        assert one["allreduce"] == 0.0
        assert two["allreduce"] > 0.0


def test_allreduce_matches_alpha_beta_ring_formula() -> None:
    tp4 = RooflineCostModel(LLAMA, A100, tp=4, block_size=16)
    num_bytes = 1e6
    alpha = A100.allreduce_call_latency_s + 6 * A100.interconnect_latency_s
    expected = alpha + 6 / 4 * num_bytes / (300e9 * A100.interconnect_bus_efficiency)
    assert tp4.allreduce_call_s(num_bytes) == pytest.approx(expected)


def test_block_moves_cost_time(roofline: RooflineCostModel) -> None:
    block_bytes = 8 * 2**20  # Llama-2-7B, block 16, tp 1
    copies = roofline.step_breakdown(StepShape(num_copy_blocks=10))
    assert copies["copy_blocks"] == pytest.approx(2 * 10 * block_bytes / (0.8 * 2039e9))
    swaps = roofline.step_breakdown(StepShape(num_swap_out_blocks=3, num_swap_in_blocks=2))
    assert swaps["swap"] == pytest.approx(5 * block_bytes / (0.8 * 32e9))
    assert swaps["linear"] == 0.0


def test_kv_transfer_time(roofline: RooflineCostModel) -> None:
    seconds = roofline.kv_transfer_time_s(1000, 25e9, 1e-5)
    assert seconds == pytest.approx(1e-5 + 1000 * LLAMA.kv_bytes_per_token() / 25e9)
    assert roofline.kv_transfer_time_s(0, 25e9, 1e-5) == 0.0
    with pytest.raises(ValueError, match="link_bandwidth_bytes_per_s"):
        roofline.kv_transfer_time_s(10, 0.0, 0.0)


def test_decode_fast_path_matches_step_time(roofline: RooflineCostModel) -> None:
    contexts = tuple(range(100, 100 + 128 * 13, 13))
    shape = StepShape(decode_context_tokens=contexts)
    blocks = sum(math.ceil(c / 16) for c in contexts)
    fast = roofline.decode_step_time_s(len(contexts), sum(contexts), blocks)
    assert fast == pytest.approx(roofline.step_time_s(shape), rel=1e-12)


def test_deterministic(roofline: RooflineCostModel) -> None:
    shape = StepShape(prefill_chunks=((300, 20),), decode_context_tokens=(40, 50))
    again = RooflineCostModel(LLAMA, A100, block_size=16)
    assert roofline.step_time_s(shape) == again.step_time_s(shape)


def test_config_validation_and_effect() -> None:
    with pytest.raises(ValueError, match=r"CostModelConfig\.host_link_efficiency.*1\.5"):
        CostModelConfig(host_link_efficiency=1.5)
    with pytest.raises(ValueError, match=r"CostModelConfig\.step_overhead_s"):
        CostModelConfig(step_overhead_s=-1.0)
    shape = StepShape(decode_context_tokens=(1,))
    sync = CostModelConfig(async_scheduling=False)
    quiet = RooflineCostModel(
        LLAMA,
        A100,
        config=CostModelConfig(step_overhead_s=0.0, async_scheduling=False),
        block_size=16,
    )
    assert quiet.step_time_s(shape) < RooflineCostModel(
        LLAMA, A100, config=sync, block_size=16
    ).step_time_s(shape)


def test_step_shape_validation_and_properties() -> None:
    shape = StepShape(prefill_chunks=((10, 0), (5, 3)), decode_context_tokens=(4, 9))
    assert (shape.num_prefill_tokens, shape.num_decode_tokens) == (15, 2)
    assert shape.num_batched_tokens == 17
    with pytest.raises(ValueError, match="prefill_chunks"):
        StepShape(prefill_chunks=((0, 5),))
    with pytest.raises(ValueError, match="decode_context_tokens"):
        StepShape(decode_context_tokens=(3, 0))
    with pytest.raises(ValueError, match=r"StepShape\.num_copy_blocks.*-1"):
        StepShape(num_copy_blocks=-1)


def test_make_cost_model_without_profile_is_roofline() -> None:
    model: CostModel = make_cost_model(LLAMA, A100, tp=2, block_size=16)
    assert isinstance(model, RooflineCostModel)
    assert model.tp == 2
    with pytest.raises(ValueError, match="tp=3"):
        make_cost_model(LLAMA, A100, tp=3, block_size=16)


def test_cost_model_imports_neither_torch_nor_triton() -> None:
    code = (
        "import sys, sim.costmodel.base, core.model.presets, sim.specs.hardware\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, "
        "[m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


@settings(max_examples=100, deadline=None)
@given(
    model=st.sampled_from(preset_names()),
    tp=st.sampled_from([1, 2, 4, 8]),
    num_seqs=st.integers(1, 256),
    contexts=st.lists(st.integers(1, 200_000), min_size=1, max_size=20),
)
def test_vectorized_decode_durations_equal_the_stepper_bit_for_bit(
    model: str, tp: int, num_seqs: int, contexts: list[int]
) -> None:
    spec = get_model_preset(model)
    if spec.num_heads % tp:
        return  # not a valid sharding of this model
    cost = RooflineCostModel(spec, HARDWARE_PRESETS["H100-SXM"], tp=tp, block_size=16)
    step = cost.repeat_stepper((), num_seqs)
    totals = [c * num_seqs for c in contexts]
    blocks = [-(-c // 16) * num_seqs for c in contexts]
    got = cost.decode_repeat_durations(
        num_seqs, np.array(totals, dtype=np.int64), np.array(blocks, dtype=np.int64)
    )
    stepped = [step((), t, b) for t, b in zip(totals, blocks, strict=True)]
    assert got.tolist() == stepped
    # (the decode-only stepper writes the arithmetic out: it must still be the step's time)
    assert stepped == [
        cost.decode_step_time_s(num_seqs, t, b) for t, b in zip(totals, blocks, strict=True)
    ]


def test_the_block_size_is_given_when_the_cost_model_is_built() -> None:
    """No silent default: the roofline, make_cost_model and a calibrated profile all take the
    deployment's block size at construction, and the executor reads it from the cost model."""
    with pytest.raises(TypeError, match="block_size"):
        make_cost_model(LLAMA, A100)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="block_size"):
        RooflineCostModel(LLAMA, A100)  # type: ignore[call-arg]
    profile = Path(__file__).parent / "data" / "llama2_7b_a100_tp1.json"  # measured at 16
    with pytest.raises(ValueError, match="field 'block_size': profile measured at block size 16"):
        make_cost_model(LLAMA, A100, profile_path=profile, block_size=32)
    assert CostModelExecutor(RooflineCostModel(LLAMA, A100, block_size=32)).block_size == 32


@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_a_decode_reads_the_blocks_of_the_cost_models_size(block_size: int) -> None:
    """A 17-token context reads ceil(17 / block_size) blocks: the price follows the size the
    cost model was built with, through the executor's aggregate path too."""
    cost = RooflineCostModel(LLAMA, A100, block_size=block_size)
    kv_tokens = -(-17 // block_size) * block_size
    expected = cost.decode_attention_s(1, 17, kv_tokens)
    assert cost.step_breakdown(StepShape(decode_context_tokens=(17,)))["decode_attention"] == (
        expected
    )
    whole = cost.step_time_s(StepShape(decode_context_tokens=(17,)))
    assert cost.decode_step_time_s(1, 17, -(-17 // block_size)) == whole
