"""Scheduler set-up for the targeted scenario tests: a scheduler built from a few knobs, one step
at a time by hand, and the check that a scheduler holds nothing."""

from __future__ import annotations

from core.batch import ScheduledBatch, StepResult
from core.config import CacheConfig, SchedulerConfig
from core.contiguous_allocator import ContiguousKVManager
from core.kv_manager import PagedKVManager
from core.policies import POLICIES
from core.policies.static import StaticBatching
from core.request import Request
from core.scheduler import Scheduler

STATIC_POLICIES = [p for p, cls in POLICIES.items() if issubclass(cls, StaticBatching)]


def make_scheduler(
    policy: str = "continuous",
    *,
    memory_model: str = "paged",
    num_blocks: int = 64,
    block_size: int = 4,
    num_cpu_blocks: int = 0,
    prefix_caching: bool = False,
    preemption: str = "recompute",
    max_model_len: int = 256,
    budget: int = 256,
    batch_size: int = 1,
    max_wait_s: float = 0.0,
    reservation: str = "oracle",
    parallel_sampling: str = "fork",
    scheduling_policy: str = "fcfs",
    max_num_seqs: int = 256,
) -> Scheduler:
    """A scheduler for the targeted scenarios; n > 1 forks by default here (most scenarios
    are about copy-on-write sharing; ``test_parallel_sampling`` covers the fan-out)."""
    cache = CacheConfig(
        num_blocks=num_blocks,
        block_size=block_size,
        memory_model=memory_model,  # type: ignore[arg-type]
        reservation=reservation,  # type: ignore[arg-type]
        num_cpu_blocks=num_cpu_blocks,
        enable_prefix_caching=prefix_caching,
        watermark=0.0,
        max_model_len=max_model_len,
    )
    config = SchedulerConfig(
        policy=policy,
        max_num_batched_tokens=budget,
        preemption_mode=preemption,  # type: ignore[arg-type]
        batch_size=batch_size,
        max_wait_s=max_wait_s,
        parallel_sampling=parallel_sampling,  # type: ignore[arg-type]
        scheduling_policy=scheduling_policy,  # type: ignore[arg-type]
        max_num_seqs=max_num_seqs,
    )
    return Scheduler(cache, config)


def step(
    scheduler: Scheduler, now_s: float, stopped: frozenset[int] = frozenset()
) -> tuple[ScheduledBatch, list[Request], float]:
    """One schedule → execute → update at ``now_s``; a non-empty step takes 10 ms."""
    batch = scheduler.schedule(now_s)
    duration_s = 0.0 if batch.is_empty else 0.01
    end_s = now_s + duration_s
    result = StepResult(duration_s, stopped_seq_ids=stopped)
    return batch, scheduler.update(batch, result, end_s), end_s


def paged(scheduler: Scheduler) -> PagedKVManager:
    assert isinstance(scheduler.kv, PagedKVManager)
    return scheduler.kv


def assert_all_free(scheduler: Scheduler) -> None:
    assert not (scheduler.waiting or scheduler.running or scheduler.swapped or scheduler.held)
    assert not scheduler.has_unfinished()
    if isinstance(scheduler.kv, PagedKVManager):
        alloc = scheduler.kv.allocator
        assert alloc.num_free_blocks == alloc.num_blocks
        assert alloc.num_free_cpu_blocks == alloc.num_cpu_blocks
        assert alloc.num_used_blocks == 0 and alloc.num_filled_slots == 0
    else:
        assert isinstance(scheduler.kv, ContiguousKVManager)
        alloc_c = scheduler.kv.allocator
        assert alloc_c.num_reserved_slots == 0 and alloc_c.holes() == [(0, alloc_c.num_slots)]
        assert scheduler.kv.num_token_slots == 0
