"""Invariants every batching policy must keep, run for each entry of ``POLICIES`` under both
memory models, both preemption modes and (paged) prefix caching on and off."""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.batch import ScheduledBatch
from core.config import PREEMPTION_MODES, SCHEDULING_POLICIES, CacheConfig, SchedulerConfig
from core.contiguous_allocator import reservation_slots
from core.kv_manager import PagedKVManager
from core.policies import POLICIES
from core.policies.static import StaticBatching
from core.request import Request, RequestStatus
from core.scheduler import Scheduler
from tests.core.driver import ReplayResult, is_done, make_workload, replay

BLOCK_SIZE = 16
MAX_MODEL_LEN = 512
# Policies allowed to split a never-preempted prompt over several steps.
CHUNKING_POLICIES = frozenset({"chunked"})

# (memory_model, enable_prefix_caching): prefix caching exists only for paged memory.
MEMORY = [("paged", False), ("paged", True), ("contiguous", False)]
MEMORY_IDS = ["paged", "paged-prefix", "contiguous"]

policy_param = pytest.mark.parametrize("policy", list(POLICIES))
memory_param = pytest.mark.parametrize(("memory_model", "prefix_caching"), MEMORY, ids=MEMORY_IDS)
preemption_param = pytest.mark.parametrize("preemption", PREEMPTION_MODES)


def cache_config(
    memory_model: str, prefix_caching: bool, num_blocks: int = 64, num_cpu_blocks: int = 32
) -> CacheConfig:
    return CacheConfig(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        memory_model=memory_model,  # type: ignore[arg-type]
        reservation="pow2",
        num_cpu_blocks=num_cpu_blocks,
        enable_prefix_caching=prefix_caching,
        max_model_len=MAX_MODEL_LEN,
    )


def scheduler_config(
    policy: str, preemption: str, max_num_seqs: int = 8, parallel_sampling: str = "fork"
) -> SchedulerConfig:
    """The invariant tests' settings; their n > 1 requests fork (the fan-out, whose children
    are plain requests, has its own invariants in ``test_parallel_sampling``)."""
    return SchedulerConfig(
        policy=policy,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=256,
        preemption_mode=preemption,  # type: ignore[arg-type]
        batch_size=4,
        max_wait_s=0.05,
        parallel_sampling=parallel_sampling,  # type: ignore[arg-type]
    )


def workload(seed: int, prefix_caching: bool) -> list[Request]:
    """40 mixed requests (some with n > 1), plus one longer than ``MAX_MODEL_LEN``."""
    requests = make_workload(
        seed,
        40,
        prompt_tokens=(1, 300),
        output_tokens=(1, 48),
        max_n=3,
        num_prefixes=3 if prefix_caching else 0,
        prefix_tokens=80,
    )
    requests.append(Request("too-long", 0.2, 500, 100))
    return requests


def standard_run(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str, seed: int = 1
) -> ReplayResult:
    return replay(
        workload(seed, prefix_caching),
        cache_config(memory_model, prefix_caching),
        scheduler_config(policy, preemption),
    )


def assert_all_done(result: ReplayResult) -> None:
    """Every request finished or was rejected with a reason; nothing lost or reported twice."""
    requests = result.requests
    lost = [(r.request_id, r.status) for r in requests if not is_done(r)]
    assert not lost, f"requests neither finished nor rejected with a reason: {lost}"
    finished_ids = [r.request_id for r in result.finished]
    assert len(finished_ids) == len(set(finished_ids)), "update returned a request twice"
    expected = {r.request_id for r in requests if r.status is RequestStatus.FINISHED}
    assert set(finished_ids) == expected
    rejected_ids = {r.request_id for r in result.rejected}
    assert rejected_ids == {r.request_id for r in requests if r.status is RequestStatus.REJECTED}
    assert len(finished_ids) + len(rejected_ids) == len(requests)
    scheduled_ids = {e.request_id for b in result.batches for e in b.entries}
    assert not scheduled_ids & rejected_ids, "a rejected request was scheduled"
    s = result.scheduler
    assert not (s.waiting or s.running or s.swapped or s.held)
    assert not s.has_unfinished()


def assert_cache_empty(scheduler: Scheduler) -> None:
    kv = scheduler.kv
    if isinstance(kv, PagedKVManager):
        alloc = kv.allocator
        assert alloc.num_free_blocks == alloc.num_blocks
        assert alloc.num_free_cpu_blocks == alloc.num_cpu_blocks
        assert alloc.num_used_blocks == 0 and alloc.num_filled_slots == 0
    else:
        assert kv.allocator.num_reserved_slots == 0  # type: ignore[attr-defined]
        assert kv.allocator.holes() == [(0, kv.allocator.num_slots)]  # type: ignore[attr-defined]


@policy_param
@memory_param
@preemption_param
def test_every_request_finishes_or_is_rejected(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str
) -> None:
    result = standard_run(policy, memory_model, prefix_caching, preemption)
    assert_all_done(result)
    assert len(result.finished) >= len(result.requests) // 2, "workload too hostile to test"
    assert result.by_id["too-long"].status is RequestStatus.REJECTED
    for request in result.finished:
        assert request.num_output_tokens == request.max_output_tokens
        assert request.tokens.num_emissions == request.max_output_tokens
        assert request.first_token_s is not None and request.finish_s is not None
        assert request.first_scheduled_s is not None
        assert request.arrival_s <= request.first_scheduled_s <= request.first_token_s
        assert request.first_token_s <= request.finish_s
        assert request.ttft_s is not None and request.ttft_s >= 0
        assert request.tokens.last_s is not None and request.tokens.last_s <= request.finish_s
        assert request.num_blocks_swapped_out == request.num_blocks_swapped_in
    for request in result.rejected:
        assert request.finish_s is not None and request.first_scheduled_s is None
    assert_cache_empty(result.scheduler)


@policy_param
@memory_param
@preemption_param
def test_step_budgets_respected(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str
) -> None:
    result = standard_run(policy, memory_model, prefix_caching, preemption)
    config = scheduler_config(policy, preemption)
    policy_obj = POLICIES[policy](config)
    token_budget = policy_obj.token_budget()
    seq_budget = policy_obj.seq_budget()
    is_static = issubclass(POLICIES[policy], StaticBatching)
    for batch in result.batches:
        if token_budget is not None:
            assert batch.num_batched_tokens <= token_budget, batch
        if seq_budget is not None:
            assert batch.num_seqs <= seq_budget, batch
        if is_static:
            assert len(batch.entries) <= config.batch_size, batch
        assert len(set(batch.request_ids)) == len(batch.entries), "request scheduled twice"
        for entry in batch.entries:
            assert entry.num_positions > 0
            assert entry.num_new_tokens == entry.num_positions * len(entry.seq_ids)
    assert result.num_steps > 0


@policy_param
@memory_param
@preemption_param
def test_prompts_split_only_by_chunking_policies(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str
) -> None:
    """A request's first share covers its whole prompt unless the policy chunks prompts."""
    result = standard_run(policy, memory_model, prefix_caching, preemption)
    split = []
    for request in result.finished:
        entries = result.entries_of(request.request_id)
        first = entries[0]
        assert first.is_prefill and first.num_preemptions == 0
        if first.num_computed_tokens + first.num_positions != request.num_prompt_tokens:
            split.append(request.request_id)
        elif request.num_preemptions == 0:
            # Never preempted: the prompt step was its only prefill.
            assert sum(e.is_prefill for e in entries) == 1, request.request_id
    if policy in CHUNKING_POLICIES:
        # Prompts up to 300 tokens against a 256-token budget: some must have been split.
        assert split, "chunked prefill never split a prompt"
    else:
        assert not split, f"{policy} split fresh prompts of {split}"


@pytest.mark.parametrize("policy", sorted(CHUNKING_POLICIES & set(POLICIES)))
@memory_param
@preemption_param
def test_chunked_schedules_decodes_before_prefill_chunks(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str
) -> None:
    # Only the token budget may bind here: a forked request can outgrow a binding sequence
    # budget and legitimately sit out a step while a narrower prefill fits.
    result = replay(
        workload(1, prefix_caching),
        cache_config(memory_model, prefix_caching),
        scheduler_config(policy, preemption, max_num_seqs=256),
    )
    budget_bound = 0
    for batch in result.batches:
        decodes = {rid for rid, prefill in batch.running_before if not prefill}
        first_prefill = next((i for i, e in enumerate(batch.entries) if e.is_prefill), None)
        if first_prefill is None:
            continue
        if batch.num_batched_tokens == 256:
            budget_bound += 1
        # Every decode that was running is in the step (or was preempted by it), ahead of
        # every prefill chunk.
        left_out = decodes - set(batch.request_ids) - set(batch.preempted_ids)
        assert not left_out, f"step {batch.step_idx} chunked prefill but left out {left_out}"
        late = [e.request_id for e in batch.entries[first_prefill:] if e.request_id in decodes]
        assert not late, f"step {batch.step_idx}: decodes {late} scheduled after a prefill chunk"
    assert budget_bound > 0, "the token budget never bound: the test checked nothing"


def tight_cache(
    requests: list[Request], memory_model: str, num_cpu_blocks: int, watermark: float
) -> CacheConfig:
    """A cache barely larger than the largest request (one spare block, plus the watermark)."""
    probe = cache_config(memory_model, False)
    if memory_model == "paged":
        need = max(PagedKVManager(probe).max_blocks_needed(r) for r in requests)
    else:
        slots = [
            reservation_slots("pow2", r.max_total_tokens, MAX_MODEL_LEN) * r.n for r in requests
        ]
        need = -(-max(slots) // BLOCK_SIZE)
    null = 1 if memory_model == "paged" else 0  # the paged cache's null block
    num_blocks = need + 1 + null
    while num_blocks - null - int(watermark * num_blocks) < need + 1:
        num_blocks += 1
    return CacheConfig(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        memory_model=memory_model,  # type: ignore[arg-type]
        reservation="pow2",
        num_cpu_blocks=num_cpu_blocks,
        watermark=watermark,
        max_model_len=MAX_MODEL_LEN,
    )


@policy_param
@pytest.mark.parametrize("memory_model", ["paged", "contiguous"])
@preemption_param
@pytest.mark.parametrize("watermark", [0.0, 0.1])
def test_no_deadlock_under_memory_pressure(
    policy: str, memory_model: str, preemption: str, watermark: float
) -> None:
    requests = make_workload(
        7, 30, rate_per_s=200.0, prompt_tokens=(16, 160), output_tokens=(8, 80), max_n=2
    )
    cache = tight_cache(requests, memory_model, num_cpu_blocks=6, watermark=watermark)
    result = replay(requests, cache, scheduler_config(policy, preemption), max_steps=20_000)
    assert_all_done(result)
    assert not result.rejected, [r.reject_reason for r in result.rejected]
    assert_cache_empty(result.scheduler)
    num_preemptions = sum(r.num_preemptions for r in requests)
    if memory_model == "contiguous":
        assert num_preemptions == 0
        return
    assert num_preemptions > 0, "the cache was not tight enough to preempt"
    swapped = sum(r.num_blocks_swapped_out for r in requests)
    recomputed = sum(r.num_recomputed_tokens for r in requests)
    if preemption == "swap":
        assert swapped > 0, "nothing was swapped"
        assert recomputed > 0, "the small CPU pool never forced the recompute fallback"
    else:
        assert swapped == 0 and recomputed > 0


def fingerprint(result: ReplayResult) -> tuple[Any, ...]:
    requests = tuple(
        (
            r.request_id,
            r.status,
            r.reject_reason,
            r.first_scheduled_s,
            r.first_token_s,
            r.finish_s,
            r.tokens.first_s,
            r.tokens.last_s,
            r.tokens.num_emissions,
            tuple(r.tokens.run_starts),
            tuple(r.tokens.run_counts),
            r.num_preemptions,
            r.num_recomputed_tokens,
            r.num_blocks_swapped_out,
            r.num_blocks_swapped_in,
            r.num_prefix_hit_tokens,
            r.num_cow_copies,
        )
        for r in result.requests
    )
    batches = tuple(astuple(b) for b in result.batches)
    finished = tuple(r.request_id for r in result.finished)
    return requests, batches, finished, result.end_s


@policy_param
@memory_param
@preemption_param
def test_same_inputs_same_results(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str
) -> None:
    first = fingerprint(standard_run(policy, memory_model, prefix_caching, preemption, seed=3))
    second = fingerprint(standard_run(policy, memory_model, prefix_caching, preemption, seed=3))
    assert first == second
    other = fingerprint(standard_run(policy, memory_model, prefix_caching, preemption, seed=4))
    assert other != first, "a different seed gave the same run: the fingerprint sees nothing"


def check_snapshot(scheduler: Scheduler, batch: ScheduledBatch) -> None:
    """Per-step memory accounting (the snapshot itself asserts that its parts add up)."""
    mem = batch.memory
    assert mem is not None
    parts = (
        mem.real_token_slots,
        mem.internal_fragmentation_slots,
        mem.reservation_waste_slots,
        mem.cached_free_slots,
        mem.external_fragmentation_slots,
        mem.free_slots,
        mem.shared_saved_slots,
    )
    assert min(parts) >= 0, mem
    assert mem.real_token_slots <= mem.total_slots
    holders = [*scheduler.running, *scheduler.held]
    kv = scheduler.kv
    bs = kv.block_size
    if isinstance(kv, PagedKVManager):
        assert mem.reservation_waste_slots == 0 and mem.external_fragmentation_slots == 0
        alloc = kv.allocator
        num_seqs = sum(alloc.has_table(s) for r in holders for s in r.seq_ids)
        # Only a sequence's last block may be partly filled.
        assert mem.internal_fragmentation_slots <= (bs - 1) * num_seqs, (mem, num_seqs)
        assert mem.used_slots == alloc.num_used_blocks * bs
    else:
        assert mem.internal_fragmentation_slots == 0 and mem.cached_free_slots == 0
        if not batch.is_empty:
            # A reservation covers the final length; the last sampled token is never computed.
            assert mem.reservation_waste_slots > 0, mem


@policy_param
@memory_param
@preemption_param
def test_memory_snapshot_accounting(
    policy: str, memory_model: str, prefix_caching: bool, preemption: str
) -> None:
    steps: list[int] = []

    def on_step(scheduler: Scheduler, batch: ScheduledBatch) -> None:
        check_snapshot(scheduler, batch)
        steps.append(batch.step_idx)

    result = replay(
        workload(5, prefix_caching),
        cache_config(memory_model, prefix_caching, num_blocks=40),
        scheduler_config(policy, preemption),
        on_step=on_step,
    )
    assert_all_done(result)
    assert len(steps) == len(result.batches)
    shared = max(b.memory.shared_saved_slots for b in result.batches if b.memory is not None)
    if memory_model == "paged":
        # n > 1 forks share prompt blocks (and prefix hits share across requests).
        assert shared > 0


@st.composite
def random_setup(draw: st.DrawFn) -> tuple[list[Request], CacheConfig, SchedulerConfig]:
    """A small random workload and a cache between barely-fits and roomy."""
    memory_model = draw(st.sampled_from(["paged", "contiguous"]))
    prefix_caching = memory_model == "paged" and draw(st.booleans())
    block_size = draw(st.sampled_from([4, 8, 16]))
    requests = make_workload(
        draw(st.integers(0, 10_000)),
        draw(st.integers(1, 12)),
        rate_per_s=draw(st.sampled_from([5.0, 50.0, 500.0])),
        prompt_tokens=(1, draw(st.sampled_from([20, 100, 200]))),
        output_tokens=(1, draw(st.sampled_from([5, 40]))),
        max_n=3,
        num_prefixes=2 if prefix_caching else 0,
        prefix_tokens=40,
    )
    reservation = draw(st.sampled_from(["max", "pow2", "oracle"]))
    if memory_model == "paged":
        probe = CacheConfig(
            num_blocks=2, block_size=block_size, memory_model="paged", max_model_len=4096
        )
        # One more: the null block.
        need = max(PagedKVManager(probe).max_blocks_needed(r) for r in requests) + 1
    else:
        slots = max(reservation_slots(reservation, r.max_total_tokens, 512) * r.n for r in requests)
        need = -(-slots // block_size)
    cache = CacheConfig(
        num_blocks=need + draw(st.integers(0, 8)),
        block_size=block_size,
        memory_model=memory_model,  # type: ignore[arg-type]
        reservation=reservation,  # type: ignore[arg-type]
        num_cpu_blocks=draw(st.integers(0, 10)),
        enable_prefix_caching=prefix_caching,
        watermark=draw(st.sampled_from([0.0, 0.05])),
        max_model_len=512,
    )
    config = SchedulerConfig(
        policy=draw(st.sampled_from(list(POLICIES))),
        max_num_seqs=draw(st.integers(3, 8)),  # >= max_n, so wide requests are not rejected
        max_num_batched_tokens=draw(st.sampled_from([16, 64, 256])),
        preemption_mode=draw(st.sampled_from(PREEMPTION_MODES)),
        batch_size=draw(st.integers(1, 4)),
        max_wait_s=draw(st.sampled_from([0.0, 0.05])),
        scheduling_policy=draw(st.sampled_from(SCHEDULING_POLICIES)),
    )
    if config.scheduling_policy == "priority":
        for request in requests:
            request.priority = draw(st.integers(0, 2))
    return requests, cache, config


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_setup())
def test_random_configs_finish_within_budgets(
    setup: tuple[list[Request], CacheConfig, SchedulerConfig],
) -> None:
    requests, cache, config = setup
    result = replay(requests, cache, config, on_step=check_snapshot, max_steps=20_000)
    assert_all_done(result)
    assert_cache_empty(result.scheduler)
    policy_obj = POLICIES[config.policy](config)
    token_budget, seq_budget = policy_obj.token_budget(), policy_obj.seq_budget()
    for batch in result.batches:
        assert token_budget is None or batch.num_batched_tokens <= token_budget
        assert seq_budget is None or batch.num_seqs <= seq_budget
    for request in result.finished:
        assert request.tokens.num_emissions == request.max_output_tokens
