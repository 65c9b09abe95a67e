"""Disaggregation under every pool setting: pool policy x prefix caching x preemption x memory
model, each finishing or rejecting (with a reason) every request, and losing none."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from core.config import MEMORY_MODELS, PREEMPTION_MODES
from core.policies import POLICIES
from core.request import RequestStatus
from core.settings import build
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
MATRIX = list(itertools.product(sorted(POLICIES), (False, True), PREEMPTION_MODES, MEMORY_MODELS))


def _config(
    pool_policy: str, prefix_caching: bool, preemption: str, memory: str, **changes: object
) -> RunConfig:
    settings: dict[str, object] = {
        "policy": "disagg",
        "model": "Llama-2-7B",
        "hardware": "A100-80GB",
        "num_prefill": 1,
        "num_decode": 1,
        "pool_policy": pool_policy,
        "enable_prefix_caching": prefix_caching,
        "preemption_mode": preemption,
        "memory_model": memory,
        "swap_space_gib": 1.0,
        # Small enough that paged pools preempt and contiguous ones reject the longest.
        "num_blocks": 150,
        "max_model_len": 2048,
    }
    return build(RunConfig, **(settings | changes))  # type: ignore[arg-type]


def test_disagg_with_prefix_caching_runs_and_hits_the_shared_prefixes() -> None:
    trace = load_trace(DATA / "shared_prefix.csv")
    config = _config("continuous", True, "recompute", "paged", num_blocks=2000)
    result = simulate(trace, config)
    assert result.summary["completed"] == len(trace)
    assert result.summary["prefix_hit_rate"] > 0.1


@pytest.mark.parametrize("pool_policy", ["static", "dynamic"])
def test_disagg_runs_with_request_level_batching_in_the_pools(pool_policy: str) -> None:
    trace = load_trace(DATA / "example.csv")
    config = _config(
        pool_policy, False, "recompute", "contiguous", num_blocks=800, max_model_len=4096
    )
    result = simulate(trace, config)
    assert result.summary["completed"] == len(trace)
    assert result.summary["num_kv_transfers"] == sum(r.output_tokens > 1 for r in trace.requests)


@pytest.mark.parametrize("trace_name", ["shared_prefix.csv", "parallel_sampling.csv"])
@pytest.mark.parametrize(("pool_policy", "prefix_caching", "preemption", "memory"), MATRIX)
def test_disagg_matrix_finishes_or_rejects_every_request(
    pool_policy: str, prefix_caching: bool, preemption: str, memory: str, trace_name: str
) -> None:
    trace = load_trace(DATA / trace_name)
    if prefix_caching and memory == "contiguous":
        with pytest.raises(ValueError, match="prefix_caching"):
            simulate(trace, _config(pool_policy, prefix_caching, preemption, memory))
        return
    result = simulate(trace, _config(pool_policy, prefix_caching, preemption, memory))
    assert [r.request_id for r in result.requests] == [r.request_id for r in trace.requests]
    for request in result.requests:
        if request.status is RequestStatus.REJECTED:
            assert request.reject_reason and "pool" in request.reject_reason
        else:
            assert request.status is RequestStatus.FINISHED, request.request_id
            assert request.num_output_tokens == request.max_output_tokens
            assert request.first_token_s is not None and request.finish_s is not None
            assert request.arrival_s <= request.first_token_s <= request.finish_s
    summary = result.summary
    assert summary["completed"] + summary["rejected"] == len(trace)
    assert summary["completed"] > 0
    if memory == "paged":  # the matrix is meant to exercise preemption
        assert summary["num_preemptions"] > 0
        assert (summary["num_blocks_swapped_out"] > 0) == (preemption == "swap")
