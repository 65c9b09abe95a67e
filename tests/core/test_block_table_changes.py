"""``ScheduledBatch.block_tables``: an executor that keeps every sequence's block table between
steps, and changes it only where a batch names a change, always holds the scheduler's live
tables for the sequences it runs, under every policy, with forks that lose samples early,
copy-on-write, preemption by swap and by recompute, and prefix caching."""

from __future__ import annotations

import random

import pytest

from core.batch import ScheduledBatch
from core.config import CacheConfig, SchedulerConfig
from core.policies import POLICIES
from core.scheduler import Scheduler
from tests.core.driver import make_workload, replay

CASES = {
    "swap": dict(preemption="swap", num_cpu_blocks=400, prefix=False),
    "recompute": dict(preemption="recompute", num_cpu_blocks=0, prefix=False),
    "prefix-caching": dict(preemption="recompute", num_cpu_blocks=0, prefix=True),
}


class MirroredTables:
    """What a runner keeps: a copy of each table, replaced only when a batch names it."""

    def __init__(self) -> None:
        self.tables: dict[int, tuple[int, ...]] = {}
        self.num_checked = 0
        self.num_named = 0

    def on_step(self, scheduler: Scheduler, batch: ScheduledBatch) -> None:
        assert batch.block_tables is not None
        self.tables.update(batch.block_tables)
        self.num_named += len(batch.block_tables)
        for scheduled in batch.requests:
            live = scheduler.block_tables(scheduled.request)
            for seq_id, table in zip(scheduled.seq_ids, live, strict=True):
                assert self.tables.get(seq_id) == tuple(table), (
                    f"step {batch.step_idx}: sequence {seq_id} of {scheduled.request_id}"
                )
                self.num_checked += 1


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_mirror_updated_from_batches_holds_the_live_tables(policy: str, case: str) -> None:
    opts = CASES[case]
    # Under static batching (a stopped sample stays in the batch) early stops break the core
    # itself, recording or not: with prefix caching a block that is not full is committed
    # ("not full and cannot be cached"), with swap the replay gets stuck with requests
    # swapped out. Found writing this test and reported, not fixed here: samples stop early
    # only under the other policies.
    stop_rate = 0.0 if policy in ("static", "dynamic") else 0.15
    requests = make_workload(
        seed=7,
        num_requests=60,
        rate_per_s=200.0,
        prompt_tokens=(1, 60),
        output_tokens=(1, 24),
        max_n=3,
        num_prefixes=3 if opts["prefix"] else 0,
        prefix_tokens=24,
    )
    cache = CacheConfig(
        num_blocks=40,
        block_size=4,
        memory_model="paged",
        num_cpu_blocks=int(opts["num_cpu_blocks"]),  # type: ignore[call-overload]
        enable_prefix_caching=bool(opts["prefix"]),
        max_model_len=128,
    )
    config = SchedulerConfig(
        policy=policy,
        max_num_batched_tokens=48,
        preemption_mode=opts["preemption"],  # type: ignore[arg-type]
        batch_size=4,
        max_wait_s=0.0,
    )
    rng = random.Random(3)

    def stopped(batch: ScheduledBatch) -> frozenset[int]:
        # Samples stop early now and then, so a forked request can lose its first sample and
        # decode on with a child alone (whose table was never scheduled on the slow path).
        # (live_seq_ids: at the fork step, the samples that are about to exist stop too)
        return frozenset(
            seq_id
            for scheduled in batch.requests
            if scheduled.request.n > 1
            for seq_id in scheduled.request.live_seq_ids
            if rng.random() < stop_rate
        )

    mirror = MirroredTables()
    result = replay(
        requests, cache, config, stopped=stopped, on_step=mirror.on_step, record_block_tables=True
    )
    assert result.finished
    assert mirror.num_checked > 200 and mirror.num_named < mirror.num_checked
    preempted = sum(r.num_preemptions for r in requests)
    if policy in ("continuous", "chunked"):
        assert preempted > 0, "the small cache forced no preemption"


def test_a_batch_names_nothing_unless_the_scheduler_records() -> None:
    requests = make_workload(seed=1, num_requests=5)
    cache = CacheConfig(num_blocks=64, block_size=4, memory_model="paged", max_model_len=512)
    batches: list[ScheduledBatch] = []
    replay(
        requests, cache, SchedulerConfig(policy="chunked"), on_step=lambda s, b: batches.append(b)
    )
    assert batches and all(b.block_tables is None for b in batches)


def test_recording_needs_paged_memory() -> None:
    cache = CacheConfig(num_blocks=64, memory_model="contiguous", max_model_len=512)
    with pytest.raises(ValueError, match="record_block_tables needs paged memory"):
        Scheduler(cache, SchedulerConfig(), record_block_tables=True)
