"""The closed-form memory sum over a run of decode steps must equal adding up the snapshot of
every step, worked out here the slow, obvious way (including steps that evict cached-free
prefix blocks once the uncached free ones run out)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import CacheConfig
from core.kv_manager import PagedKVManager
from core.request import Request
from sim.fastforward.growth import UNBOUNDED, ChunkRun, RepeatShape, RequestGrowth
from sim.fastforward.memory import BlocksTaken, PagedRunMemory

BLOCK_SIZE = 4
NEVER = UNBOUNDED


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


def _kv_with(
    num_blocks: int, num_cached: int, held: list[int]
) -> tuple[PagedKVManager, list[RequestGrowth]]:
    """A cache with ``num_cached`` cached-free blocks and one decoding sequence per entry of
    ``held`` (the tokens it holds); ``num_blocks`` usable, besides the null block."""
    kv = PagedKVManager(
        CacheConfig(
            num_blocks=num_blocks + 1,
            block_size=BLOCK_SIZE,
            memory_model="paged",
            max_model_len=4096,
        )
    )
    alloc = kv.allocator
    if num_cached:
        alloc.allocate(10_000, num_cached * BLOCK_SIZE)
        for idx in range(num_cached):
            alloc.cache_block(10_000, idx, key=idx)
        alloc.free(10_000)
    growth: list[RequestGrowth] = []
    for seq_id, tokens in enumerate(held):
        alloc.allocate(seq_id, tokens)
        request = Request(f"r{seq_id}", 0.0, num_prompt_tokens=tokens, max_output_tokens=10_000)
        request.seq_ids = [seq_id]
        request.live_seq_ids = [seq_id]
        growth.append((request, 1, NEVER))
    return kv, growth


def _summed_step_by_step(kv: PagedKVManager, held: list[int], count: int) -> tuple[int, ...]:
    alloc = kv.allocator
    cached0 = alloc.num_cached_free_blocks
    free0 = alloc.num_free_blocks - cached0
    totals = [0] * 5
    for step in range(count):
        new = sum(_blocks(t + step + 1) - _blocks(t) for t in held)
        used = alloc.num_used_blocks + new
        real = alloc.num_filled_slots + (step + 1) * len(held)
        evicted = max(0, new - free0)
        for idx, value in enumerate(
            (
                real,
                used * BLOCK_SIZE - real,
                (cached0 - evicted) * BLOCK_SIZE,
                max(0, free0 - new) * BLOCK_SIZE,
                alloc.num_blocks * BLOCK_SIZE,
            )
        ):
            totals[idx] += value
    return tuple(totals)


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    num_cached=st.integers(0, 12),
    spare=st.integers(0, 30),
    count=st.integers(1, 60),
)
def test_decode_memory_sum_matches_step_by_step(
    held: list[int], num_cached: int, spare: int, count: int
) -> None:
    used = sum(_blocks(t) for t in held)
    num_blocks = used + num_cached + spare
    kv, growth = _kv_with(num_blocks, num_cached, held)
    # Only as many steps as the free and cached-free blocks can hold (what growth_capacity
    # guarantees before a repeat).
    while count and sum(_blocks(t + count) - _blocks(t) for t in held) > num_cached + spare:
        count -= 1
    if not count:
        return
    got = PagedRunMemory(kv).repeat_memory_sum(growth, count, None)
    real, internal, cached, free, total = _summed_step_by_step(kv, held, count)
    assert got.real_token_slots == real
    assert got.internal_fragmentation_slots == internal
    assert got.cached_free_slots == cached
    assert got.free_slots == free
    assert got.total_slots == total
    assert got.reservation_waste_slots == got.external_fragmentation_slots == 0


def _shape_of(kv: PagedKVManager, growth: list[RequestGrowth]) -> RepeatShape:
    """The aggregate that planning gathers for ``growth`` (see fastforward.plan)."""
    phases = [0] * BLOCK_SIZE
    decode_seqs = decode_tokens = 0
    chunks: list[ChunkRun] = []
    for request, per_step, left in growth:
        held = kv.allocator.num_tokens(request.live_seq_ids[0])
        if left == NEVER:
            decode_seqs += 1
            decode_tokens += held
            phases[held % BLOCK_SIZE] += 1
        else:
            chunks.append((per_step, held, left, 1))
    return RepeatShape(decode_seqs, decode_tokens, tuple(phases), tuple(chunks))


def _need_one_by_one(kv: PagedKVManager, growth: list[RequestGrowth], k: int) -> int:
    """Blocks ``k`` steps of ``growth`` take, sequence by sequence, the slow obvious way."""
    alloc = kv.allocator
    return sum(
        _blocks(alloc.num_tokens(seq_id) + min(per_step * k, left)) - len(alloc.block_table(seq_id))
        for request, per_step, left in growth
        for seq_id in request.active_seq_ids
    )


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.integers(1, 40), min_size=0, max_size=8),
    prompt=st.one_of(
        st.none(), st.tuples(st.integers(1, 30), st.integers(1, 9), st.integers(1, 90))
    ),
    spare=st.integers(0, 40),
    limit=st.integers(1, 60),
)
def test_growth_from_the_aggregate_shape_matches_growing_for_real(
    held: list[int], prompt: tuple[int, int, int] | None, spare: int, limit: int
) -> None:
    """The shape built from per-request growth is the one planning gathers; blocks taken by
    k repeats, from the shape, equal a count sequence by sequence and the blocks really taken
    when the growth is applied; the capacity search, the memory sum and the admission check
    give the same with the shape given or built."""
    if not held and prompt is None:
        return
    used = sum(_blocks(t) for t in held) + (_blocks(prompt[0]) if prompt else 0)
    kv, growth = _kv_with(used + spare, 0, held)
    if prompt is not None:
        tokens, per_step, left = prompt
        kv.allocator.allocate(500, tokens)
        request = Request("p", 0.0, num_prompt_tokens=tokens + left, max_output_tokens=5)
        request.seq_ids = request.live_seq_ids = [500]
        request.num_computed_tokens = tokens
        growth.append((request, per_step, left))
    shape = _shape_of(kv, growth)
    sums = PagedRunMemory(kv)
    assert sums.shape_of(growth) == shape
    by_shape = BlocksTaken(shape, BLOCK_SIZE)
    for k in range(limit + 1):
        assert by_shape.after(k) == _need_one_by_one(kv, growth, k), k
    capacity = sums.growth_capacity(growth, limit)
    assert sums.growth_capacity(growth, limit, shape) == capacity
    waiting = Request("w", 0.0, num_prompt_tokens=3 * BLOCK_SIZE, max_output_tokens=1)
    for steps in (1, capacity):
        assert sums.can_admit_after(
            waiting, waiting.num_prompt_tokens, (), growth, steps, shape
        ) == (sums.can_admit_after(waiting, waiting.num_prompt_tokens, (), growth, steps))
    if capacity:
        assert sums.repeat_memory_sum(growth, capacity, None, shape) == sums.repeat_memory_sum(
            growth, capacity, None
        )
        free_before = kv.allocator.num_free_blocks
        for request, per_step, left in growth:
            kv.grow(request, min(per_step * capacity, left))
        assert free_before - kv.allocator.num_free_blocks == by_shape.after(capacity)
