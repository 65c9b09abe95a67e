"""The pre-PagedAttention baseline: each sequence reserves one contiguous range of token slots,
sized by Orca's Max / Pow2 / Oracle rule and placed first-fit, so external fragmentation is
real. ``ContiguousKVManager`` adapts it to the scheduler's ``KVCacheManager`` protocol."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from core.block_allocator import BlockPair, OutOfBlocksError
from core.config import CacheConfig, ReservationRule
from core.kv_manager import RangeCopy
from core.kv_state import KVState
from core.memory import MemorySnapshot
from core.request import Request


def reservation_slots(rule: ReservationRule, total_tokens: int, max_model_len: int) -> int:
    """Slots one sequence reserves: ``max`` the model's max length, ``pow2`` the next power of
    two of its final length (capped at the max length), ``oracle`` exactly its final length."""
    if rule == "max":
        return max_model_len
    if rule == "pow2":
        return min(1 << (total_tokens - 1).bit_length(), max_model_len)
    return total_tokens


class ContiguousAllocator:
    """First-fit placement of ranges in a slot space of ``num_slots`` slots."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be > 0, got {num_slots!r}")
        self.num_slots = num_slots
        self._hole_starts: list[int] = [0]  # sorted; holes never touch (they are coalesced)
        self._hole_sizes: list[int] = [num_slots]
        self._ranges: dict[int, tuple[int, int]] = {}  # owner -> (start, num_slots)
        self.num_reserved_slots = 0

    def ranges(self) -> dict[int, tuple[int, int]]:
        return dict(self._ranges)

    def holes(self) -> list[tuple[int, int]]:
        return list(zip(self._hole_starts, self._hole_sizes, strict=True))

    def hole_sizes(self) -> list[int]:
        return list(self._hole_sizes)

    def clone(self) -> ContiguousAllocator:
        twin = ContiguousAllocator(self.num_slots)
        twin._hole_starts = list(self._hole_starts)
        twin._hole_sizes = list(self._hole_sizes)
        twin._ranges = dict(self._ranges)
        twin.num_reserved_slots = self.num_reserved_slots
        return twin

    def range_of(self, owner: int) -> tuple[int, int]:
        return self._ranges[owner]

    def find_fit(self, num_slots: int) -> int | None:
        for start, size in zip(self._hole_starts, self._hole_sizes, strict=True):
            if size >= num_slots:
                return start
        return None

    def reserve(self, owner: int, num_slots: int) -> int:
        """Reserve ``num_slots`` for ``owner`` in the first hole large enough; returns start."""
        if owner in self._ranges:
            raise ValueError(f"owner {owner} already holds a range")
        if num_slots <= 0:
            raise ValueError(f"num_slots must be > 0, got {num_slots!r}")
        for i, size in enumerate(self._hole_sizes):
            if size >= num_slots:
                start = self._hole_starts[i]
                if size == num_slots:
                    del self._hole_starts[i], self._hole_sizes[i]
                else:
                    self._hole_starts[i] += num_slots
                    self._hole_sizes[i] -= num_slots
                self._ranges[owner] = (start, num_slots)
                self.num_reserved_slots += num_slots
                return start
        raise OutOfBlocksError(f"no contiguous hole of {num_slots} slots")

    def release(self, owner: int) -> None:
        start, size = self._ranges.pop(owner)
        self.num_reserved_slots -= size
        i = bisect.bisect_left(self._hole_starts, start)
        # Coalesce with the hole after, then the hole before.
        if i < len(self._hole_starts) and self._hole_starts[i] == start + size:
            size += self._hole_sizes[i]
            del self._hole_starts[i], self._hole_sizes[i]
        if i > 0 and self._hole_starts[i - 1] + self._hole_sizes[i - 1] == start:
            self._hole_sizes[i - 1] += size
        else:
            self._hole_starts.insert(i, start)
            self._hole_sizes.insert(i, size)


class ContiguousKVManager:
    """Contiguous reservations: one range per sample, reserved whole at admission.

    A reservation covers the sequence's final length, so growth never fails and nothing is
    ever preempted or swapped. With ``n > 1`` every sample reserves its own range and the
    prompt is copied into the others at the fork (returned as slot-range copies).
    """

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.allocator = ContiguousAllocator(config.num_slots)
        self._tokens: dict[int, int] = {}  # seq_id -> slots holding tokens
        self.num_token_slots = 0
        self._pending_copies: dict[int, list[RangeCopy]] = {}
        self._max_model_len = config.resolved_max_model_len

    def _slots(self, request: Request) -> int:
        rule = self.config.reservation
        return reservation_slots(rule, request.max_total_tokens, self._max_model_len)

    def rejection_reason(self, request: Request) -> str | None:
        need = self._slots(request) * request.n
        if need > self.allocator.num_slots:
            return (
                f"needs {need} contiguous KV slots ({self.config.reservation} reservation x "
                f"{request.n} samples), but the cache has {self.allocator.num_slots}"
            )
        return None

    def prefix_hit_blocks(self, request: Request) -> Sequence[int]:
        return ()

    def cached_prefix_tokens(self, request: Request) -> int:
        return 0

    def can_admit(
        self, request: Request, num_positions: int, hits: Sequence[int], watermark: bool = True
    ) -> bool:
        size = self._slots(request)
        if request.n == 1:
            return self.allocator.find_fit(size) is not None
        # Try the placement on a scratch copy: several ranges interact.
        scratch = self.allocator.clone()
        try:
            for seq_id in request.live_seq_ids:
                scratch.reserve(seq_id, size)
        except OutOfBlocksError:
            return False
        return True

    def admit(self, request: Request, num_positions: int, hits: Sequence[int]) -> None:
        size = self._slots(request)
        for seq_id in request.live_seq_ids:
            self.allocator.reserve(seq_id, size)
            self._tokens[seq_id] = 0
        self._add_tokens(request.live_seq_ids[0], num_positions)

    def _add_tokens(self, seq_id: int, num_tokens: int) -> None:
        self._tokens[seq_id] += num_tokens
        self.num_token_slots += num_tokens

    def can_grow(self, request: Request, num_positions: int) -> bool:
        return True

    def grow_in_place(self, seq_id: int) -> bool:
        self._add_tokens(seq_id, 1)
        return True

    def try_grow(self, request: Request, num_positions: int) -> list[BlockPair] | None:
        return self.grow(request, num_positions)

    def grow(self, request: Request, num_positions: int) -> list[BlockPair]:
        for seq_id in request.active_seq_ids:
            self._add_tokens(seq_id, num_positions)
        return []

    def take_range_copies(self, request: Request) -> list[RangeCopy]:
        return self._pending_copies.pop(request.internal_idx, [])

    def fork(self, request: Request) -> None:
        parent = request.live_seq_ids[0]
        src, _ = self.allocator.range_of(parent)
        copies = []
        for child in request.live_seq_ids[1:]:
            dst, _ = self.allocator.range_of(child)
            copies.append((src, dst, self._tokens[parent]))
            self._add_tokens(child, self._tokens[parent] - self._tokens[child])
        self._pending_copies[request.internal_idx] = copies

    def free_sequence(self, request: Request, seq_id: int) -> None:
        if seq_id in self._tokens:
            self.num_token_slots -= self._tokens.pop(seq_id)
            self.allocator.release(seq_id)

    def free(self, request: Request) -> None:
        for seq_id in request.seq_ids:
            self.free_sequence(request, seq_id)
        self._pending_copies.pop(request.internal_idx, None)

    def can_swap_out(self, request: Request) -> bool:
        return False

    def swap_out(self, request: Request) -> list[BlockPair]:
        raise OutOfBlocksError("contiguous memory does not swap")

    def can_swap_in(self, request: Request, num_positions: int, watermark: bool = True) -> bool:
        return False

    def swap_in(self, request: Request) -> list[BlockPair]:
        raise OutOfBlocksError("contiguous memory does not swap")

    def commit(self, request: Request, num_tokens: int) -> None:
        return None

    def block_tables(self, request: Request) -> tuple[Sequence[int], ...]:
        return ()

    def slot_ranges(self, request: Request) -> tuple[tuple[int, int], ...]:
        return tuple(self.allocator.range_of(s) for s in request.active_seq_ids)

    def state(self) -> KVState:
        alloc = self.allocator
        return KVState(
            num_free_blocks=(alloc.num_slots - alloc.num_reserved_slots) // self.block_size,
            ref_counts=(),
            block_tables=tuple(sorted(alloc.ranges().items())),
            num_tokens=tuple(sorted(self._tokens.items())),
            free_ranges=tuple(alloc.holes()),
        )

    def snapshot(self, next_waiting: Request | None) -> MemorySnapshot:
        alloc = self.allocator
        free = alloc.num_slots - alloc.num_reserved_slots
        external = 0
        if next_waiting is not None:
            need = self._slots(next_waiting)
            external = sum(size for size in alloc.hole_sizes() if size < need)
        return MemorySnapshot(
            total_slots=alloc.num_slots,
            real_token_slots=self.num_token_slots,
            internal_fragmentation_slots=0,
            reservation_waste_slots=alloc.num_reserved_slots - self.num_token_slots,
            cached_free_slots=0,
            external_fragmentation_slots=external,
            free_slots=free - external,
            shared_saved_slots=0,
        )
