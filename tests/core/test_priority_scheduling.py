"""Priority scheduling (``scheduling_policy="priority"``, vLLM's ``--scheduling-policy
priority``): the queues in priority order, lower first, then arrival, then request id;
the running request of the lowest priority (latest arrival among equals) preempted, even one
the step has already scheduled, whose tokens then go back to the budget; FCFS unchanged."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import CacheConfig, SchedulerConfig
from core.request import Request, RequestStatus
from core.scheduler import Scheduler
from core.step import priority_order
from tests.core.driver import replay
from tests.core.scheduler_setup import assert_all_free, make_scheduler, step


def _ids(batch: object) -> list[str]:
    return [r.request_id for r in batch.requests]  # type: ignore[attr-defined]


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    s = make_scheduler(scheduling_policy="priority", max_num_seqs=1, budget=64)
    for rid, arrival, priority in (("a", 0.0, 2), ("b", 0.1, 0), ("c", 0.2, 1), ("d", 0.3, 0)):
        assert s.add_request(Request(rid, arrival, 8, 1, priority=priority), 0.3)
    assert [r.request_id for r in s.waiting] == ["b", "d", "c", "a"]
    admitted = []
    now_s = 0.3
    while s.has_unfinished():
        batch, _, now_s = step(s, now_s)
        admitted += [r.request_id for r in batch.requests if r.is_prefill]
    assert admitted == ["b", "d", "c", "a"]
    assert_all_free(s)


def test_fcfs_ignores_priorities() -> None:
    s = make_scheduler(max_num_seqs=1, budget=64)
    for rid, arrival, priority in (("a", 0.0, 2), ("b", 0.1, 0), ("c", 0.2, 1)):
        assert s.add_request(Request(rid, arrival, 8, 1, priority=priority), 0.2)
    assert [r.request_id for r in s.waiting] == ["a", "b", "c"]


def test_equal_priority_and_arrival_go_by_request_id_as_in_vllm() -> None:
    s = make_scheduler(scheduling_policy="priority")
    for rid in ("r2", "r10", "r1"):
        assert s.add_request(Request(rid, 0.0, 8, 1, priority=1), 0.0)
    # vLLM's Request.__lt__ compares the ids as strings.
    assert [r.request_id for r in s.waiting] == ["r1", "r10", "r2"]


def _low_first_then_high(scheduling_policy: str) -> tuple[Scheduler, Request, Request, float]:
    """``low`` (priority 2) runs alone, then ``high`` (priority 0) joins and fills the cache:
    block size 4 and 2 usable blocks; at the next step ``high`` needs a second block."""
    s = make_scheduler(num_blocks=3, budget=64, scheduling_policy=scheduling_policy)
    low = Request("low", 0.0, 2, 6, priority=2)
    assert s.add_request(low, 0.0)
    _, _, now_s = step(s, 0.0)  # low's prompt: 2 tokens of its one block
    high = Request("high", now_s, 4, 4, priority=0)
    assert s.add_request(high, now_s)
    batch, _, now_s = step(s, now_s)  # low decodes in place; high's prompt takes the last block
    assert _ids(batch) == ["low", "high"] and not batch.preempted_ids
    return s, low, high, now_s


def test_priority_preempts_the_lowest_priority_even_if_already_in_the_step() -> None:
    s, low, high, now_s = _low_first_then_high("priority")
    assert [r.request_id for r in s.running] == ["low", "high"]  # the order they joined
    batch = s.schedule(now_s)
    # low was scheduled first (running order); high then needed a block: low, the lowest
    # priority, leaves the step it was in, and its token goes back to the budget.
    assert batch.preempted_ids == ["low"]
    assert _ids(batch) == ["high"]
    assert batch.num_batched_tokens == 1
    assert low.status is RequestStatus.WAITING and low.num_computed_tokens == 0
    assert high.num_computed_tokens == 4  # (advanced when the step ends)


def test_fcfs_preempts_the_latest_arrival_not_yet_in_the_step() -> None:
    s, _, high, now_s = _low_first_then_high("fcfs")
    batch = s.schedule(now_s)
    # high arrived last and low is already in the step: high preempts itself.
    assert batch.preempted_ids == ["high"]
    assert _ids(batch) == ["low"]
    assert high.status is RequestStatus.WAITING


def test_unscheduled_victim_leaves_no_trace_in_the_batch() -> None:
    """With the block tables recorded (the engine's scheduler) the victim's table is not
    sent, and the whole run still ends with every block free."""
    cache = CacheConfig(
        num_blocks=3, block_size=4, watermark=0.0, max_model_len=64, memory_model="paged"
    )
    config = SchedulerConfig(policy="continuous", scheduling_policy="priority")
    s = Scheduler(cache, config, record_block_tables=True)
    low = Request("low", 0.0, 2, 6, priority=2)
    assert s.add_request(low, 0.0)
    _, _, now_s = step(s, 0.0)
    high = Request("high", now_s, 4, 4, priority=0)
    assert s.add_request(high, now_s)
    _, _, now_s = step(s, now_s)
    batch, _, now_s = step(s, now_s)
    assert batch.preempted_ids == ["low"]
    assert batch.block_tables is not None
    assert set(batch.block_tables) <= set(high.seq_ids)
    while s.has_unfinished():
        _, _, now_s = step(s, now_s)
    assert low.status is RequestStatus.FINISHED and high.status is RequestStatus.FINISHED
    assert_all_free(s)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["continuous", "chunked", "static", "dynamic"])
def test_every_request_finishes_and_memory_comes_back(policy: str, preemption: str) -> None:
    s = make_scheduler(
        policy,
        num_blocks=12,
        num_cpu_blocks=16 if preemption == "swap" else 0,
        preemption=preemption,
        budget=32,
        batch_size=3,
        max_model_len=40,
        scheduling_policy="priority",
    )
    requests = [
        Request(f"r{i}", 0.01 * i, 3 + 5 * i % 17, 4 + 3 * i % 11, priority=i % 3)
        for i in range(12)
    ]
    replay(requests, s.cache_config, s.config)
    assert all(r.status is RequestStatus.FINISHED for r in requests)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-3, 3), st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from(["a", "b", "c"])
        ),
        min_size=1,
        max_size=12,
    )
)
def test_the_waiting_queue_stays_sorted_by_priority_order(
    keys: list[tuple[int, float, str]],
) -> None:
    s = make_scheduler(scheduling_policy="priority")
    for idx, (priority, arrival, name) in enumerate(keys):
        assert s.add_request(Request(f"{name}{idx}", arrival, 4, 1, priority=priority), 1.0)
    order = [priority_order(r) for r in s.waiting]
    assert order == sorted(order)
