"""Targeted scheduler scenarios: rejection, abort, preemption (recompute and swap), static and
dynamic batching. Shared blocks (parallel sampling, prefix caching) are in
test_scheduler_sharing.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.batch import StepResult
from core.config import CacheConfig, SchedulerConfig
from core.kv_manager import PagedKVManager
from core.policies import POLICIES
from core.request import Request, RequestStatus
from core.scheduler import Scheduler
from tests.core.driver import replay
from tests.core.scheduler_setup import (
    STATIC_POLICIES,
    assert_all_free,
    make_scheduler,
    paged,
    step,
)

# -- rejection -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_request_too_large_for_paged_cache_is_rejected(policy: str) -> None:
    s = make_scheduler(policy, num_blocks=5, block_size=16)
    request = Request("big", 0.5, 100, 10)  # ceil(110 / 16) = 7 blocks > 4
    assert not s.add_request(request, 0.5)
    assert request.status is RequestStatus.REJECTED and request.finish_s == 0.5
    assert request.reject_reason is not None
    assert "7" in request.reject_reason and "4" in request.reject_reason
    assert_all_free(s)
    fits = Request("fits", 0.5, 50, 10)  # 4 blocks: exactly the cache
    assert s.add_request(fits, 0.5)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_request_too_large_for_contiguous_cache_is_rejected(policy: str) -> None:
    s = make_scheduler(policy, memory_model="contiguous", num_blocks=4, block_size=16)
    request = Request("big", 0.0, 60, 10, n=2)  # 2 samples x 70 slots > 64
    assert not s.add_request(request, 0.0)
    reason = request.reject_reason
    assert reason is not None and "140" in reason and "64" in reason
    assert_all_free(s)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_request_longer_than_max_model_len_is_rejected(policy: str) -> None:
    s = make_scheduler(policy, max_model_len=128)
    request = Request("long", 0.0, 100, 50)
    assert not s.add_request(request, 0.0)
    reason = request.reject_reason
    assert reason is not None and all(n in reason for n in ("100", "50", "128"))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_prompt_longer_than_token_budget(policy: str) -> None:
    """Either rejected with a reason naming both numbers, or served within the budget."""
    requests = [Request("long", 0.0, 100, 3)]
    result = replay(requests, make_scheduler(policy).cache_config, _budget_config(policy, 32))
    request = requests[0]
    budget = POLICIES[policy](_budget_config(policy, 32)).token_budget()
    if request.status is RequestStatus.REJECTED:
        assert request.reject_reason is not None
        assert "100" in request.reject_reason and "32" in request.reject_reason
        return
    assert request.status is RequestStatus.FINISHED
    if budget is not None:
        assert all(b.num_batched_tokens <= budget for b in result.batches)
    prompt_steps = [e.num_positions for e in result.entries_of("long") if e.is_prefill]
    assert sum(prompt_steps) == 100


def _budget_config(policy: str, budget: int) -> SchedulerConfig:
    return SchedulerConfig(policy=policy, max_num_batched_tokens=budget, batch_size=1)


def test_continuous_rejects_and_chunked_chunks_a_prompt_over_budget() -> None:
    requests = [Request("long", 0.0, 100, 3)]
    cache = make_scheduler().cache_config
    replay(requests, cache, _budget_config("continuous", 32))
    assert requests[0].status is RequestStatus.REJECTED
    requests = [Request("long", 0.0, 100, 3)]
    result = replay(requests, cache, _budget_config("chunked", 32))
    assert requests[0].status is RequestStatus.FINISHED
    shares = [(e.num_computed_tokens, e.num_positions) for e in result.entries_of("long")]
    assert shares == [(0, 32), (32, 32), (64, 32), (96, 4), (100, 1), (101, 1)]


@pytest.mark.parametrize(("max_num_seqs", "budget"), [(2, 256), (256, 2)], ids=["seqs", "tokens"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_request_wider_than_step_budgets_is_rejected_or_served(
    policy: str, max_num_seqs: int, budget: int
) -> None:
    request = Request("wide", 0.0, 2, 4, n=3)
    config = SchedulerConfig(
        policy=policy, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, batch_size=1
    )
    replay(
        [request],
        CacheConfig(num_blocks=64, block_size=4, memory_model="paged", max_model_len=4096),
        config,
        max_steps=500,
    )
    assert request.status is RequestStatus.FINISHED or request.reject_reason is not None


# -- abort -----------------------------------------------------------------------------------


def three_requests(s: Scheduler) -> list[Request]:
    """A, B, C: 8-token prompts (two 4-token blocks each) that fill a 6-block cache."""
    requests = [Request(name, 0.0, 8, 4) for name in "ABC"]
    for request in requests:
        assert s.add_request(request, 0.0)
    return requests


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("state", ["waiting", "running", "swapped"])
def test_abort_frees_everything(state: str, prefix_caching: bool) -> None:
    s = make_scheduler(
        num_blocks=7, num_cpu_blocks=8, preemption="swap", prefix_caching=prefix_caching
    )
    a, b, c = three_requests(s)
    d = Request("D", 0.0, 8, 4)
    assert s.add_request(d, 0.0)
    step(s, 0.0)  # A, B, C admitted (6 blocks), D waits
    batch, _, _ = step(s, 0.1)  # A and B each need a block: C is swapped out
    assert batch.preempted_ids == ["C"] and c.status is RequestStatus.SWAPPED
    assert d.status is RequestStatus.WAITING and a.status is RequestStatus.RUNNING
    target = {"waiting": d, "running": a, "swapped": c}[state]
    assert s.abort(target.request_id, 0.2) is target
    assert target.status is RequestStatus.ABORTED and target.finish_s == 0.2
    assert target not in (*s.waiting, *s.running, *s.swapped, *s.held)
    assert s.abort(target.request_id, 0.3) is None
    for other in (a, b, c, d):
        if other is not target:
            s.abort(other.request_id, 0.3)
    assert_all_free(s)


@pytest.mark.parametrize("memory_model", ["paged", "contiguous"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_abort_while_step_runs(policy: str, memory_model: str) -> None:
    s = make_scheduler(policy, memory_model=memory_model)
    request = Request("A", 0.0, 8, 4)
    assert s.add_request(request, 0.0)
    batch = s.schedule(0.0)
    assert batch.requests and request.status is RequestStatus.RUNNING
    s.abort("A", 0.005)
    assert s.update(batch, StepResult(0.01), 0.01) == []
    assert request.status is RequestStatus.ABORTED and request.num_output_tokens == 0
    assert_all_free(s)


# -- preemption -------------------------------------------------------------------------------


def test_recompute_preempts_latest_arrival_and_counts_tokens() -> None:
    s = make_scheduler(num_blocks=7)
    # Added out of arrival order: the victim must be the latest *arrival*, not the latest add.
    a = Request("A", 0.0, 8, 4)
    late = Request("late", 0.2, 8, 4)
    mid = Request("mid", 0.1, 8, 4)
    for request in (a, late, mid):
        assert s.add_request(request, 0.2)
    batch, _, now_s = step(s, 0.2)
    assert [r.request_id for r in batch.requests] == ["A", "mid", "late"]
    batch, _, now_s = step(s, now_s)
    assert batch.preempted_ids == ["late"]
    assert not batch.swap_out
    assert [r.request_id for r in batch.requests] == ["A", "mid"]
    assert late.status is RequestStatus.WAITING and late.num_preemptions == 1
    assert late.num_recomputed_tokens == 8 and late.num_computed_tokens == 0
    while s.has_unfinished():
        batch, _, now_s = step(s, now_s)
        for scheduled in batch.requests:
            if scheduled.request is late and scheduled.is_prefill:
                # Prompt plus the token sampled before the preemption are recomputed at once.
                assert (scheduled.num_computed_tokens, scheduled.num_positions) == (0, 9)
    assert late.status is RequestStatus.FINISHED and late.tokens.num_emissions == 4
    assert late.num_recomputed_tokens >= 8
    assert_all_free(s)


def test_swap_preemption_swaps_out_then_in_the_same_blocks() -> None:
    s = make_scheduler(num_blocks=7, num_cpu_blocks=8, preemption="swap")
    _, _, c = three_requests(s)
    _, _, now_s = step(s, 0.0)
    c_table = list(paged(s).allocator.block_table(c.live_seq_ids[0]))
    batch, _, now_s = step(s, now_s)
    assert batch.preempted_ids == ["C"] and c.status is RequestStatus.SWAPPED
    assert sorted(gpu for gpu, _ in batch.swap_out) == sorted(c_table)
    cpu_blocks = sorted(cpu for _, cpu in batch.swap_out)
    swap_in: list[tuple[int, int]] = []
    while s.has_unfinished():
        batch, _, now_s = step(s, now_s)
        assert not batch.swap_out or not swap_in, "swapped out again after coming back"
        swap_in.extend(batch.swap_in)
    assert sorted(cpu for cpu, _ in swap_in) == cpu_blocks
    assert c.num_blocks_swapped_out == c.num_blocks_swapped_in == len(c_table) == 2
    assert c.num_recomputed_tokens == 0 and c.tokens.num_emissions == 4
    assert c.status is RequestStatus.FINISHED
    assert_all_free(s)


# -- static and dynamic batching --------------------------------------------------------------


@pytest.mark.parametrize("memory_model", ["paged", "contiguous"])
@pytest.mark.parametrize("policy", STATIC_POLICIES)
def test_static_batches_run_to_completion(policy: str, memory_model: str) -> None:
    requests = [
        Request("r0", 0.0, 10, 3),
        Request("r1", 0.001, 30, 8),
        Request("r2", 0.002, 5, 2),
        Request("r3", 0.003, 7, 2),
        Request("r4", 0.5, 9, 1),
    ]
    cache = CacheConfig(
        num_blocks=64,
        block_size=4,
        memory_model=memory_model,  # type: ignore[arg-type]
        max_model_len=64,
    )
    config = SchedulerConfig(policy=policy, batch_size=2, max_wait_s=100.0)
    result = replay(requests, cache, config)
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    batches = [b for b in result.batches if not b.is_empty]
    # No batch while only one request waits: the first starts when B = 2 are waiting.
    assert batches[0].now_s == requests[1].arrival_s
    assert batches[0].request_ids == ("r0", "r1")
    assert batches[0].num_padding_tokens == 30 - 10
    groups: list[set[str]] = [set()]
    for batch in batches:
        ids = set(batch.request_ids)
        if not ids & groups[-1] and groups[-1]:
            groups.append(set())
        groups[-1] |= ids
    assert groups == [{"r0", "r1"}, {"r2", "r3"}, {"r4"}]
    # Members finish together, when the batch's last sequence does.
    assert requests[0].finish_s == requests[1].finish_s
    assert requests[0].tokens.last_s is not None and requests[1].finish_s is not None
    assert requests[0].tokens.last_s < requests[1].finish_s
    assert result.finished[:2] == [requests[0], requests[1]]
    # r4 is a partial last batch: it runs only because arrivals are done.
    assert batches[-1].request_ids == ("r4",)


@pytest.mark.parametrize("memory_model", ["paged", "contiguous"])
@pytest.mark.parametrize("policy", STATIC_POLICIES)
def test_static_finished_member_keeps_memory_until_batch_ends(
    policy: str, memory_model: str
) -> None:
    s = make_scheduler(policy, memory_model=memory_model, batch_size=2, max_wait_s=100.0)
    short, long = Request("short", 0.0, 8, 2), Request("long", 0.0, 8, 5)
    assert s.add_request(short, 0.0) and s.add_request(long, 0.0)
    seq = short.seq_ids[0]

    def holds_memory() -> bool:
        if isinstance(s.kv, PagedKVManager):
            return s.kv.allocator.has_table(seq)
        return seq in s.kv.allocator.ranges()  # type: ignore[attr-defined]

    now_s = 0.0
    for _ in range(2):
        _, finished, now_s = step(s, now_s)
    assert short.num_output_tokens == 2 and not finished
    assert short in s.held and holds_memory()
    while not finished:
        batch, finished, now_s = step(s, now_s)
        assert batch.num_padding_tokens == 1, "the held sample computes for nothing"
        assert finished or holds_memory()
    assert finished == [short, long] and short.finish_s == long.finish_s == now_s
    assert not holds_memory()
    assert_all_free(s)


@pytest.mark.parametrize("policy", STATIC_POLICIES)
def test_partial_batch_runs_after_arrivals_done(policy: str) -> None:
    s = make_scheduler(policy, batch_size=4, max_wait_s=100.0)
    requests = [Request(f"r{i}", 0.0, 8, 2) for i in range(2)]
    for request in requests:
        assert s.add_request(request, 0.0)
    batch, _, _ = step(s, 0.0)
    assert batch.is_empty
    s.mark_arrivals_done()
    batch, _, _ = step(s, 0.0)
    assert [r.request for r in batch.requests] == requests


def test_static_never_wakes_itself() -> None:
    s = make_scheduler("static", batch_size=4, max_wait_s=0.1)
    assert s.add_request(Request("r0", 0.0, 8, 2), 0.0)
    batch, _, _ = step(s, 5.0)
    assert batch.is_empty and batch.next_wakeup_s is None


def test_dynamic_starts_after_max_wait() -> None:
    s = make_scheduler("dynamic", batch_size=4, max_wait_s=0.5)
    first, second = Request("r0", 0.1, 8, 2), Request("r1", 0.2, 8, 2)
    assert s.add_request(first, 0.1)
    batch, _, _ = step(s, 0.1)
    assert batch.is_empty and batch.next_wakeup_s == first.arrival_s + 0.5
    assert s.add_request(second, 0.2)
    batch, _, _ = step(s, 0.2)
    assert batch.is_empty and batch.next_wakeup_s == first.arrival_s + 0.5
    batch, _, _ = step(s, 0.59)
    assert batch.is_empty
    batch, _, _ = step(s, first.arrival_s + 0.5)
    assert [r.request for r in batch.requests] == [first, second]
    assert batch.next_wakeup_s is None


def test_dynamic_replay_wakes_without_arrivals() -> None:
    requests = [Request("r0", 0.1, 8, 2), Request("r1", 0.2, 8, 2), Request("r2", 9.0, 8, 2)]
    config = SchedulerConfig(policy="dynamic", batch_size=4, max_wait_s=0.5)
    result = replay(
        requests,
        CacheConfig(num_blocks=64, block_size=4, memory_model="paged", max_model_len=4096),
        config,
    )
    first = next(b for b in result.batches if not b.is_empty)
    assert first.now_s == 0.1 + 0.5 and first.request_ids == ("r0", "r1")


def test_memory_snapshot_difference_takes_every_field() -> None:
    """``MemorySnapshot.__sub__`` is written out field by field: a field added later without
    its line there fails here (each field gets its own distinct values)."""
    import dataclasses

    from core.memory import MemorySnapshot

    names = [f.name for f in dataclasses.fields(MemorySnapshot)]
    parts = [n for n in names if n not in ("total_slots", "shared_saved_slots")]

    def snapshot(scale: int) -> MemorySnapshot:
        values = {name: scale * (3 + 2 * i) for i, name in enumerate(parts)}
        values["total_slots"] = sum(values.values())
        values["shared_saved_slots"] = scale * 101
        return MemorySnapshot(**values)

    a, b = snapshot(7), snapshot(2)
    diff = a - b
    for name in names:
        assert getattr(diff, name) == getattr(a, name) - getattr(b, name), name
    assert diff == snapshot(5)


def test_written_out_inits_start_every_field_at_its_declared_default() -> None:
    """``Request`` and ``ScheduledBatch`` write their ``__init__`` out (a
    compiled build runs a generated one as Python): each field a caller does not pass starts
    as the class declares, so a field added later without its line in ``__init__`` fails
    here."""
    import dataclasses

    from core.batch import ScheduledBatch

    built = {
        Request: Request("r", 0.5, 7, 3),
        ScheduledBatch: ScheduledBatch(step_idx=0, now_s=0.0),
    }
    for cls, obj in built.items():
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.default is not dataclasses.MISSING:
                assert getattr(obj, f.name) == f.default, (cls.__name__, f.name)
            elif f.default_factory is not dataclasses.MISSING:
                want = f.default_factory()
                got = getattr(obj, f.name)
                assert type(got) is type(want), (cls.__name__, f.name)
                if type(want).__eq__ is not object.__eq__:  # (a TokenTimeline has no equality)
                    assert got == want, (cls.__name__, f.name)
    request = built[Request]
    assert (request.request_id, request.arrival_s, request.num_prompt_tokens) == ("r", 0.5, 7)
    assert request.max_output_tokens == 3 and request.tokens.num_emissions == 0
    with pytest.raises(ValueError, match="num_prompt_tokens"):
        Request("bad", 0.0, 0, 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.integers(0, 50)), max_size=20))
def test_insert_by_arrival_is_insort_by_arrival_order(keys: list[tuple[float, int]]) -> None:
    """The written-out insertion keeps ``running`` in the order ``bisect.insort`` would, ties
    of arrival time broken by the order requests were added."""
    import bisect

    from core.step import arrival_order, insert_by_arrival

    requests = []
    for i, (arrival_s, idx) in enumerate(keys):
        request = Request(f"r{i}", arrival_s, 4, 2)
        request.internal_idx = idx * 100 + i  # (unique, as the scheduler's are)
        requests.append(request)
    ours: list[Request] = []
    theirs: list[Request] = []
    for request in requests:
        insert_by_arrival(ours, request)
        bisect.insort(theirs, request, key=arrival_order)
    assert ours == theirs
