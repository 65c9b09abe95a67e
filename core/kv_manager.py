"""Request-level KV memory managers the scheduler drives: the protocol, and its paged version
(block tables over ``BlockAllocator``, prefix caching, fork, swap, watermark)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from core.block_allocator import BlockAllocator, BlockPair, OutOfBlocksError
from core.config import CacheConfig
from core.kv_state import KVState
from core.memory import MemorySnapshot
from core.prefix_cache import SequenceKeys
from core.request import Request

RangeCopy = tuple[int, int, int]  # (src_slot, dst_slot, num_slots)


class KVCacheManager(Protocol):
    """What the scheduler needs from a memory model (``PagedKVManager``,
    ``ContiguousKVManager``). ``positions`` count per sequence."""

    block_size: int

    def rejection_reason(self, request: Request) -> str | None: ...

    def prefix_hit_blocks(self, request: Request) -> Sequence[int]: ...

    def cached_prefix_tokens(self, request: Request) -> int: ...

    def can_admit(
        self, request: Request, num_positions: int, hits: Sequence[int], watermark: bool = True
    ) -> bool:
        """Room for ``num_positions`` after ``hits``; ``watermark``: keep the watermark free
        too (vLLM keeps it only while some request runs)."""
        ...

    def admit(self, request: Request, num_positions: int, hits: Sequence[int]) -> None: ...

    def can_grow(self, request: Request, num_positions: int) -> bool: ...

    def grow_in_place(self, seq_id: int) -> bool:
        """Add one token to ``seq_id`` if that needs no new block and no copy (else change
        nothing and return False)."""
        ...

    def try_grow(self, request: Request, num_positions: int) -> list[BlockPair] | None:
        """Grow like ``grow`` if there is room, else change nothing and return None."""
        ...

    def grow(self, request: Request, num_positions: int) -> list[BlockPair]: ...

    def take_range_copies(self, request: Request) -> list[RangeCopy]: ...

    def fork(self, request: Request) -> None: ...

    def free_sequence(self, request: Request, seq_id: int) -> None: ...

    def free(self, request: Request) -> None: ...

    def can_swap_out(self, request: Request) -> bool: ...

    def swap_out(self, request: Request) -> list[BlockPair]: ...

    def can_swap_in(self, request: Request, num_positions: int, watermark: bool = True) -> bool: ...

    def swap_in(self, request: Request) -> list[BlockPair]: ...

    def commit(self, request: Request, num_tokens: int) -> None:
        """Register the full blocks among the first ``num_tokens`` tokens of each of the
        request's sequences in the prefix cache (their content must be known)."""
        ...

    def block_tables(self, request: Request) -> tuple[Sequence[int], ...]: ...

    def snapshot(self, next_waiting: Request | None) -> MemorySnapshot: ...

    def state(self) -> KVState:
        """A read-only copy of the whole memory state (for comparing runs)."""
        ...


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class PagedKVManager:
    """Paged memory (PagedAttention): one block table per live sequence of a request."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        # vLLM's BlockPool takes one block as its null block: the allocator gets the rest.
        self.allocator = BlockAllocator(
            config.num_usable_blocks, config.block_size, config.num_cpu_blocks
        )
        self.watermark_blocks = config.watermark_blocks
        self.prefix_caching = config.enable_prefix_caching
        self._keys: dict[int, SequenceKeys] = {}  # seq_id -> keys of its cached full blocks
        self._lookup_keys: dict[int, SequenceKeys] = {}  # internal_idx -> lookup keys

    def grow_in_place(self, seq_id: int) -> bool:
        return self.allocator.append_in_place(seq_id)

    def max_blocks_needed(self, request: Request) -> int:
        """Blocks the request holds at its largest: shared full prompt blocks + per-sample rest."""
        bs = self.block_size
        shared = request.num_prompt_tokens // bs if request.n > 1 else 0
        per_sample = _blocks(request.max_total_tokens, bs) - shared
        return shared + request.n * per_sample

    def rejection_reason(self, request: Request) -> str | None:
        need = self.max_blocks_needed(request)
        # Only what could never fit, even alone: the watermark is kept only while something
        # runs, so an idle cache admits a request into all of its usable blocks.
        usable = self.config.num_usable_blocks
        if need > usable:
            return (
                f"needs {need} KV blocks of {self.block_size} tokens at its longest, but the cache "
                f"has {usable} usable blocks ({self.config.num_blocks} minus the null block)"
            )
        return None

    # -- admission and growth -------------------------------------------------------------

    def prefix_hit_blocks(self, request: Request) -> Sequence[int]:
        if not self.prefix_caching or request.num_computed_tokens:
            return ()
        # Every known token may hit (after a recompute preemption, outputs too) except the
        # last one, whose logits are needed to sample the next token.
        known = request.num_prompt_tokens if request.n > 1 else request.num_tokens
        max_blocks = (known - 1) // self.block_size
        keys = self._lookup_keys.get(request.internal_idx)
        if keys is None:
            keys = self._lookup_keys[request.internal_idx] = SequenceKeys()
        output_ids = request.output_token_ids.get(request.seq_ids[0], ())
        keys.extend_to(max_blocks, request, self.block_size, 0, output_ids)
        return self.allocator.match_prefix(keys.keys[:max_blocks])

    def cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens of a (not yet added) request this cache holds now: read-only."""
        if not self.prefix_caching:
            return 0
        keys = SequenceKeys()
        keys.extend_to(
            (request.num_prompt_tokens - 1) // self.block_size, request, self.block_size, 0, ()
        )
        return len(self.allocator.match_prefix(keys.keys)) * self.block_size

    def can_admit(
        self, request: Request, num_positions: int, hits: Sequence[int], watermark: bool = True
    ) -> bool:
        num_tokens = len(hits) * self.block_size + num_positions
        need = self.allocator.num_blocks_to_allocate(num_tokens, hits)
        keep = self.watermark_blocks if watermark else 0
        return self.allocator.num_free_blocks - need >= keep

    def admit(self, request: Request, num_positions: int, hits: Sequence[int]) -> None:
        seq_id = request.live_seq_ids[0]
        num_tokens = len(hits) * self.block_size + num_positions
        self.allocator.allocate(seq_id, num_tokens, hits)
        if self.prefix_caching:
            # A request admitted without a lookup (KV transferred in) has no lookup keys.
            lookup = self._lookup_keys.get(request.internal_idx)
            self._keys[seq_id] = SequenceKeys(
                lookup.keys[: len(hits)] if lookup is not None else None
            )

    def _blocks_to_grow(self, request: Request, num_positions: int) -> int:
        alloc = self.allocator
        need = 0
        shared_tails: dict[int, int] = {}
        for seq_id in request.active_seq_ids:
            num_tokens = alloc.num_tokens(seq_id)
            table = alloc.block_table(seq_id)
            need += _blocks(num_tokens + num_positions, self.block_size) - len(table)
            if num_tokens % self.block_size:
                shared_tails[table[-1]] = shared_tails.get(table[-1], 0) + 1
        for block_id, holders in shared_tails.items():
            # Each holder but the last copies; the last writes in place if no one else holds it.
            if alloc.ref_count(block_id) > 1:
                need += holders if alloc.ref_count(block_id) > holders else holders - 1
        return need

    def can_grow(self, request: Request, num_positions: int) -> bool:
        return self._blocks_to_grow(request, num_positions) <= self.allocator.num_free_blocks

    def try_grow(self, request: Request, num_positions: int) -> list[BlockPair] | None:
        if request.forked and len(request.live_seq_ids) > 1:
            if not self.can_grow(request, num_positions):
                return None
            return self.grow(request, num_positions)
        try:  # one sequence: append_slots checks and changes nothing on failure
            return self.allocator.append_slots(request.live_seq_ids[0], num_positions)
        except OutOfBlocksError:
            return None

    def grow(self, request: Request, num_positions: int) -> list[BlockPair]:
        if not request.forked:  # one sequence holds blocks
            return self.allocator.append_slots(request.live_seq_ids[0], num_positions)
        copies: list[BlockPair] = []
        for seq_id in request.live_seq_ids:
            copies.extend(self.allocator.append_slots(seq_id, num_positions))
        return copies

    def take_range_copies(self, request: Request) -> list[RangeCopy]:
        return []

    def fork(self, request: Request) -> None:
        parent = request.live_seq_ids[0]
        for child in request.live_seq_ids[1:]:
            self.allocator.fork(parent, child)
            if self.prefix_caching:
                self._keys[child] = self._keys[parent].copy()

    # -- release ----------------------------------------------------------------------------

    def free_sequence(self, request: Request, seq_id: int) -> None:
        if self.allocator.has_table(seq_id) or self.allocator.is_swapped(seq_id):
            self.allocator.free(seq_id)
        self._keys.pop(seq_id, None)

    def free(self, request: Request) -> None:
        for seq_id in request.seq_ids:
            self.free_sequence(request, seq_id)
        if request.status.is_done:
            self._lookup_keys.pop(request.internal_idx, None)

    # -- swapping ---------------------------------------------------------------------------

    def can_swap_out(self, request: Request) -> bool:
        return self.allocator.can_swap_out(request.active_seq_ids)

    def swap_out(self, request: Request) -> list[BlockPair]:
        return self.allocator.swap_out(request.active_seq_ids)

    def can_swap_in(self, request: Request, num_positions: int, watermark: bool = True) -> bool:
        """Room to bring the request back and then grow it by ``num_positions``."""
        alloc = self.allocator
        bs = self.block_size
        seq_ids = request.active_seq_ids
        tables = [alloc.cpu_block_table(s) for s in seq_ids]
        need = len({b for table in tables for b in table})
        tails: dict[int, int] = {}
        for seq_id, table in zip(seq_ids, tables, strict=True):
            num_tokens = alloc.num_tokens(seq_id)
            need += _blocks(num_tokens + num_positions, bs) - len(table)
            if num_tokens % bs:
                tails[table[-1]] = tails.get(table[-1], 0) + 1
        # Swapped blocks belong to this request alone: every holder of a shared tail but the
        # last copies it.
        need += sum(holders - 1 for holders in tails.values())
        return alloc.num_free_blocks - need >= (self.watermark_blocks if watermark else 0)

    def swap_in(self, request: Request) -> list[BlockPair]:
        return self.allocator.swap_in(request.active_seq_ids)

    # -- prefix cache and views -----------------------------------------------------------

    def commit(self, request: Request, num_tokens: int) -> None:
        """Register the full blocks among the first ``num_tokens`` tokens of each sequence.

        Called when a step is scheduled, as vLLM's ``allocate_slots`` calls ``cache_blocks``:
        a block whose tokens are all known and computed by this step's end is in the cache
        already, so a request admitted later in the same step hits it.
        """
        if not self.prefix_caching:
            return
        full = num_tokens // self.block_size
        for sample_idx, seq_id in enumerate(request.seq_ids):
            keys = self._keys.get(seq_id)
            if keys is None or not self.allocator.has_table(seq_id):
                continue
            done = len(keys.keys)
            if done >= full:
                continue
            output_ids = request.output_token_ids.get(seq_id, ())
            keys.extend_to(full, request, self.block_size, sample_idx, output_ids)
            for block_idx in range(done, full):
                self.allocator.cache_block(seq_id, block_idx, keys.keys[block_idx])

    def block_tables(self, request: Request) -> tuple[Sequence[int], ...]:
        return tuple(self.allocator.block_table(s) for s in request.active_seq_ids)

    def state(self) -> KVState:
        committed = tuple(sorted((s, len(keys.keys)) for s, keys in self._keys.items()))
        return replace(self.allocator.state(), committed_blocks=committed)

    def snapshot(self, next_waiting: Request | None) -> MemorySnapshot:
        alloc = self.allocator
        bs = self.block_size
        cached = alloc.num_cached_free_blocks
        return MemorySnapshot(
            total_slots=alloc.num_blocks * bs,
            real_token_slots=alloc.num_filled_slots,
            internal_fragmentation_slots=alloc.num_used_blocks * bs - alloc.num_filled_slots,
            reservation_waste_slots=0,
            cached_free_slots=cached * bs,
            external_fragmentation_slots=0,
            free_slots=(alloc.num_free_blocks - cached) * bs,
            shared_saved_slots=alloc.num_shared_refs * bs,
        )
