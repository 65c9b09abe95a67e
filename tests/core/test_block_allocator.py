"""Property tests of the paged BlockAllocator against an independent model of token contents.

The model keeps, for every sequence, the tokens it holds and, for every physical block (GPU
and CPU), the tokens written into it. After every rule it checks that reading a sequence's
blocks gives back exactly its tokens — which fails if a shared block was ever written — plus
the ref-count, free-list and prefix-cache invariants.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from core.block_allocator import BlockAllocator, OutOfBlocksError

BLOCK_SIZE = 4
NUM_BLOCKS = 24
NUM_CPU_BLOCKS = 12
# A few shared prompt stems so prefix lookups hit.
STEMS = [tuple(range(100 * s, 100 * s + 13)) for s in range(3)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def content_key(tokens: tuple[int, ...]) -> int:
    """The test's own prefix key: the whole token prefix up to the end of the block."""
    return hash(("prefix", tokens))


class BlockAllocatorMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.alloc = BlockAllocator(NUM_BLOCKS, BLOCK_SIZE, NUM_CPU_BLOCKS)
        self.tokens: dict[int, list[int]] = {}  # seq -> tokens it holds
        self.gpu: dict[int, list[int]] = {}  # block -> tokens written
        self.cpu: dict[int, list[int]] = {}
        self.swapped: set[int] = set()
        self.cached_content: dict[int, tuple[int, ...]] = {}  # key -> the block's tokens
        self.ids = itertools.count()
        self.fresh = itertools.count(10_000)

    # -- helpers ---------------------------------------------------------------------------

    def _write(self, seq: int, start: int, new: list[int]) -> None:
        table = self.alloc.block_table(seq)
        for offset, token in enumerate(new):
            pos = start + offset
            block = table[pos // BLOCK_SIZE]
            slot = pos % BLOCK_SIZE
            if slot == 0:  # a fresh block: whatever it held before is gone
                self.gpu[block] = [token]
                continue
            data = self.gpu[block]
            if slot < len(data):
                data[slot] = token
            else:
                assert slot == len(data), "a block's slots fill in order"
                data.append(token)

    def _on_gpu(self) -> list[int]:
        return [s for s in self.tokens if s not in self.swapped]

    # -- rules -----------------------------------------------------------------------------

    @rule(
        target=seqs,
        stem=st.integers(0, len(STEMS) - 1),
        stem_len=st.integers(0, 13),
        extra=st.integers(0, 9),
    )
    def allocate(self, stem: int, stem_len: int, extra: int) -> int:
        seq = next(self.ids)
        tokens = list(STEMS[stem][:stem_len]) + [next(self.fresh) for _ in range(extra)]
        if not tokens:
            tokens = [next(self.fresh)]
        keys = [
            content_key(tuple(tokens[: (i + 1) * BLOCK_SIZE]))
            for i in range((len(tokens) - 1) // BLOCK_SIZE)
        ]
        hits = self.alloc.match_prefix(keys)
        revived = sum(1 for b in hits if self.alloc.ref_count(b) == 0)
        need = ceil_div(len(tokens), BLOCK_SIZE) - len(hits) + revived
        if need > self.alloc.num_free_blocks:
            with pytest.raises(OutOfBlocksError):
                self.alloc.allocate(seq, len(tokens), hits)
            return seq  # a seq id that holds nothing; other rules skip it
        self.alloc.allocate(seq, len(tokens), hits)
        self.tokens[seq] = tokens
        for i, block in enumerate(hits):
            # The cache must have handed out blocks holding exactly these tokens.
            assert self.gpu[block] == tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
        hit_tokens = len(hits) * BLOCK_SIZE
        self._write(seq, hit_tokens, tokens[hit_tokens:])
        return seq

    @rule(seq=seqs, n=st.integers(1, 6))
    def append(self, seq: int, n: int) -> None:
        if seq not in self.tokens or seq in self.swapped:
            return
        num_tokens = len(self.tokens[seq])
        table = self.alloc.block_table(seq)
        shared_tail = num_tokens % BLOCK_SIZE and self.alloc.ref_count(table[-1]) > 1
        need = ceil_div(num_tokens + n, BLOCK_SIZE) - len(table) + (1 if shared_tail else 0)
        if need > self.alloc.num_free_blocks:
            before = list(table)
            with pytest.raises(OutOfBlocksError):
                self.alloc.append_slots(seq, n)
            assert list(self.alloc.block_table(seq)) == before, "a failed append changes nothing"
            return
        free_before = self.alloc.num_free_blocks
        copies = self.alloc.append_slots(seq, n)
        assert free_before - self.alloc.num_free_blocks == need
        assert len(copies) == (1 if shared_tail else 0)
        for src, dst in copies:
            self.gpu[dst] = list(self.gpu[src])
        new = [next(self.fresh) for _ in range(n)]
        self._write(seq, num_tokens, new)
        self.tokens[seq].extend(new)

    @rule(data=st.data(), num_steps=st.integers(1, 9))
    def append_steps(self, data: st.DataObject, num_steps: int) -> None:
        """Several sequences grown over ``num_steps`` steps at once: the first decoding (one
        position a step), the rest as runs (positions per step, positions left). A shared
        partial tail is refused (it needs a copy) and a pool too small raises; both change
        nothing, although the sequences before the bad one were already grown."""
        on_gpu = self._on_gpu()
        if not on_gpu:
            return
        group = data.draw(st.lists(st.sampled_from(on_gpu), min_size=1, max_size=4, unique=True))
        num_decodes = data.draw(st.integers(0, len(group)))
        decodes = group[:num_decodes]
        runs = [(s, data.draw(st.integers(1, 6)), data.draw(st.integers(1, 20))) for s in group]
        runs = runs[num_decodes:]
        grown = {seq: num_steps for seq in decodes}
        grown |= {seq: min(num_steps * per_step, left) for seq, per_step, left in runs}
        tables = {seq: self.alloc.block_table(seq) for seq in group}
        shared_tail = any(
            len(self.tokens[seq]) % BLOCK_SIZE and self.alloc.ref_count(tables[seq][-1]) > 1
            for seq in group
        )
        need = sum(
            ceil_div(len(self.tokens[seq]) + n, BLOCK_SIZE) - len(tables[seq])
            for seq, n in grown.items()
        )
        if shared_tail or need > self.alloc.num_free_blocks:
            before = (self.alloc.state(), self.alloc.num_filled_slots, self.alloc.num_used_blocks)
            with pytest.raises(ValueError if shared_tail else OutOfBlocksError):
                self.alloc.append_steps(runs, num_steps, decodes)
            after = (self.alloc.state(), self.alloc.num_filled_slots, self.alloc.num_used_blocks)
            assert after == before, "a refused append_steps changes nothing"
            return
        free_before = self.alloc.num_free_blocks
        self.alloc.append_steps(runs, num_steps, decodes)
        assert free_before - self.alloc.num_free_blocks == need
        for seq, n in grown.items():
            new = [next(self.fresh) for _ in range(n)]
            self._write(seq, len(self.tokens[seq]), new)
            self.tokens[seq].extend(new)

    @rule(target=seqs, parent=seqs)
    def fork(self, parent: int) -> int:
        child = next(self.ids)
        if parent not in self.tokens or parent in self.swapped:
            return child
        self.alloc.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq: int) -> None:
        if seq not in self.tokens:
            return
        self.alloc.free(seq)
        del self.tokens[seq]
        self.swapped.discard(seq)

    @rule(seq=seqs)
    def cache_full_blocks(self, seq: int) -> None:
        if seq not in self.tokens or seq in self.swapped:
            return
        tokens = self.tokens[seq]
        for idx in range(len(tokens) // BLOCK_SIZE):
            prefix = tuple(tokens[: (idx + 1) * BLOCK_SIZE])
            key = content_key(prefix)
            self.alloc.cache_block(seq, idx, key)
            self.cached_content[key] = prefix[-BLOCK_SIZE:]

    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        on_gpu = self._on_gpu()
        if not on_gpu:
            return
        group = data.draw(st.lists(st.sampled_from(on_gpu), min_size=1, max_size=2, unique=True))
        distinct = {b for s in group for b in self.alloc.block_table(s)}
        if len(distinct) > self.alloc.num_free_cpu_blocks:
            assert not self.alloc.can_swap_out(group)
            with pytest.raises(OutOfBlocksError):
                self.alloc.swap_out(group)
            return
        pairs = self.alloc.swap_out(group)
        assert {g for g, _ in pairs} == distinct
        for gpu_block, cpu_block in pairs:
            self.cpu[cpu_block] = list(self.gpu[gpu_block])
        self.swapped.update(group)

    @precondition(lambda self: bool(self.swapped))
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.swapped)))
        distinct = set(self.alloc.cpu_block_table(seq))
        if len(distinct) > self.alloc.num_free_blocks:
            with pytest.raises(OutOfBlocksError):
                self.alloc.swap_in([seq])
            return
        pairs = self.alloc.swap_in([seq])
        for cpu_block, gpu_block in pairs:
            self.gpu[gpu_block] = list(self.cpu[cpu_block])
        self.swapped.discard(seq)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def contents_match(self) -> None:
        for seq, tokens in self.tokens.items():
            if seq in self.swapped:
                table, store = self.alloc.cpu_block_table(seq), self.cpu
            else:
                table, store = self.alloc.block_table(seq), self.gpu
            assert len(table) == ceil_div(len(tokens), BLOCK_SIZE)
            held = [t for block in table for t in store[block][:BLOCK_SIZE]]
            assert held[: len(tokens)] == tokens, f"sequence {seq} reads back wrong tokens"
            assert self.alloc.num_tokens(seq) == len(tokens)

    @invariant()
    def ref_counts_and_free_list(self) -> None:
        holders: dict[int, int] = {}
        for seq in self._on_gpu():
            for block in self.alloc.block_table(seq):
                holders[block] = holders.get(block, 0) + 1
        for block in range(NUM_BLOCKS):
            assert self.alloc.ref_count(block) == holders.get(block, 0)
        used = len(holders)
        cached = self.alloc.num_cached_free_blocks
        uncached_free = self.alloc.num_free_blocks - cached
        assert uncached_free + used + cached == NUM_BLOCKS
        assert self.alloc.num_used_blocks == used
        assert self.alloc.num_shared_refs == sum(c - 1 for c in holders.values())
        filled = sum(len(self.gpu[b][:BLOCK_SIZE]) for b in holders)
        assert self.alloc.num_filled_slots == filled

    @invariant()
    def prefix_cache_entries_hold_their_tokens(self) -> None:
        for key, block in self.alloc.prefix_cache().items():
            assert self.alloc.block_key(block) == key
            assert tuple(self.gpu[block]) == self.cached_content[key]


BlockAllocatorMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestBlockAllocator = BlockAllocatorMachine.TestCase


def test_copy_on_write_names_the_copy() -> None:
    alloc = BlockAllocator(num_blocks=8, block_size=4)
    alloc.allocate(0, 6)  # blocks [a, b], b half full
    alloc.fork(0, 1)
    tail = alloc.block_table(0)[-1]
    assert alloc.ref_count(tail) == 2
    copies = alloc.append_slots(1, 1)
    assert len(copies) == 1 and copies[0][0] == tail
    assert alloc.block_table(1)[-1] == copies[0][1] != tail
    assert alloc.append_slots(0, 1) == []  # the last holder writes in place
    assert alloc.ref_count(tail) == 1


def test_evicts_least_recently_freed_cached_block_first() -> None:
    alloc = BlockAllocator(num_blocks=3, block_size=2)
    for seq, key in ((0, 11), (1, 22)):
        alloc.allocate(seq, 2)
        alloc.cache_block(seq, 0, key)
    alloc.free(0)
    alloc.free(1)
    assert alloc.num_cached_free_blocks == 2
    alloc.allocate(2, 4)  # takes the one free block, then evicts key 11 (freed first)
    assert alloc.cached_block(11) is None
    assert alloc.cached_block(22) is not None
    assert alloc.num_evictions == 1


def test_a_block_computed_twice_stays_cached_and_takes_over_the_key() -> None:
    """As vLLM's BlockPool: the second block with the same content is cached too (hits take
    the first); when the first is evicted, the second holds the key."""
    alloc = BlockAllocator(num_blocks=3, block_size=2)
    alloc.allocate(0, 2)
    assert alloc.cache_block(0, 0, 7)
    first = alloc.block_table(0)[0]
    alloc.allocate(1, 2)
    assert not alloc.cache_block(1, 0, 7)  # a duplicate: the first stays the one hits take
    second = alloc.block_table(1)[0]
    assert alloc.cached_block(7) == first and alloc.block_key(second) == 7
    alloc.free(0)
    alloc.free(1)
    assert alloc.num_cached_free_blocks == 2  # the duplicate is not reused before the cache
    alloc.allocate(2, 4)  # the one free block, then evicts `first` (freed first)
    assert alloc.cached_block(7) == second
    assert alloc.num_evictions == 1


def _allocator_with(held: list[int], num_blocks: int, num_cached: int) -> BlockAllocator:
    """Sequences 0.. holding ``held`` tokens, plus ``num_cached`` cached-free blocks."""
    alloc = BlockAllocator(num_blocks, 4)
    if num_cached:
        alloc.allocate(999, num_cached * 4)
        for idx in range(num_cached):
            alloc.cache_block(999, idx, key=idx)
        alloc.free(999)
    for seq_id, tokens in enumerate(held):
        alloc.allocate(seq_id, tokens)
    return alloc


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 9), st.integers(1, 60)), min_size=1, max_size=5
    ),
    num_steps=st.integers(1, 12),
    spare=st.integers(0, 30),
    num_cached=st.integers(0, 6),
    num_decodes=st.integers(0, 5),
)
def test_append_steps_takes_blocks_as_appending_step_by_step(
    runs: list[tuple[int, int, int]], num_steps: int, spare: int, num_cached: int, num_decodes: int
) -> None:
    """Growing sequences for several steps at once gives the same block tables, fills and
    evictions as appending step by step, sequence after sequence within each step; when the
    pool runs out it raises and changes nothing. The first ``num_decodes`` sequences decode
    (one position a step, without end) and go as ``decodes``, on their shorter path."""
    held = [tokens for tokens, _, _ in runs]
    num_blocks = sum(-(-t // 4) for t in held) + num_cached + spare
    bulk = _allocator_with(held, num_blocks, num_cached)
    stepwise = _allocator_with(held, num_blocks, num_cached)
    seq_runs = [
        (seq_id, 1, 1 << 62) if seq_id < num_decodes else (seq_id, per_step, left)
        for seq_id, (_, per_step, left) in enumerate(runs)
    ]
    decodes = [seq_id for seq_id, _, _ in seq_runs[:num_decodes]]
    before = bulk.state()
    try:
        bulk.append_steps(seq_runs[len(decodes) :], num_steps, decodes)
    except OutOfBlocksError:
        assert bulk.state() == before
        return
    for step in range(num_steps):
        for seq_id, per_step, left in seq_runs:
            positions = min(per_step, left - step * per_step)
            if positions > 0:
                stepwise.append_slots(seq_id, positions)
    assert bulk.state() == stepwise.state()
    assert bulk.num_filled_slots == stepwise.num_filled_slots
    assert bulk.num_used_blocks == stepwise.num_used_blocks
    used = [b for b in range(num_blocks) if bulk.ref_count(b)]  # a free block's fill is stale
    assert [bulk.block_fill(b) for b in used] == [stepwise.block_fill(b) for b in used]


def test_sequence_ids_index_the_tables() -> None:
    """Tables are kept by sequence id (a list, not a dict): ids beyond any table are simply
    absent, a negative id is refused, and a swapped-out sequence keeps its token count for
    swapping in and in the state, as it did when the tables were a dict."""
    alloc = BlockAllocator(num_blocks=8, block_size=4, num_cpu_blocks=8)
    assert not alloc.has_table(10**6) and not alloc.has_table(-1)
    with pytest.raises(ValueError, match="non-negative"):
        alloc.allocate(-1, 3)
    with pytest.raises(ValueError, match="no block table"):
        alloc.append_slots(5, 1)
    alloc.allocate(5, 6)  # ids need not start at 0 or come in order
    alloc.allocate(2, 1)
    assert list(alloc.block_table(5)) == [0, 1] and alloc.num_tokens(5) == 6
    assert [s for s, _ in alloc.state().block_tables] == [2, 5]
    alloc.swap_out([5])
    assert not alloc.has_table(5) and alloc.is_swapped(5) and alloc.num_tokens(5) == 6
    assert dict(alloc.state().num_tokens) == {2: 1, 5: 6}
    with pytest.raises(ValueError, match="already has a block table"):
        alloc.allocate(5, 1)
    alloc.swap_in([5])
    assert alloc.has_table(5) and alloc.num_tokens(5) == 6
    alloc.free(5)
    alloc.free(2)
    assert not alloc.has_table(5) and alloc.state().num_tokens == ()
    with pytest.raises(ValueError, match="no block table"):
        alloc.num_tokens(5)
    assert alloc.num_free_blocks == 8 and alloc.num_used_blocks == 0
