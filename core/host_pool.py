"""The host side of swapping: the CPU blocks that swapped-out sequences' KV moves to, and the
tables of those sequences. ``BlockAllocator`` owns one and moves blocks in and out of it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from core.errors import OutOfBlocksError


def count_holders(tables: Iterable[Sequence[int]]) -> dict[int, int]:
    """How many of ``tables`` hold each block, by block id in first-seen order."""
    counts: dict[int, int] = {}
    for table in tables:
        for block_id in table:
            counts[block_id] = counts.get(block_id, 0) + 1
    return counts


class HostBlockPool:
    """CPU blocks with ref counts (a block shared by sequences swapped out together stays
    shared), what each holds (its fill and prefix-cache key, for swapping back in) and the
    swapped sequences' tables."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.fill = [0] * num_blocks
        self.key: list[int | None] = [None] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self.tables: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def store(
        self,
        seq_ids: Sequence[int],
        tables: Sequence[Sequence[int]],
        fill: Sequence[int],
        key: Sequence[int | None],
    ) -> list[tuple[int, int]]:
        """Copy the GPU ``tables`` of ``seq_ids`` (each block's ``fill`` and ``key`` given by
        GPU block id) into host blocks: a block shared among them stays shared. Returns the
        ``(gpu_block, host_block)`` copies; OutOfBlocksError, changing nothing, if too few
        blocks are free."""
        counts = count_holders(tables)
        if len(counts) > len(self._free):
            raise OutOfBlocksError(f"need {len(counts)} CPU blocks, {len(self._free)} free")
        mapping: dict[int, int] = {}
        for gpu_id, count in counts.items():
            block_id = mapping[gpu_id] = self._free.pop()
            self.ref[block_id] = count
            self.fill[block_id] = fill[gpu_id]
            self.key[block_id] = key[gpu_id]
        for seq_id, table in zip(seq_ids, tables, strict=True):
            self.tables[seq_id] = [mapping[b] for b in table]
        return list(mapping.items())

    def release_table(self, seq_id: int) -> list[int]:
        """Drop ``seq_id``'s table (swapped in or freed) and its hold on each block; returns
        the table."""
        table = self.tables.pop(seq_id)
        for block_id in table:
            self.ref[block_id] -= 1
            if self.ref[block_id] == 0:
                self.fill[block_id] = 0
                self.key[block_id] = None
                self._free.append(block_id)
        return table
