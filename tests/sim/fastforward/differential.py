"""Fast-forward against step by step on one trace and configuration: the draws (hypothesis
strategies) and the comparison, shared by the differential test and its benchmark script."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import strategies as st

from core.kv_state import KVState
from core.policies import POLICIES
from core.scheduler import Scheduler
from core.settings import build
from records.schema import SUMMED_COLUMNS
from sim.fastforward import FastForward
from sim.run import RunConfig, RunResult, simulate
from traces.schema import Trace, TraceRequest

BLOCK_SIZES = (1, 16, 32)
MAX_PROMPT_TOKENS = 700  # past the smallest caches drawn (a few blocks)


@dataclass(frozen=True, slots=True)
class StateKey:
    """Which scheduler (in creation order) after how many executed steps."""

    scheduler_idx: int
    num_steps: int


@contextmanager
def recording_states() -> Iterator[dict[StateKey, KVState]]:
    """Record every scheduler's ``kv_state()`` at each row boundary: after each ``update``
    (one step) and each fast-forward ``apply`` (a run of steps), keyed by the steps executed
    so far (the first record for a count wins: the state right after that step)."""
    states: dict[StateKey, KVState] = {}
    schedulers: list[Scheduler] = []
    originals: dict[str, Any] = {
        "__init__": Scheduler.__init__,
        "update": Scheduler.update,
        "apply": FastForward.apply,
    }

    def init(self: Scheduler, *args: Any, **kwargs: Any) -> None:
        originals["__init__"](self, *args, **kwargs)
        schedulers.append(self)

    def record(scheduler: Scheduler) -> None:
        key = StateKey(schedulers.index(scheduler), len(scheduler.step_end_s))
        if key not in states:
            states[key] = scheduler.kv_state()

    def update(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        finished = originals["update"](self, *args, **kwargs)
        record(self)
        return finished

    def apply(self: FastForward, *args: Any, **kwargs: Any) -> Any:
        finished = originals["apply"](self, *args, **kwargs)
        record(self.scheduler)
        return finished

    Scheduler.__init__ = init  # type: ignore[method-assign]
    Scheduler.update = update  # type: ignore[method-assign]
    FastForward.apply = apply  # type: ignore[method-assign]
    try:
        yield states
    finally:
        Scheduler.__init__ = originals["__init__"]  # type: ignore[method-assign]
        Scheduler.update = originals["update"]  # type: ignore[method-assign]
        FastForward.apply = originals["apply"]  # type: ignore[method-assign]


def run_both(
    trace: Trace, config: RunConfig
) -> tuple[RunResult, dict[StateKey, KVState], RunResult, dict[StateKey, KVState]]:
    with recording_states() as fast_states:
        fast = simulate(trace, replace(config, fast_forward=True))
    with recording_states() as slow_states:
        slow = simulate(trace, replace(config, fast_forward=False))
    return fast, fast_states, slow, slow_states


def assert_fast_forward_exact(trace: Trace, config: RunConfig) -> int:
    """Run ``trace`` both ways and assert everything the issue lists is equal; returns the
    number of steps that fast-forward skipped (rows it saved)."""
    fast, fast_states, slow, slow_states = run_both(trace, config)
    pd.testing.assert_frame_equal(fast.requests_frame(), slow.requests_frame())
    assert fast.summary == slow.summary
    fast_rows, slow_rows = fast.steps.to_frame(), slow.steps.to_frame()
    assert (slow_rows["num_steps"] == 1).all()
    _assert_rows_stand_for_their_steps(fast_rows, slow_rows)
    for key, state in fast_states.items():
        assert key in slow_states, f"no step-by-step state after {key}"
        _assert_same_state(key, state, slow_states[key])
    return int(fast_rows["num_steps"].sum()) - len(fast_rows)


def _assert_rows_stand_for_their_steps(fast_rows: pd.DataFrame, slow_rows: pd.DataFrame) -> None:
    """Every fast-forwarded row has the totals of the step-by-step rows it stands for: the
    same start, the same end and the same sum of every summed column."""
    for (replica, pool), rows in fast_rows.groupby(["replica", "pool"], sort=False):
        steps = slow_rows[(slow_rows["replica"] == replica) & (slow_rows["pool"] == pool)]
        counts = rows["num_steps"].to_numpy()
        assert counts.sum() == len(steps), (replica, pool)
        firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        lasts = firsts + counts - 1
        where = f"replica {replica} {pool}"
        start_s = steps["start_s"].to_numpy()
        np.testing.assert_array_equal(rows["start_s"].to_numpy(), start_s[firsts], where)
        end_s = start_s + steps["duration_s"].to_numpy()
        fast_end_s = rows["start_s"].to_numpy() + rows["duration_s"].to_numpy()
        np.testing.assert_allclose(fast_end_s, end_s[lasts], rtol=1e-12, err_msg=where)
        for column in SUMMED_COLUMNS:
            totals = np.add.reduceat(steps[column].to_numpy(), firsts)
            np.testing.assert_array_equal(rows[column].to_numpy(), totals, f"{where}: {column}")


def _assert_same_state(key: StateKey, fast: KVState, slow: KVState) -> None:
    if fast == slow:
        return
    differing = [
        name for name in KVState.__dataclass_fields__ if getattr(fast, name) != getattr(slow, name)
    ]
    raise AssertionError(f"allocator state differs after {key}: {differing}")


# -- draws ---------------------------------------------------------------------------------


@st.composite
def traces(draw: Callable[[st.SearchStrategy[Any]], Any]) -> Trace:
    """Small traces: arrival bursts, prompts from 1 token to past the cache, 1 to 4 samples,
    shared prefixes named by hash ids or by token ids."""
    num_requests = draw(st.integers(1, 8))
    prefix_kind = draw(st.sampled_from(["none", "hash_ids", "token_ids"]))
    hash_block_tokens = draw(st.sampled_from([16, 32]))
    gaps = st.sampled_from([0.0, 0.0, 0.002, 0.02, 0.3, 2.0])
    requests = []
    now_s = 0.0
    for idx in range(num_requests):
        now_s += draw(gaps)
        prompt = draw(st.one_of(st.integers(1, 40), st.integers(1, MAX_PROMPT_TOKENS)))
        output = draw(st.one_of(st.integers(1, 12), st.integers(1, 300)))
        samples = draw(st.integers(1, 4))
        group = draw(st.integers(0, 2))  # requests of one group share a prefix
        priority = draw(st.integers(0, 2))  # (read under priority scheduling only)
        token_ids = hash_ids = None
        if prefix_kind == "token_ids":
            shared = draw(st.integers(0, prompt))
            token_ids = tuple(1000 * group + i for i in range(shared)) + tuple(
                (idx + 1) * 100_000 + i for i in range(prompt - shared)
            )
        elif prefix_kind == "hash_ids":
            num_ids = -(-prompt // hash_block_tokens)
            shared = draw(st.integers(0, num_ids))
            hash_ids = tuple(10 * group + i for i in range(shared)) + tuple(
                (idx + 1) * 1000 + i for i in range(num_ids - shared)
            )
        requests.append(
            TraceRequest(
                request_id=f"r{idx}",
                arrival_s=round(now_s, 6),
                prompt_tokens=prompt,
                output_tokens=output,
                num_samples=samples,
                prompt_token_ids=token_ids,
                prefix_hash_ids=hash_ids,
                hash_block_tokens=hash_block_tokens,
                priority=priority,
            )
        )
    return Trace(name="drawn", requests=tuple(requests))


@st.composite
def configs(draw: Callable[[st.SearchStrategy[Any]], Any]) -> RunConfig:
    """Every policy and disagg, both memory models, block sizes 1/16/32, caches from a few
    blocks to ample, prefix caching, recompute or swap (tiny swap space), small budgets,
    replicas behind each router, FCFS or priority scheduling."""
    policy = draw(st.sampled_from([*sorted(POLICIES), "disagg"]))
    pool_policy = draw(st.sampled_from(sorted(POLICIES)))
    memory = draw(st.sampled_from(["paged", "contiguous"]))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    tokens = draw(st.sampled_from([8, 40, 160, 800, 4000]))  # cache size in tokens
    prefix = memory == "paged" and draw(st.booleans())
    disagg = policy == "disagg"
    preemption = draw(st.sampled_from(["recompute", "swap"]))
    swap = preemption == "swap"
    # The token budget holds a token of each request a step may run (core.policies'
    # check_budgets, vLLM's rule), so max_num_seqs is drawn at or below it.
    budget = draw(st.sampled_from([8, 24, 96, 8192]))
    return build(
        RunConfig,
        policy=policy,
        pool_policy=pool_policy,
        model="Llama-2-7B",
        hardware="A100-80GB",
        memory_model=memory,  # type: ignore[arg-type]
        block_size=block_size,
        num_blocks=max(2, tokens // block_size),
        enable_prefix_caching=prefix,
        preemption_mode=preemption,
        # Swap needs room for at least one block (16 MiB at 32 tokens of Llama-2-7B).
        swap_space_gib=draw(st.sampled_from([0.02, 0.05] if swap else [0.0, 0.004, 0.03])),
        max_num_seqs=draw(st.sampled_from([n for n in (1, 2, 5, 256) if n <= budget])),
        max_num_batched_tokens=budget,
        batch_size=draw(st.integers(1, 4)),
        max_wait_s=draw(st.sampled_from([0.0, 0.05])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        num_replicas=1 if disagg else draw(st.integers(1, 3)),
        router=draw(st.sampled_from(["round_robin", "least_outstanding", "prefix_aware"])),
        num_prefill=draw(st.integers(1, 2)) if disagg else 1,
        num_decode=draw(st.integers(1, 2)) if disagg else 1,
    )
