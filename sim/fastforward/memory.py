"""What a run of repeated steps does to KV memory, computed without applying it: how many
steps everyone can grow (``growth_capacity``), whether the waiting head fits afterwards
(``can_admit_after``) and the summed memory snapshots (``repeat_memory_sum``), for paged and
contiguous memory alike (``run_memory``)."""

from __future__ import annotations

from collections.abc import Sequence

from core.contiguous_allocator import ContiguousKVManager
from core.kv_manager import KVCacheManager, PagedKVManager
from core.memory import MemorySnapshot
from core.request import Request
from sim.fastforward.growth import UNBOUNDED, ChunkRun, RepeatShape, RequestGrowth


class RunMemory:
    """A memory manager seen by fast-forward: read-only sums over a planned run
    (``PagedRunMemory``, ``ContiguousRunMemory``). A base class rather than a protocol: a
    compiled build (docs/compiled_core.md) calls its methods directly."""

    def growth_capacity(
        self, growth: Sequence[RequestGrowth], limit: int, shape: RepeatShape | None = None
    ) -> int:
        """The most steps (up to ``limit``) in which every request of ``growth`` can grow
        together without running out of memory (no copy-on-write pending); ``shape``, when
        given, is the same growth in aggregate."""
        raise NotImplementedError

    def can_admit_after(
        self,
        request: Request,
        num_positions: int,
        hits: Sequence[int],
        growth: Sequence[RequestGrowth],
        steps: int,
        shape: RepeatShape | None = None,
    ) -> bool:
        """``can_admit`` once every request of ``growth`` (``shape`` in aggregate, when
        given) has grown ``steps`` more times (computed, not applied). May answer True when
        unsure (callers use it to rule admission out)."""
        raise NotImplementedError

    def repeat_memory_sum(
        self,
        growth: Sequence[RequestGrowth],
        count: int,
        next_waiting: Request | None,
        shape: RepeatShape | None = None,
    ) -> MemorySnapshot:
        """The sum of the snapshots ``count`` repeated steps would take, each after growing
        every request of ``growth`` once more (computed, not applied); ``shape``, when
        given, is the same growth in aggregate."""
        raise NotImplementedError


def run_memory(kv: KVCacheManager) -> RunMemory:
    """The run sums for ``kv``'s memory model."""
    if isinstance(kv, PagedKVManager):
        return PagedRunMemory(kv)
    if isinstance(kv, ContiguousKVManager):
        return ContiguousRunMemory(kv)
    raise TypeError(f"no run sums for memory manager {type(kv).__name__}")


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlocksTaken:
    """The blocks that ``k`` steps of ``shape`` take from the free pool, as a function of k
    (``after``): O(1) per step count for the decodes. (An object, not a closure: a compiled
    build, docs/compiled_core.md, makes each closure a reference cycle that only the garbage
    collector frees, and one is made for most planned runs.)

    A decoding sequence holding t tokens starts a block in repeat i (0 = the first) when
    (t + i) is a multiple of the block size, so every bs repeats each one starts exactly
    one block; ``starts[i]`` counts those started in repeats 0 .. i-1 of a cycle.
    """

    __slots__ = ("block_size", "chunks", "decodes", "starts")

    def __init__(self, shape: RepeatShape, block_size: int) -> None:
        bs = block_size
        by_step = [0] * bs
        for phase, count in enumerate(shape.decode_phases):
            by_step[-phase % bs] += count
        self.block_size = bs
        # (a loop: ``accumulate`` into a list is a generic iteration in a compiled build)
        starts = [0] * (bs + 1)
        running = 0
        for i in range(bs):
            running += by_step[i]
            starts[i + 1] = running
        self.starts = starts
        self.decodes = shape.decode_seqs
        self.chunks = [
            (held, per_step, left, seqs, _blocks(held, bs))
            for per_step, held, left, seqs in shape.chunks
        ]

    def after(self, k: int) -> int:
        """Blocks taken by the first ``k`` steps."""
        bs = self.block_size
        cycles, rest = divmod(k, bs)
        total = cycles * self.decodes + self.starts[rest]
        for held, per_step, left, seqs, blocks in self.chunks:
            total += (_blocks(held + min(per_step * k, left), bs) - blocks) * seqs
        return total


class PagedRunMemory(RunMemory):
    """Run sums over paged memory, read from its allocator's counters."""

    def __init__(self, kv: PagedKVManager) -> None:
        self.allocator = kv.allocator
        self.block_size = kv.block_size
        self.watermark_blocks = kv.watermark_blocks
        self.prefix_caching = kv.prefix_caching

    def growth_capacity(
        self, growth: Sequence[RequestGrowth], limit: int, shape: RepeatShape | None = None
    ) -> int:
        bs = self.block_size
        free = self.allocator.num_free_blocks
        if shape is None:
            shape = self.shape_of(growth)
        # Enough room even if every sequence started a block in every step: no search.
        bound = shape.decode_seqs * (-(-limit // bs) + 1)
        for per_step, _, _, seqs in shape.chunks:
            bound += (-(-per_step * limit // bs) + 1) * seqs
        if bound <= free:
            return limit
        need = BlocksTaken(shape, bs)
        if need.after(limit) <= free:
            return limit
        lo, hi = 0, limit  # need.after(lo) <= free < need.after(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need.after(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def shape_of(self, growth: Sequence[RequestGrowth]) -> RepeatShape:
        """The aggregate shape of ``growth`` from the tokens each active sequence holds now
        (planning gathers the same as it goes; this serves callers that have only the
        per-request growth, so that every sum below has one implementation)."""
        alloc = self.allocator
        bs = self.block_size
        phases = [0] * bs
        decode_seqs = decode_tokens = 0
        chunks: list[ChunkRun] = []
        for request, per_step, left in growth:
            for seq_id in request.active_seq_ids:
                held = alloc.num_tokens(seq_id)
                if left == UNBOUNDED:
                    decode_seqs += 1
                    decode_tokens += held
                    phases[held % bs] += 1
                else:
                    chunks.append((per_step, held, left, 1))
        return RepeatShape(decode_seqs, decode_tokens, tuple(phases), tuple(chunks))

    def can_admit_after(
        self,
        request: Request,
        num_positions: int,
        hits: Sequence[int],
        growth: Sequence[RequestGrowth],
        steps: int,
        shape: RepeatShape | None = None,
    ) -> bool:
        if self.prefix_caching:
            return True  # growth may evict cached blocks and change the hits: assume it fits
        taken = BlocksTaken(shape or self.shape_of(growth), self.block_size).after(steps)
        num_tokens = len(hits) * self.block_size + num_positions
        need = self.allocator.num_blocks_to_allocate(num_tokens, hits)
        return self.allocator.num_free_blocks - taken - need >= self.watermark_blocks

    def repeat_memory_sum(
        self,
        growth: Sequence[RequestGrowth],
        count: int,
        next_waiting: Request | None,
        shape: RepeatShape | None = None,
    ) -> MemorySnapshot:
        alloc = self.allocator
        bs = self.block_size
        if shape is None:
            shape = self.shape_of(growth)
        chunks: list[tuple[int, int, int]] = []  # (tokens held, per step, left) of the rest
        # One-position sequences by tokens held, modulo the block size.
        by_phase = list(shape.decode_phases)
        decodes = shape.decode_seqs
        for per_step, held, left, seqs in shape.chunks:
            if per_step == 1 and left > count:
                by_phase[held % bs] += seqs
                decodes += seqs
            else:
                chunks.extend([(held, per_step, left)] * seqs)
        cached0 = alloc.num_cached_free_blocks
        free0 = alloc.num_free_blocks - cached0
        if not chunks:
            real, internal, cached, free = self._decode_memory_sums(
                by_phase, decodes, count, cached0, free0
            )
        else:
            real = internal = cached = free = 0
            new_blocks = 0
            for step in range(count):
                # A decoding sequence holding a multiple of bs tokens starts a block each step.
                new_blocks += by_phase[(-step) % bs]
                added = (step + 1) * decodes
                for held, per_step, left in chunks:
                    before, after = min(step * per_step, left), min((step + 1) * per_step, left)
                    new_blocks += _blocks(held + after, bs) - _blocks(held + before, bs)
                    added += after
                used = alloc.num_used_blocks + new_blocks
                step_real = alloc.num_filled_slots + added
                real += step_real
                internal += used * bs - step_real
                cached += (cached0 - max(0, new_blocks - free0)) * bs
                free += max(0, free0 - new_blocks) * bs
        if shape.admit_step < count:
            # The last step also holds the admitted head's first chunk (taken from uncached
            # free blocks: admission is folded in only without prefix caching).
            assert cached0 == 0, "admission folded into a repeat with cached-free blocks"
            positions = shape.admit_positions
            taken = _blocks(positions, bs) * bs
            real += positions
            internal += taken - positions
            free -= taken
        return self._summed_snapshot(count, real, internal, cached, free)

    def _summed_snapshot(
        self, count: int, real: int, internal: int, cached: int, free: int
    ) -> MemorySnapshot:
        """The sum of ``count`` paged snapshots, given the summed slots of each varying part."""
        alloc, bs = self.allocator, self.block_size
        return MemorySnapshot(
            total_slots=alloc.num_blocks * bs * count,
            real_token_slots=real,
            internal_fragmentation_slots=internal,
            reservation_waste_slots=0,
            cached_free_slots=cached,
            external_fragmentation_slots=0,
            free_slots=free,
            shared_saved_slots=alloc.num_shared_refs * bs * count,
        )

    def _decode_memory_sums(
        self, by_phase: list[int], decodes: int, count: int, cached0: int, free0: int
    ) -> tuple[int, int, int, int]:
        """(real, internal, cached-free, free) slots summed over ``count`` steps in which every
        sequence decodes one position, in closed form over the running count of new blocks
        (no loop over steps in Python)."""
        alloc = self.allocator
        bs = self.block_size
        # Step k starts a block for the sequences in phase (-k) % bs: 0, bs-1, ..., 1, 0, ...
        # (loops, not ``accumulate`` and ``sum``: builtins over iterators that a compiled
        # build calls generically)
        # ``running``: blocks added up to and including each step, never decreasing. Uncached
        # free blocks are taken first, then cached-free ones are evicted: ``below`` counts the
        # steps that still had uncached free blocks (running < free0, a prefix of the steps).
        running = sum_new = below = sum_below = 0
        for step in range(count):
            running += by_phase[(-step) % bs]
            sum_new += running
            if running < free0:
                below += 1
                sum_below += running
        real = count * alloc.num_filled_slots + decodes * count * (count + 1) // 2
        internal = (count * alloc.num_used_blocks + sum_new) * bs - real
        free = (below * free0 - sum_below) * bs
        evicted = (sum_new - sum_below) - (count - below) * free0
        cached = (count * cached0 - evicted) * bs
        return real, internal, cached, free


class ContiguousRunMemory(RunMemory):
    """Run sums over contiguous reservations: growth stays inside them."""

    def __init__(self, kv: ContiguousKVManager) -> None:
        self.can_admit = kv.can_admit
        self.snapshot = kv.snapshot

    def growth_capacity(
        self, growth: Sequence[RequestGrowth], limit: int, shape: RepeatShape | None = None
    ) -> int:
        return limit  # reservations already cover every request's final length

    def can_admit_after(
        self,
        request: Request,
        num_positions: int,
        hits: Sequence[int],
        growth: Sequence[RequestGrowth],
        steps: int,
        shape: RepeatShape | None = None,
    ) -> bool:
        # Growth stays inside reservations: admission is decided by the ranges free now.
        return self.can_admit(request, num_positions, hits)

    def repeat_memory_sum(
        self,
        growth: Sequence[RequestGrowth],
        count: int,
        next_waiting: Request | None,
        shape: RepeatShape | None = None,
    ) -> MemorySnapshot:
        now = self.snapshot(next_waiting)
        # Real tokens grow inside the reservations; nothing else moves.
        added = 0
        for request, per_step, left in growth:
            if count * per_step <= left:  # never runs out: a closed form
                grown = per_step * count * (count + 1) // 2
            else:
                grown = sum(min((step + 1) * per_step, left) for step in range(count))
            added += grown * len(request.active_seq_ids)
        return MemorySnapshot(
            total_slots=now.total_slots * count,
            real_token_slots=now.real_token_slots * count + added,
            internal_fragmentation_slots=0,
            reservation_waste_slots=now.reservation_waste_slots * count - added,
            cached_free_slots=0,
            external_fragmentation_slots=now.external_fragmentation_slots * count,
            free_slots=now.free_slots * count,
            shared_saved_slots=0,
        )
