"""Data-parallel attention with expert-parallel MoE, in parts: vLLM's balancer over the ranks,
each rank's own batch padded to the group's largest, the experts' share per GPU and the bytes
each MoE layer gathers, and the ranks stepping together."""

from __future__ import annotations

import dataclasses

import pytest

from core.config import CacheConfig, SchedulerConfig
from core.model.presets import get_model_preset
from core.request import Request
from core.scheduler import Scheduler
from sim.costmodel.expert_parallel import (
    ExpertParallelCost,
    check_data_parallel,
    ring_gather_s,
    weight_bytes_per_gpu,
)
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.step_shape import StepShape
from sim.data_parallel import DataParallelRouter
from sim.run import RunConfig, simulate
from sim.specs.hardware import HARDWARE_PRESETS
from traces.schema import Trace, TraceRequest

MOE = get_model_preset("Qwen3-30B-A3B")
H100 = HARDWARE_PRESETS["H100-SXM"]


def _scheduler() -> Scheduler:
    cache = CacheConfig(num_blocks=1000, block_size=16, memory_model="paged", max_model_len=4096)
    return Scheduler(cache, SchedulerConfig(policy="chunked", max_num_batched_tokens=64))


def _request(i: int, prompt: int = 40, output: int = 4) -> Request:
    return Request(f"r{i}", arrival_s=0.0, num_prompt_tokens=prompt, max_output_tokens=output)


def test_router_scores_waiting_four_times_running() -> None:
    ranks = [_scheduler(), _scheduler()]
    router = DataParallelRouter(ranks)
    # Rank 0: one waiting (score 4); rank 1: three running (score 3) -> rank 1.
    ranks[0].add_request(_request(0), 0.0)
    for i in range(3):
        ranks[1].add_request(_request(10 + i, prompt=10), 0.0)
    ranks[1].schedule(0.0)
    assert (len(ranks[1].running), len(ranks[1].waiting)) == (3, 0)
    assert router.pick(0.0) == 1
    # Until the next publication the front end counts what it sent: rank 1 is now 4 + 3.
    assert router.pick(0.05) == 0
    assert router.pick(0.09) == 1  # 8 (rank 0) against 7


def test_router_ties_go_to_the_first_rank_and_counts_refresh_every_100_ms() -> None:
    ranks = [_scheduler(), _scheduler(), _scheduler()]
    router = DataParallelRouter(ranks)
    assert [router.pick(0.0) for _ in range(3)] == [0, 1, 2]
    # Nothing was really added: 100 ms later the published counts are all 0 again.
    assert router.pick(0.1) == 0


def test_experts_take_a_share_of_all_ranks_tokens() -> None:
    roofline = RooflineCostModel(MOE, H100, 1, block_size=16)
    cost = ExpertParallelCost(roofline, dp=2)
    tokens = 512
    # Each GPU holds 64 of 128 experts and takes half the gathered pairs: the same FLOPs as
    # the single-rank roofline's experts over one rank's tokens.
    k = MOE.num_experts_per_token
    pairs = 2 * tokens * k / 2
    flops = pairs * 2 * MOE.expert_params
    peak = H100.peak_flops(MOE.dtype_bytes) * H100.gemm_flops_efficiency
    assert cost.experts_s(2 * tokens) >= flops / peak
    touched = 64 * (1 - (1 - k / 128) ** (2 * tokens))
    weights = touched * MOE.expert_params * MOE.dtype_bytes
    bandwidth = H100.hbm_bandwidth_bytes_per_s * H100.memory_bandwidth_efficiency
    assert cost.experts_s(2 * tokens) >= weights / bandwidth
    assert cost.experts_s(0) == 0.0


def test_each_moe_layer_gathers_every_ranks_padded_tokens() -> None:
    cost = ExpertParallelCost(RooflineCostModel(MOE, H100, 1, block_size=16), dp=4)
    assert cost.gathered_bytes(100) == 4 * 100 * MOE.hidden_size * 2
    one = ring_gather_s(H100, cost.gathered_bytes(100), 4)
    # A ring all-gather over 4 GPUs of one NVLink domain: the call, 3 hops, 3/4 of the bytes.
    expected = (
        H100.allreduce_call_latency_s
        + 3 * H100.interconnect_latency_s
        + 0.75
        * cost.gathered_bytes(100)
        / (H100.interconnect_bandwidth_bytes_per_s * H100.interconnect_bus_efficiency)
    )
    assert one == pytest.approx(expected)
    assert cost.dispatch_combine_s(100) == pytest.approx(MOE.num_layers * 2 * one)
    assert ring_gather_s(H100, 1e6, 1) == 0.0


def test_a_group_step_pads_every_rank_and_lasts_the_slowest() -> None:
    roofline = RooflineCostModel(MOE, H100, 1, block_size=16)
    cost = ExpertParallelCost(roofline, dp=2)
    busy = StepShape(prefill_chunks=((300, 0),), decode_context_tokens=(500,) * 20)
    idle = StepShape()
    step = cost.group_step([busy, idle])
    assert step.tokens_per_rank == 320
    assert step.gathered_bytes == 2 * 320 * MOE.hidden_size * 2
    busy_s, idle_s = (sum(v for k, v in t.items() if k != "experts") for t in step.per_rank)
    assert step.duration_s == pytest.approx(max(busy_s, idle_s)) and busy_s > idle_s
    # The idle rank runs the dense layers over 320 padding tokens but attends to nothing.
    assert step.per_rank[1]["decode_attention"] == 0.0
    assert step.per_rank[1]["linear"] == pytest.approx(step.per_rank[0]["linear"])


def test_weights_per_gpu_spread_the_experts_over_every_rank() -> None:
    experts = MOE.num_layers * MOE.num_experts * MOE.expert_params * MOE.dtype_bytes
    assert weight_bytes_per_gpu(MOE, 1, 1) == MOE.weight_bytes
    assert weight_bytes_per_gpu(MOE, 1, 2) == MOE.weight_bytes - experts // 2
    with pytest.raises(ValueError, match=r"128 experts do not split over data_parallel_size 3"):
        check_data_parallel(MOE, 1, 3)


def _trace(num: int) -> Trace:
    return Trace(
        "t",
        tuple(
            TraceRequest(f"q{i}", arrival_s=0.01 * i, prompt_tokens=50 + 7 * i, output_tokens=8)
            for i in range(num)
        ),
    )


def test_ranks_step_together_each_on_its_own_requests() -> None:
    config = RunConfig(
        model="Qwen3-30B-A3B",
        hardware="H100-SXM",
        data_parallel_size=2,
        enable_expert_parallel=True,
    )
    result = simulate(_trace(12), config)
    assert result.summary["completed"] == 12
    steps = result.steps.to_frame()
    assert set(steps["replica"]) == {0, 1}
    # Lockstep: where both ranks ran a step, it started and lasted the same.
    by_start = steps.groupby("start_s")["duration_s"].nunique()
    assert (by_start == 1).all()
    shared = steps.groupby("start_s")["replica"].nunique()
    assert (shared == 2).sum() > 0
    # Each rank's KV: the experts spread over both GPUs leave more room than one GPU's share.
    single = simulate(_trace(12), dataclasses.replace(config, data_parallel_size=1))
    assert result.num_blocks > single.num_blocks


def test_a_dense_model_runs_independent_ranks_behind_the_balancer() -> None:
    config = RunConfig(model="Llama-3.1-8B", hardware="H100-SXM", data_parallel_size=2)
    result = simulate(_trace(12), config)
    assert result.summary["completed"] == 12
    steps = result.steps.to_frame()
    assert set(steps["replica"]) == {0, 1}


def test_data_parallel_is_a_deployment_of_its_own() -> None:
    with pytest.raises(ValueError, match=r"data_parallel_size > 1 is one deployment of its own"):
        RunConfig(data_parallel_size=2, num_replicas=2)
    with pytest.raises(ValueError, match=r"data_parallel_size must be >= 1"):
        RunConfig(data_parallel_size=0)
