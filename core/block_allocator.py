"""Paged KV block allocator: ref-counted blocks, block tables, fork and copy-on-write,
a prefix cache of full blocks with LRU eviction, and a CPU pool for swapping."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import cast

from core.errors import OutOfBlocksError as OutOfBlocksError
from core.kv_state import KVState

BlockPair = tuple[int, int]


class BlockAllocator:
    """GPU blocks (plus an optional CPU pool) handed out to sequences.

    Every block is in exactly one of three states: *used* (``ref_count > 0``), *cached-free*
    (``ref_count == 0`` but holding the content of a prefix-cache entry, reusable on a hit and
    evicted least-recently-freed first) or *free*. Counters for the memory snapshot are kept
    incrementally, so no operation scans the whole pool.
    """

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0 or num_cpu_blocks < 0:
            raise ValueError(
                f"bad pool: num_blocks={num_blocks}, block_size={block_size}, "
                f"num_cpu_blocks={num_cpu_blocks}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        self._ref = [0] * num_blocks
        self._fill = [0] * num_blocks  # token slots written in each block
        self._key: list[int | None] = [None] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._key_to_block: dict[int, int] = {}
        # Further blocks caching a key that another block caches already (computed twice),
        # oldest first: as vLLM's BlockPool they stay cached, and one takes over the key when
        # the block holding it is evicted.
        self._duplicates: dict[int, list[int]] = {}
        # By sequence id (ids are small non-negative ints, handed out in order): a list
        # indexes faster than a dict, above all once compiled (no boxed key, no hash). None:
        # the sequence holds no GPU table (never had one, freed or swapped out).
        self._tables: list[list[int] | None] = []
        self._num_tokens: list[int] = []

        self._cpu_ref = [0] * num_cpu_blocks
        self._cpu_fill = [0] * num_cpu_blocks
        self._cpu_key: list[int | None] = [None] * num_cpu_blocks
        self._cpu_free = list(range(num_cpu_blocks - 1, -1, -1))
        self._cpu_tables: dict[int, list[int]] = {}

        self.num_used_blocks = 0
        self.num_filled_slots = 0  # written slots over used blocks (shared blocks once)
        self.num_shared_refs = 0  # sum of (ref_count - 1) over shared blocks
        self.num_evictions = 0

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free plus cached-free (evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._evictable)

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    def has_table(self, seq_id: int) -> bool:
        return 0 <= seq_id < len(self._tables) and self._tables[seq_id] is not None

    def is_swapped(self, seq_id: int) -> bool:
        return seq_id in self._cpu_tables

    def block_table(self, seq_id: int) -> Sequence[int]:
        return self._table(seq_id)

    def cpu_block_table(self, seq_id: int) -> Sequence[int]:
        return self._cpu_tables[seq_id]

    def num_tokens(self, seq_id: int) -> int:
        """Tokens ``seq_id`` holds, in its GPU table or swapped out."""
        if not self.has_table(seq_id) and seq_id not in self._cpu_tables:
            raise ValueError(f"sequence {seq_id} has no block table")
        return self._num_tokens[seq_id]

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_key(self, block_id: int) -> int | None:
        return self._key[block_id]

    def block_fill(self, block_id: int) -> int:
        return self._fill[block_id]

    def cached_block(self, key: int) -> int | None:
        return self._key_to_block.get(key)

    def prefix_cache(self) -> dict[int, int]:
        """A copy of the prefix cache: content key -> block id."""
        return dict(self._key_to_block)

    def state(self) -> KVState:
        """A read-only copy of every block's state (no ``committed_blocks``: the manager
        above knows those)."""
        return KVState(
            num_free_blocks=self.num_free_blocks,
            ref_counts=tuple(self._ref),
            block_tables=tuple((s, tuple(t)) for s, t in enumerate(self._tables) if t is not None),
            num_tokens=tuple(
                (s, n)
                for s, n in enumerate(self._num_tokens)
                if self._tables[s] is not None or s in self._cpu_tables
            ),
            prefix_cache=frozenset(self._key_to_block.items()),
            eviction_order=tuple(self._evictable),
            swapped_tables=tuple((s, tuple(t)) for s, t in sorted(self._cpu_tables.items())),
            cpu_ref_counts=tuple(self._cpu_ref),
            num_free_cpu_blocks=len(self._cpu_free),
        )

    def match_prefix(self, keys: Iterable[int]) -> list[int]:
        """Blocks holding the longest cached run of ``keys`` (read-only)."""
        hits: list[int] = []
        for key in keys:
            block_id = self._key_to_block.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_blocks_to_allocate(self, num_tokens: int, cached_blocks: Sequence[int] = ()) -> int:
        """Free-pool blocks a new table of ``num_tokens`` would consume (hits included)."""
        need = self._blocks_for(num_tokens)
        if not cached_blocks:  # (no hits: the common case, without a generator to start)
            return need
        revived = sum(1 for b in cached_blocks if self._ref[b] == 0)
        return need - len(cached_blocks) + revived

    def num_blocks_to_append(self, seq_id: int, num_new_tokens: int) -> int:
        """Free-pool blocks appending ``num_new_tokens`` would consume (copy-on-write included)."""
        table = self._table(seq_id)
        num_tokens = self._num_tokens[seq_id]
        shared_tail = num_tokens % self.block_size and self._ref[table[-1]] > 1
        cow = 1 if shared_tail and num_new_tokens else 0
        return cow + self._blocks_for(num_tokens + num_new_tokens) - len(table)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _table(self, seq_id: int) -> list[int]:
        """``seq_id``'s GPU block table; ValueError if it has none."""
        if 0 <= seq_id < len(self._tables):
            table = self._tables[seq_id]
            if table is not None:
                return table
        raise ValueError(f"sequence {seq_id} has no block table")

    def _set_table(self, seq_id: int, table: list[int], num_tokens: int) -> None:
        """Give ``seq_id`` (which has no GPU table) ``table`` holding ``num_tokens``."""
        tables = self._tables
        if seq_id >= len(tables):
            missing = seq_id + 1 - len(tables)
            tables.extend([None] * missing)
            self._num_tokens.extend([0] * missing)
        tables[seq_id] = table
        self._num_tokens[seq_id] = num_tokens

    def _no_table(self, seq_id: int) -> bool:
        """Whether ``seq_id`` holds no table, GPU or CPU (ValueError for a negative id)."""
        if seq_id < 0:
            raise ValueError(f"sequence ids are non-negative, got {seq_id}")
        return not self.has_table(seq_id) and seq_id not in self._cpu_tables

    # -- block life cycle ----------------------------------------------------------------

    def _take_block(self) -> int:
        if self._free:
            block_id = self._free.pop()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            key = self._key[block_id]
            assert key is not None
            self._uncache(block_id, key)
            self._key[block_id] = None
            self._fill[block_id] = 0
            self.num_evictions += 1
        self._ref[block_id] = 1
        self.num_used_blocks += 1
        return block_id

    def _uncache(self, block_id: int, key: int) -> None:
        """Drop ``block_id`` from the prefix cache (evicted); a duplicate takes over its key."""
        duplicates = self._duplicates.get(key)
        if self._key_to_block[key] == block_id:
            if duplicates:
                self._key_to_block[key] = duplicates.pop(0)
            else:
                del self._key_to_block[key]
        else:
            assert duplicates is not None
            duplicates.remove(block_id)
        if duplicates is not None and not duplicates:
            del self._duplicates[key]

    def _share(self, block_id: int) -> None:
        if self._ref[block_id] == 0:
            del self._evictable[block_id]
            self.num_used_blocks += 1
            self.num_filled_slots += self._fill[block_id]
        else:
            self.num_shared_refs += 1
        self._ref[block_id] += 1

    def _release(self, block_id: int) -> None:
        ref = self._ref[block_id]
        assert ref > 0, f"block {block_id} released with ref_count 0"
        self._ref[block_id] = ref - 1
        if ref > 1:
            self.num_shared_refs -= 1
            return
        self.num_used_blocks -= 1
        self.num_filled_slots -= self._fill[block_id]
        if self._key[block_id] is not None:
            self._evictable[block_id] = None
        else:
            self._fill[block_id] = 0
            self._free.append(block_id)

    def _write(self, table: list[int], num_tokens: int, num_new_tokens: int) -> None:
        """Give ``num_new_tokens`` slots after ``num_tokens``, adding blocks as needed."""
        bs = self.block_size
        left = num_new_tokens
        partial = num_tokens % bs
        if partial and left:
            add = min(bs - partial, left)
            tail = table[-1]
            self._fill[tail] = self._fill[tail] + add  # (typed: no generic in-place add)
            self.num_filled_slots += add
            left -= add
        if left and self._free:
            # Bulk path: whole blocks straight off the free stack, in the order pops give.
            take = min(-(-left // bs), len(self._free))
            blocks = self._free[-take:]
            del self._free[-take:]
            blocks.reverse()
            # (through the lists typed as holding objects, with 1 and bs boxed once: a
            # compiled build would box both again for every block)
            ref_objects = cast("list[object]", self._ref)
            fill_objects = cast("list[object]", self._fill)
            one: object = 1
            full: object = bs
            for block_id in blocks:
                ref_objects[block_id] = one
                fill_objects[block_id] = full
            fill = self._fill
            added = min(left, take * bs)
            fill[blocks[-1]] = added - (take - 1) * bs  # the last block may be partly filled
            left -= added
            self.num_used_blocks += take
            self.num_filled_slots += added
            table.extend(blocks)
        while left:
            block_id = self._take_block()
            add = min(bs, left)
            self._fill[block_id] = add
            self.num_filled_slots += add
            table.append(block_id)
            left -= add

    # -- sequence operations -------------------------------------------------------------

    def allocate(self, seq_id: int, num_tokens: int, cached_blocks: Sequence[int] = ()) -> None:
        """Create ``seq_id``'s table: ``cached_blocks`` (full prefix hits) then fresh blocks."""
        if not self._no_table(seq_id):
            raise ValueError(f"sequence {seq_id} already has a block table")
        if num_tokens < len(cached_blocks) * self.block_size:
            raise ValueError(f"{num_tokens} tokens cannot cover {len(cached_blocks)} cached blocks")
        need = self.num_blocks_to_allocate(num_tokens, cached_blocks)
        if need > self.num_free_blocks:
            raise OutOfBlocksError(f"need {need} blocks, {self.num_free_blocks} free")
        table: list[int] = []
        for block_id in cached_blocks:
            assert self._fill[block_id] == self.block_size and self._key[block_id] is not None
            self._share(block_id)
            table.append(block_id)
        hit_tokens = len(cached_blocks) * self.block_size
        self._write(table, hit_tokens, num_tokens - hit_tokens)
        self._set_table(seq_id, table, num_tokens)

    def append_slots(self, seq_id: int, num_new_tokens: int) -> list[BlockPair]:
        """Give ``seq_id`` slots for ``num_new_tokens`` more tokens.

        A shared, partly filled last block is never written: it is copied first and the
        returned ``(src, dst)`` pair names the copy the executor must make.
        """
        table = self._table(seq_id)
        num_tokens = self._num_tokens[seq_id]
        partial = num_tokens % self.block_size
        if partial and num_new_tokens <= self.block_size - partial and self._ref[table[-1]] == 1:
            # The common decode case: room in an exclusively held last block.
            tail = table[-1]
            self._fill[tail] = self._fill[tail] + num_new_tokens
            self.num_filled_slots += num_new_tokens
            self._num_tokens[seq_id] = num_tokens + num_new_tokens
            return []
        cow = partial and num_new_tokens and self._ref[table[-1]] > 1
        need = (1 if cow else 0) + self._blocks_for(num_tokens + num_new_tokens) - len(table)
        if need > len(self._free) + len(self._evictable):
            raise OutOfBlocksError(f"need {need} blocks, {self.num_free_blocks} free")
        copies: list[BlockPair] = []
        if cow:
            src = table[-1]
            dst = self._take_block()
            self._fill[dst] = self._fill[src]
            self.num_filled_slots += self._fill[dst]
            self._release(src)
            table[-1] = dst
            copies.append((src, dst))
        self._write(table, num_tokens, num_new_tokens)
        self._num_tokens[seq_id] = num_tokens + num_new_tokens
        return copies

    def append_in_place(self, seq_id: int) -> bool:
        """Append one token if the last block is held alone and has room; else do nothing and
        return False (the caller takes the general ``append_slots`` path)."""
        table = self._tables[seq_id] if seq_id >= 0 else None
        if table is None:
            raise ValueError(f"sequence {seq_id} has no block table")
        num_tokens = self._num_tokens[seq_id]
        if not num_tokens % self.block_size or self._ref[table[-1]] != 1:
            return False
        tail = table[-1]
        self._fill[tail] = self._fill[tail] + 1
        self.num_filled_slots += 1
        self._num_tokens[seq_id] = num_tokens + 1
        return True

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Give ``child_seq_id`` all of the parent's blocks, shared (ref_count + 1 each)."""
        if not self._no_table(child_seq_id):
            raise ValueError(f"sequence {child_seq_id} already has a block table")
        table = self._table(parent_seq_id)
        for block_id in table:
            self._share(block_id)
        self._set_table(child_seq_id, list(table), self._num_tokens[parent_seq_id])

    def free(self, seq_id: int) -> None:
        """Release every block of ``seq_id`` (GPU or CPU side); tail blocks evict first."""
        if seq_id in self._cpu_tables:
            for cpu_id in self._cpu_tables.pop(seq_id):
                self._release_cpu(cpu_id)
        else:
            table = self._table(seq_id)
            self._tables[seq_id] = None
            ref = self._ref
            if not self._key_to_block and (
                # (no block is shared anywhere: every used block's count is 1, no need to look)
                not self.num_shared_refs or list(map(ref.__getitem__, table)).count(1) == len(table)
            ):
                # The common case: every block held by this sequence alone, none cached. Its
                # blocks hold exactly its tokens; a free block's fill is never read (it is set
                # when the block is handed out again), so it is left as it is.
                ref_objects = cast("list[object]", ref)  # (0 boxed once: see _write)
                zero: object = 0
                for block_id in table:
                    ref_objects[block_id] = zero
                self.num_used_blocks -= len(table)
                self.num_filled_slots -= self._num_tokens[seq_id]
                table.reverse()
                self._free.extend(table)  # tail blocks first, as releasing one by one would
            else:
                for block_id in reversed(table):
                    self._release(block_id)
        self._num_tokens[seq_id] = 0

    def cache_block(self, seq_id: int, block_idx: int, key: int) -> bool:
        """Record that block ``block_idx`` of ``seq_id`` (full) holds the content ``key``.

        Returns False when another block already caches that content: the first one stays
        the one hits take; this one is kept as a duplicate (evicted like any cached block).
        """
        block_id = self._table(seq_id)[block_idx]
        if self._fill[block_id] != self.block_size:
            raise ValueError(f"block {block_id} is not full and cannot be cached")
        current = self._key[block_id]
        if current is not None:
            if current != key:
                raise ValueError(f"block {block_id} already caches key {current}, not {key}")
            return True
        self._key[block_id] = key
        if key in self._key_to_block:
            self._duplicates.setdefault(key, []).append(block_id)
            return False
        self._key_to_block[key] = block_id
        return True

    # -- swapping ------------------------------------------------------------------------

    def _distinct(self, tables: Iterable[Sequence[int]]) -> dict[int, int]:
        counts: dict[int, int] = {}
        for table in tables:
            for block_id in table:
                counts[block_id] = counts.get(block_id, 0) + 1
        return counts

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        blocks = self._distinct(self._table(s) for s in seq_ids)
        return len(blocks) <= len(self._cpu_free)

    def can_swap_in(self, seq_ids: Sequence[int]) -> bool:
        blocks = self._distinct(self._cpu_tables[s] for s in seq_ids)
        return len(blocks) <= self.num_free_blocks

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockPair]:
        """Move the sequences' blocks to the CPU pool; returns ``(gpu_block, cpu_block)`` pairs.

        Blocks shared among ``seq_ids`` stay shared on the CPU side; blocks also held by other
        sequences keep their GPU copy for those.
        """
        counts = self._distinct(self._table(s) for s in seq_ids)
        if len(counts) > len(self._cpu_free):
            raise OutOfBlocksError(f"need {len(counts)} CPU blocks, {len(self._cpu_free)} free")
        mapping: dict[int, int] = {}
        for gpu_id, count in counts.items():
            cpu_id = self._cpu_free.pop()
            self._cpu_ref[cpu_id] = count
            self._cpu_fill[cpu_id] = self._fill[gpu_id]
            self._cpu_key[cpu_id] = self._key[gpu_id]
            mapping[gpu_id] = cpu_id
        for seq_id in seq_ids:
            table = self._table(seq_id)
            self._tables[seq_id] = None  # (its token count stays, for swapping in)
            self._cpu_tables[seq_id] = [mapping[b] for b in table]
            for block_id in reversed(table):
                self._release(block_id)
        return list(mapping.items())

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockPair]:
        """Bring swapped sequences back to fresh GPU blocks; returns ``(cpu_block, gpu_block)``."""
        counts = self._distinct(self._cpu_tables[s] for s in seq_ids)
        if len(counts) > self.num_free_blocks:
            raise OutOfBlocksError(f"need {len(counts)} blocks, {self.num_free_blocks} free")
        mapping: dict[int, int] = {}
        for cpu_id, count in counts.items():
            gpu_id = self._take_block()
            self._ref[gpu_id] = count
            self.num_shared_refs += count - 1
            self._fill[gpu_id] = self._cpu_fill[cpu_id]
            self.num_filled_slots += self._fill[gpu_id]
            key = self._cpu_key[cpu_id]
            if key is not None and key not in self._key_to_block:
                self._key[gpu_id] = key
                self._key_to_block[key] = gpu_id
            mapping[cpu_id] = gpu_id
        for seq_id in seq_ids:
            cpu_table = self._cpu_tables.pop(seq_id)
            self._tables[seq_id] = [mapping[c] for c in cpu_table]
            for cpu_id in cpu_table:
                self._release_cpu(cpu_id)
        return list(mapping.items())

    def _release_cpu(self, cpu_id: int) -> None:
        self._cpu_ref[cpu_id] -= 1
        if self._cpu_ref[cpu_id] == 0:
            self._cpu_fill[cpu_id] = 0
            self._cpu_key[cpu_id] = None
            self._cpu_free.append(cpu_id)
