"""Hypothesis differential test: fast-forward against ``--no-fast-forward`` on drawn traces and
configurations must give equal request frames, summaries, per-row totals and allocator state
at every row boundary (``benchmarks/fast_forward_differential.py`` runs many more draws)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from core.settings import build
from sim.run import RunConfig
from tests.sim.fastforward.differential import assert_fast_forward_exact, configs, traces
from traces.loaders import load_trace
from traces.schema import Trace, TraceRequest

DATA = Path(__file__).resolve().parents[3] / "traces" / "data"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(trace=traces(), config=configs())
def test_fast_forward_equals_step_by_step_on_drawn_runs(trace: Trace, config: RunConfig) -> None:
    assert_fast_forward_exact(trace, config)


# -- shrunk failures, kept as explicit cases ---------------------------------------------------

SMALL = {"model": "Llama-2-7B", "hardware": "A100-80GB", "block_size": 1, "swap_space_gib": 0.0}


def _trace(*requests: tuple[int, int, int]) -> Trace:
    """Requests arriving together: (prompt tokens, output tokens, samples) each."""
    return Trace(
        name="regression",
        requests=tuple(
            TraceRequest(f"r{idx}", 0.0, prompt, output, samples)
            for idx, (prompt, output, samples) in enumerate(requests)
        ),
    )


def _chunked_disagg(num_blocks: int, max_num_seqs: int) -> RunConfig:
    """Disaggregated pools under chunked prefill, paged memory, a budget of 8 tokens."""
    return build(
        RunConfig,
        policy="disagg",
        pool_policy="chunked",
        memory_model="paged",
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8,
        batch_size=1,
        max_wait_s=0.0,
        **SMALL,  # type: ignore[arg-type]
    )


def test_finished_samples_blocks_are_cached_as_step_by_step() -> None:
    """The issue's defect, shrunk: a run's bulk path freed the finished samples of an
    ``n = 2`` request before committing the blocks they filled during the run."""
    config = build(
        RunConfig,
        policy="dynamic",
        memory_model="paged",
        num_blocks=40,
        max_num_seqs=1,
        max_num_batched_tokens=8,
        batch_size=1,
        max_wait_s=0.0,
        enable_prefix_caching=True,
        **SMALL,  # type: ignore[arg-type]
    )
    assert_fast_forward_exact(_trace((1, 4, 2), (1, 1, 1)), config)


@pytest.mark.slow
@pytest.mark.parametrize("num_blocks", [100, 200, 400])
def test_issue_reproduction_parallel_sampling_with_prefix_caching(num_blocks: int) -> None:
    """``python -m sim run traces/data/parallel_sampling.csv --policy chunked
    --prefix-caching --num-blocks N`` with and without ``--no-fast-forward`` (the sizes whose
    request frames differed)."""
    config = build(RunConfig, policy="chunked", enable_prefix_caching=True, num_blocks=num_blocks)
    assert assert_fast_forward_exact(load_trace(DATA / "parallel_sampling.csv"), config) > 0


def test_disaggregated_decode_side_admits_with_prefix_caching() -> None:
    """Found by the draws (both modes crashed): a transferred request was never looked up in
    the decode side's prefix cache, and admitting it raised KeyError."""
    config = build(RunConfig, policy="disagg", num_blocks=64, enable_prefix_caching=True, **SMALL)  # type: ignore[arg-type]
    assert_fast_forward_exact(_trace((3, 2, 1), (2, 3, 2)), config)


def test_disaggregated_static_pool_hands_held_kv_to_the_link() -> None:
    """Found by the draws (both modes crashed): a prefill pool that holds finished requests
    until the batch ends (dynamic batching) freed their KV before it was sent."""
    config = build(
        RunConfig,
        policy="disagg",
        pool_policy="dynamic",
        num_blocks=8,
        max_num_seqs=1,
        max_num_batched_tokens=8,
        batch_size=1,
        max_wait_s=0.0,
        **SMALL,  # type: ignore[arg-type]
    )
    assert_fast_forward_exact(_trace(*[(1, 1, 1)] * 5, (1, 2, 1)), config)


def test_skipped_run_ends_exactly_when_the_steps_would() -> None:
    """Found by the benchmark's draws: SimPy's clock reached a skipped run's end a unit in the
    last place off the summed step times, so a disaggregated prefill's transfer (and the
    run's duration) differed from stepping one step at a time."""
    config = _chunked_disagg(num_blocks=800, max_num_seqs=2)
    specs = [(0.0, 1)] * 4 + [(0.3, 469), (0.3, 4), (0.3, 1), (0.3, 1)]
    trace = Trace(
        name="regression",
        requests=tuple(
            TraceRequest(f"r{idx}", arrival_s, prompt, 1)
            for idx, (arrival_s, prompt) in enumerate(specs)
        ),
    )
    assert_fast_forward_exact(trace, config)


def test_a_decode_pool_left_empty_by_a_finished_request_schedules_again() -> None:
    """Found by the draws (both modes stuck): on a decode pool of one sequence slot, a request
    finishing in one step held that slot through the next schedule, which left the request
    transferred meanwhile out; nothing woke the replica again."""
    config = _chunked_disagg(num_blocks=8, max_num_seqs=1)
    assert_fast_forward_exact(_trace((1, 4, 1), (1, 1, 1), (1, 2, 1), (1, 1, 1)), config)


def test_skipped_run_ends_exactly_where_no_delay_reaches_it() -> None:
    """Found by the draws (seed 0, 2,000 draws): a chunked prompt's run of 17 steps ended at
    0.20559742527382704 s, and from SimPy's clock at its start (0.0306 s, which ends in half a
    unit of that time's last place) no delay lands there: rounding to even skips every other
    float. SimPy's clock ended a unit early, and so did the prompt's KV transfer and the
    decode pool's step after it (`sim.simulator.timeout_at`)."""
    config = build(
        RunConfig,
        policy="disagg",
        pool_policy="chunked",
        num_blocks=50,
        max_num_seqs=1,
        max_num_batched_tokens=24,
        **{**SMALL, "block_size": 16},  # type: ignore[arg-type]
    )
    specs = [(0.0, 481, 2)] + [(0.002, 1, 1)] * 7
    trace = Trace(
        name="regression",
        requests=tuple(
            TraceRequest(f"r{idx}", arrival_s, prompt, output)
            for idx, (arrival_s, prompt, output) in enumerate(specs)
        ),
    )
    assert_fast_forward_exact(trace, config)
