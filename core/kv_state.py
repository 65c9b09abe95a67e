"""A read-only copy of a KV memory manager's state (``KVState``), for comparing two runs
of the same workload block for block (fast-forward against step by step, in tests)."""

from __future__ import annotations

from dataclasses import dataclass

SeqBlocks = tuple[tuple[int, tuple[int, ...]], ...]  # (seq_id, block ids), by seq_id


@dataclass(frozen=True, slots=True)
class KVState:
    """Everything that decides what a memory manager does next, as plain values.

    Paged memory fills every field. ``block_tables`` and ``swapped_tables`` hold block ids;
    ``eviction_order`` lists cached-free blocks, first evicted first; ``prefix_cache`` holds
    (content key, block id) pairs; ``committed_blocks`` counts the full blocks of each
    sequence already registered in the prefix cache. Contiguous memory reports each
    sequence's reservation as a two-entry table ``(start slot, num slots)``, its holes as
    ``free_ranges`` and leaves the block-only fields empty.
    """

    num_free_blocks: int
    ref_counts: tuple[int, ...]
    block_tables: SeqBlocks
    num_tokens: tuple[tuple[int, int], ...]  # (seq_id, tokens held), by seq_id
    prefix_cache: frozenset[tuple[int, int]] = frozenset()
    eviction_order: tuple[int, ...] = ()
    committed_blocks: tuple[tuple[int, int], ...] = ()
    swapped_tables: SeqBlocks = ()
    cpu_ref_counts: tuple[int, ...] = ()
    num_free_cpu_blocks: int = 0
    free_ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.num_free_blocks < 0:
            raise ValueError(f"num_free_blocks must be >= 0, got {self.num_free_blocks!r}")
