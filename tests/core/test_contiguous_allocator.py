"""Property tests of the contiguous reservation allocator (first-fit in a slot space) and of
the reservation rules, against an independent model that keeps only the reserved ranges."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from core.block_allocator import OutOfBlocksError
from core.config import CacheConfig
from core.contiguous_allocator import (
    ContiguousAllocator,
    ContiguousKVManager,
    reservation_slots,
)
from core.request import Request

NUM_SLOTS = 256


def model_first_fit(ranges: dict[int, tuple[int, int]], size: int) -> int | None:
    """Lowest start with ``size`` free slots, computed from the reserved ranges alone."""
    cursor = 0
    for start, length in sorted(ranges.values()):
        if start - cursor >= size:
            return cursor
        cursor = start + length
    return cursor if NUM_SLOTS - cursor >= size else None


class ContiguousMachine(RuleBasedStateMachine):
    owners = Bundle("owners")

    def __init__(self) -> None:
        super().__init__()
        self.alloc = ContiguousAllocator(NUM_SLOTS)
        self.ranges: dict[int, tuple[int, int]] = {}
        self.ids = itertools.count()

    @rule(target=owners, size=st.integers(1, 120))
    def reserve(self, size: int) -> int:
        owner = next(self.ids)
        expected = model_first_fit(self.ranges, size)
        if expected is None:
            with pytest.raises(OutOfBlocksError):
                self.alloc.reserve(owner, size)
            return owner
        assert self.alloc.reserve(owner, size) == expected
        self.ranges[owner] = (expected, size)
        return owner

    @rule(owner=consumes(owners))
    def release(self, owner: int) -> None:
        if owner in self.ranges:
            self.alloc.release(owner)
            del self.ranges[owner]

    @invariant()
    def ranges_and_holes_partition_the_space(self) -> None:
        assert self.alloc.ranges() == self.ranges
        pieces = sorted([*self.ranges.values(), *self.alloc.holes()])
        cursor = 0
        for start, length in pieces:
            assert start == cursor and length > 0, "ranges and holes tile the space exactly"
            cursor += length
        assert cursor == NUM_SLOTS
        holes = self.alloc.holes()
        for (s1, l1), (s2, _) in itertools.pairwise(holes):
            assert s1 + l1 < s2, "adjacent holes are coalesced"
        assert self.alloc.num_reserved_slots == sum(n for _, n in self.ranges.values())


ContiguousMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
TestContiguousAllocator = ContiguousMachine.TestCase


@given(total=st.integers(1, 5000), max_len=st.integers(1, 8192))
def test_reservation_rules(total: int, max_len: int) -> None:
    assert reservation_slots("max", total, max_len) == max_len
    assert reservation_slots("oracle", total, max_len) == total
    pow2 = reservation_slots("pow2", total, max_len)
    if total <= max_len:
        assert pow2 == min(max_len, 1 << (total - 1).bit_length())
        assert pow2 >= total or pow2 == max_len
        assert pow2 < 2 * total or pow2 == max_len


def test_external_fragmentation_is_holes_too_small_for_the_next_request() -> None:
    config = CacheConfig(
        num_blocks=16,
        block_size=16,
        memory_model="contiguous",
        reservation="oracle",
        max_model_len=4096,
    )
    kv = ContiguousKVManager(config)  # 256 slots
    requests = [Request(str(i), 0.0, 40, 24) for i in range(4)]  # 64 slots each
    for i, request in enumerate(requests):
        request.seq_ids = request.live_seq_ids = [i]
        request.internal_idx = i
        kv.admit(request, 40, ())
    kv.free(requests[1])  # a 64-slot hole between two ranges
    kv.free(requests[3])  # and 64 free slots at the end (coalesced)
    big = Request("big", 0.0, 100, 28)  # needs 128 slots: no hole fits it
    snap = kv.snapshot(big)
    assert snap.external_fragmentation_slots == 128
    assert snap.real_token_slots == 80
    assert snap.reservation_waste_slots == 2 * 64 - 80
    small = Request("small", 0.0, 10, 10)
    assert kv.snapshot(small).external_fragmentation_slots == 0
