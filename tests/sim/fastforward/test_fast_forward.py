"""Skipping over identical decode steps must change nothing: every request's timeline and
counters, the summary, and the sums of every per-step column equal step-by-step simulation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import simpy

from core.config import CacheConfig, SchedulerConfig
from core.model.presets import load_model_spec
from core.policies import POLICIES
from core.scheduler import Scheduler
from core.settings import build
from records.schema import SUMMED_COLUMNS, StepRecorder
from sim import executor
from sim.costmodel.base import make_cost_model
from sim.fastforward import FastForward, RunPlan
from sim.recording import RecordingExecutor
from sim.run import RunConfig, simulate
from sim.simulator import Replica
from sim.specs.hardware_file import load_hardware
from traces.loaders import load_trace
from traces.schema import Trace, TraceRequest

DATA = Path(__file__).resolve().parents[3] / "traces" / "data"
SUM_COLUMNS = SUMMED_COLUMNS
CASES = [
    (policy, memory, preemption, trace, blocks, prefix)
    for policy in sorted(POLICIES)
    for memory in ("paged", "contiguous")
    for preemption in ("recompute", "swap")
    for trace, blocks, prefix in (
        ("bursty.csv", 300, False),
        ("parallel_sampling.csv", 400, False),
        ("shared_prefix.csv", 250, True),
    )
    if not (prefix and memory == "contiguous")
]


@pytest.mark.parametrize(("policy", "memory", "preemption", "trace", "blocks", "prefix"), CASES)
def test_fast_forward_equals_step_by_step(
    policy: str, memory: str, preemption: str, trace: str, blocks: int, prefix: bool
) -> None:
    config = build(
        RunConfig,
        policy=policy,
        memory_model=memory,  # type: ignore[arg-type]
        preemption_mode=preemption,  # type: ignore[arg-type]
        enable_prefix_caching=prefix,
        model="Llama-2-7B",
        hardware="A100-80GB",
        num_blocks=blocks,
        swap_space_gib=0.05,
    )
    loaded = load_trace(DATA / trace)
    fast = simulate(loaded, config)
    slow = simulate(loaded, replace(config, fast_forward=False))
    assert fast.requests_frame().equals(slow.requests_frame())
    assert fast.summary == slow.summary
    fast_steps, slow_steps = fast.steps.to_frame(), slow.steps.to_frame()
    for column in SUM_COLUMNS:
        assert fast_steps[column].sum() == slow_steps[column].sum(), column
    assert fast_steps["duration_s"].sum() == pytest.approx(slow_steps["duration_s"].sum())
    assert len(slow_steps) == slow_steps["num_steps"].sum()


def test_fast_forward_skips_most_steps_on_a_decode_heavy_trace() -> None:
    config = build(RunConfig, policy="continuous", model="Llama-2-7B", hardware="A100-80GB")
    result = simulate(load_trace(DATA / "example.csv"), config)
    rows = result.steps.to_frame()
    assert rows["num_steps"].sum() > 5 * len(rows)


@pytest.mark.parametrize(("prefix", "blocks"), [(False, 300), (True, 300), (False, 90)])
def test_chunk_stretches_are_exact(prefix: bool, blocks: int) -> None:
    """A small token budget makes prompts go in budget-sized chunks next to running
    decodes; those steps repeat too (a tight cache keeps requests waiting, so the last,
    shorter chunk repeats as well), and skipping them must change nothing."""
    config = build(
        RunConfig,
        policy="chunked",
        model="Llama-2-7B",
        hardware="A100-80GB",
        num_blocks=blocks,
        max_num_seqs=64,
        max_num_batched_tokens=96,
        enable_prefix_caching=prefix,
    )
    loaded = load_trace(DATA / ("shared_prefix.csv" if prefix else "example.csv"))
    fast = simulate(loaded, config)
    slow = simulate(loaded, replace(config, fast_forward=False))
    assert fast.requests_frame().equals(slow.requests_frame())
    assert fast.summary == slow.summary
    rows = fast.steps.to_frame()
    chunk_runs = rows[(rows["num_steps"] > 1) & (rows["num_prefill_tokens"] > 0)]
    assert len(chunk_runs) > 0, "no run of repeated prompt chunks was skipped"
    for column in SUM_COLUMNS:
        assert rows[column].sum() == slow.steps.to_frame()[column].sum(), column


def test_decode_runs_priced_in_one_vectorized_call_equal_pricing_each_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = build(RunConfig, policy="chunked", model="Llama-2-7B", hardware="A100-80GB")
    trace = load_trace(DATA / "example.csv")
    calls = []
    vectorized = executor._decode_ends
    monkeypatch.setattr(executor, "_decode_ends", lambda *a: calls.append(a) or vectorized(*a))
    monkeypatch.setattr(executor, "_VECTOR_MIN_STEPS", 1)  # every decode run, short ones too
    fast = simulate(trace, config)
    assert len(calls) > 10
    monkeypatch.setattr(executor, "_VECTOR_MIN_STEPS", 1 << 62)
    looped = simulate(trace, config)
    assert fast.summary == looped.summary
    assert fast.requests_frame().equals(looped.requests_frame())
    assert fast.steps.to_frame().equals(looped.steps.to_frame())


def test_steps_built_without_the_policy_are_used_and_change_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a run of repeats fast-forward builds the next decode (and prompt-chunk) step
    itself (``FastForward.plan_continuation``) instead of asking the policy: it must happen on a
    loaded chunked replica, and turning it off must change no result."""
    config = build(
        RunConfig,
        policy="chunked",
        model="Llama-2-7B",
        hardware="A100-80GB",
        num_blocks=90,
        max_num_seqs=64,
        max_num_batched_tokens=96,
    )
    trace = load_trace(DATA / "example.csv")
    built = []
    continuation = FastForward.plan_continuation

    def counted(self: FastForward) -> RunPlan | None:
        plan = continuation(self)
        if plan is not None:
            built.append(plan)
        return plan

    monkeypatch.setattr(FastForward, "plan_continuation", counted)
    continued = simulate(trace, config)
    assert len(built) > 20
    assert any(plan.shape.chunks for plan in built)  # (a prompt chunk among the decodes)
    # The roofline prices runs from their shapes: the batches need not list their requests.
    assert all(not plan.batch.requests and plan.growth for plan in built)
    monkeypatch.setattr(FastForward, "plan_continuation", lambda self: None)
    scheduled = simulate(trace, config)
    assert continued.summary == scheduled.summary
    assert continued.requests_frame().equals(scheduled.requests_frame())
    rows, other = continued.steps.to_frame(), scheduled.steps.to_frame()
    assert len(rows) < len(other)
    for column in SUM_COLUMNS:
        assert rows[column].sum() == other[column].sum(), column


def test_the_replica_lists_a_continuations_requests_only_behind_a_wrapper() -> None:
    """A replica whose executor is a ``CostModelExecutor`` pricing from shapes plans
    continuations without listing their requests; behind a wrapper (validation's
    ``RecordingExecutor``, which may read them) it lists them. (Read off the replica, not by
    patching: a compiled build's classes cannot be patched.)"""
    cost_model = make_cost_model(
        load_model_spec("Llama-2-7B"), load_hardware("A100-80GB"), 1, block_size=16
    )
    scheduler = Scheduler(
        CacheConfig(num_blocks=64, block_size=16, memory_model="paged", max_model_len=4096),
        SchedulerConfig(policy="chunked"),
    )

    def replica(costs: executor.StepExecutor) -> Replica:
        return Replica(simpy.Environment(), 0, "colocated", scheduler, costs, StepRecorder())

    costs = executor.CostModelExecutor(cost_model)
    assert costs.prices_from_shape
    lean = replica(costs).skipper
    listed = replica(RecordingExecutor(costs)).skipper
    assert lean is not None and not lean.itemized
    assert listed is not None and listed.itemized


@pytest.mark.parametrize("policy", ["chunked", "continuous"])
def test_continuations_with_and_without_their_requests_listed_agree(policy: str) -> None:
    """Both ways of planning a continuation (see the test above) give the same rows, requests
    and summary."""
    config = build(
        RunConfig,
        policy=policy,
        model="Llama-2-7B",
        hardware="A100-80GB",
        num_blocks=300,
        max_num_batched_tokens=256,
    )
    trace = load_trace(DATA / "bursty.csv")
    lean = simulate(trace, config)
    itemized = simulate(trace, config, wrap_executor=RecordingExecutor)
    assert lean.summary == itemized.summary
    assert lean.requests_frame().equals(itemized.requests_frame())
    assert lean.steps.to_frame().equals(itemized.steps.to_frame())


def test_a_forked_decode_beside_an_unforked_prompt_chunk_is_exact() -> None:
    """A repeated step holding a forked request's decodes and the budget-filling chunk of a
    request with n > 1 that has not forked yet (only its first sample holds blocks): the bulk
    growth must grow that one sequence, not every sample it will have."""
    trace = Trace(
        "forked-beside-chunk",
        (
            TraceRequest("forked", 0.0, 64, 300, num_samples=2),
            TraceRequest("prompt", 0.5, 3000, 8, num_samples=2),
        ),
    )
    config = build(
        RunConfig,
        policy="chunked",
        model="Llama-2-7B",
        hardware="A100-80GB",
        num_blocks=600,
        max_num_batched_tokens=256,
    )
    fast = simulate(trace, config)
    slow = simulate(trace, replace(config, fast_forward=False))
    assert fast.requests_frame().equals(slow.requests_frame())
    assert fast.summary == slow.summary
    assert len(fast.steps) < len(slow.steps)  # it did skip
