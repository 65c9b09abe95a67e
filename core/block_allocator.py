"""Paged KV block allocator: ref-counted blocks, block tables, fork and copy-on-write, growth
over many steps at once, a prefix cache of full blocks with LRU eviction (its index in
``core.cached_blocks``), and swapping to a CPU pool (``core.host_pool``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from core.block_order import SeqRun, add_chunk_starts, deal_blocks
from core.cached_blocks import CachedBlocks
from core.errors import OutOfBlocksError as OutOfBlocksError
from core.host_pool import HostBlockPool, count_holders
from core.kv_state import KVState

BlockPair = tuple[int, int]
_Grow = tuple[int, list[int], int, int]  # a sequence taking blocks: id, table, tokens now, after


class BlockAllocator:
    """GPU blocks (plus an optional CPU pool) handed out to sequences.

    Every block is in exactly one of three states: *used* (``ref_count > 0``), *cached-free*
    (``ref_count == 0`` but holding the content of a prefix-cache entry, reusable on a hit and
    evicted least-recently-freed first) or *free*. Counters for the memory snapshot are kept
    incrementally, so no operation scans the whole pool.
    """

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0 or num_cpu_blocks < 0:
            raise ValueError(f"bad pool: {num_blocks=}, {block_size=}, {num_cpu_blocks=}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        self._ref = [0] * num_blocks
        self._fill = [0] * num_blocks  # token slots written in each block
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._cached = CachedBlocks(num_blocks)
        # By sequence id (ids are small non-negative ints, handed out in order): a list
        # indexes faster than a dict (no hash). None: the sequence holds no GPU table (never
        # had one, freed or swapped out).
        self._tables: list[list[int] | None] = []
        self._num_tokens: list[int] = []
        self._host = HostBlockPool(num_cpu_blocks)

        self.num_used_blocks = 0
        self.num_filled_slots = 0  # written slots over used blocks (shared blocks once)
        self.num_shared_refs = 0  # sum of (ref_count - 1) over shared blocks
        self.num_evictions = 0

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free plus cached-free (evictable)."""
        return len(self._free) + len(self._cached.evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._cached.evictable)

    @property
    def num_free_cpu_blocks(self) -> int:
        return self._host.num_free

    def has_table(self, seq_id: int) -> bool:
        return 0 <= seq_id < len(self._tables) and self._tables[seq_id] is not None

    def is_swapped(self, seq_id: int) -> bool:
        return seq_id in self._host.tables

    def block_table(self, seq_id: int) -> Sequence[int]:
        return self._table(seq_id)

    def cpu_block_table(self, seq_id: int) -> Sequence[int]:
        return self._host.tables[seq_id]

    def num_tokens(self, seq_id: int) -> int:
        """Tokens ``seq_id`` holds, in its GPU table or swapped out."""
        if not self.has_table(seq_id) and seq_id not in self._host.tables:
            raise ValueError(f"sequence {seq_id} has no block table")
        return self._num_tokens[seq_id]

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_key(self, block_id: int) -> int | None:
        return self._cached.block_key[block_id]

    def block_fill(self, block_id: int) -> int:
        return self._fill[block_id]

    def cached_block(self, key: int) -> int | None:
        return self._cached.by_key.get(key)

    def prefix_cache(self) -> dict[int, int]:
        """A copy of the prefix cache: content key -> block id."""
        return dict(self._cached.by_key)

    def state(self) -> KVState:
        """A read-only copy of every block's state (no ``committed_blocks``: the manager
        above knows those)."""
        host = self._host
        return KVState(
            num_free_blocks=self.num_free_blocks,
            ref_counts=tuple(self._ref),
            block_tables=tuple((s, tuple(t)) for s, t in enumerate(self._tables) if t is not None),
            num_tokens=tuple(
                (s, n)
                for s, n in enumerate(self._num_tokens)
                if self._tables[s] is not None or s in host.tables
            ),
            prefix_cache=frozenset(self._cached.by_key.items()),
            eviction_order=tuple(self._cached.evictable),
            swapped_tables=tuple((s, tuple(t)) for s, t in sorted(host.tables.items())),
            cpu_ref_counts=tuple(host.ref),
            num_free_cpu_blocks=host.num_free,
        )

    def match_prefix(self, keys: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached run of ``keys`` (read-only)."""
        return self._cached.match(keys)

    def num_blocks_to_allocate(self, num_tokens: int, cached_blocks: Sequence[int] = ()) -> int:
        """Free-pool blocks a new table of ``num_tokens`` would consume (hits included)."""
        need = self._blocks_for(num_tokens)
        if not cached_blocks:  # (no hits: the common case, without a generator to start)
            return need
        revived = sum(1 for b in cached_blocks if self._ref[b] == 0)
        return need - len(cached_blocks) + revived

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
        return not self.has_table(seq_id) and seq_id not in self._host.tables

    # -- block life cycle ----------------------------------------------------------------

    def _take_block(self) -> int:
        if self._free:
            block_id = self._free.pop()
        else:
            block_id = self._cached.evict()
            self._fill[block_id] = 0
            self.num_evictions += 1
        self._ref[block_id] = 1
        self.num_used_blocks += 1
        return block_id

    def _share(self, block_id: int) -> None:
        if self._ref[block_id] == 0:
            del self._cached.evictable[block_id]  # a hit on a cached-free block revives it
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
        if self._cached.block_key[block_id] is not None:
            self._cached.evictable[block_id] = None
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
            self._fill[tail] += add
            self.num_filled_slots += add
            left -= add
        if left:
            blocks = self._take_blocks(-(-left // bs))
            self._fill[blocks[-1]] = left - (len(blocks) - 1) * bs  # the last may be partly full
            self.num_filled_slots += left
            table.extend(blocks)

    def _take_blocks(self, count: int) -> list[int]:
        """``count`` blocks (at most ``num_free_blocks``), held once and full (callers fix
        any partly full), in the order taking them one by one gives: free, then evicted."""
        free = self._free
        if count > len(free):
            blocks = [self._take_block() for _ in range(count)]
        else:
            blocks = free[-count:]
            del free[-count:]
            blocks.reverse()
            self.num_used_blocks += count
        # (through the lists typed as holding objects, with 1 and the block size boxed once: a
        # compiled build would box both again for every block, a prompt chunk's dozens a step)
        ref_objects = cast("list[object]", self._ref)
        fill_objects = cast("list[object]", self._fill)
        one: object = 1
        full: object = self.block_size
        for block_id in blocks:
            ref_objects[block_id] = one
            fill_objects[block_id] = full
        return blocks

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
            assert self._fill[block_id] == self.block_size and self.block_key(block_id) is not None
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
        if need > len(self._free) + len(self._cached.evictable):
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

    def append_steps(
        self, runs: Sequence[SeqRun], num_steps: int, decodes: Sequence[int] = ()
    ) -> None:
        """Grow every sequence of ``runs`` for ``num_steps`` steps at once, taking blocks in
        the order that appending step by step (each step, sequence after sequence) would, so
        the block tables come out the same: what fast-forward applies for a run of identical
        steps. ``decodes`` grow one position every step, without end, and come before every
        run within a step (the common case, on a shorter path). No tail may need a
        copy-on-write (ValueError); nothing changes if the pool runs out (OutOfBlocksError).

        Long because it is the simulator's hottest path when it skips steps: one pass over the
        sequences, with no call and no object per sequence that stays in its tail block, grows
        those and notes where the others' new blocks start; one sort then deals the blocks."""
        bs = self.block_size
        tables, tokens, ref, fill = self._tables, self._num_tokens, self._ref, self._fill
        shared = self.num_shared_refs  # 0: no block is shared, so no tail needs a look
        num_decodes = len(decodes)
        num_seqs = num_decodes + len(runs)
        # Where blocks start, each as step * num_seqs + the sequence's index (decodes, then
        # runs): sorted, the order of the steps. A key starting more than one block (a prompt
        # chunk) gives its count in ``many``.
        starts: list[int] = []
        many: dict[int, int] = {}
        num_new = 0
        # Sequences that stay inside their tail block grow at once (most decodes in a short
        # run; undone if the pool runs out). The rest take blocks below.
        grows: list[_Grow] = []
        order_tables: list[list[int]] = []  # each sequence's table by its order
        added = num_decodes * num_steps
        for order, seq_id in enumerate(decodes):
            table = tables[seq_id]
            held = tokens[seq_id]
            partial = held % bs
            if table is None or (partial and shared and ref[table[-1]] != 1):
                self._undo_tail_growth(decodes[:order], (), grows, num_steps)
                raise ValueError(f"sequence {seq_id} has no table or shares its tail block")
            order_tables.append(table)
            if partial and partial + num_steps <= bs:
                tokens[seq_id] = held + num_steps
                tail = table[-1]
                fill[tail] = fill[tail] + num_steps  # (typed: no generic in-place add)
                continue
            new_blocks = (held + num_steps + bs - 1) // bs - len(table)
            grows.append((seq_id, table, held, held + num_steps))
            num_new += new_blocks
            # A block every bs steps, from step -held % bs on (most often one, in short runs).
            key = -held % bs * num_seqs + order
            for _ in range(new_blocks):
                starts.append(key)
                key += bs * num_seqs
        for idx, (seq_id, per_step, left) in enumerate(runs):
            grown = num_steps * per_step
            if grown > left:
                grown = left
            if grown <= 0:
                order_tables.append([])  # (takes no block)
                continue
            table = tables[seq_id]
            held = tokens[seq_id]
            partial = held % bs
            if table is None or (partial and shared and ref[table[-1]] != 1):
                self._undo_tail_growth(decodes, runs[:idx], grows, num_steps)
                raise ValueError(f"sequence {seq_id} has no table or shares its tail block")
            order_tables.append(table)
            added += grown
            if partial and partial + grown <= bs:
                tokens[seq_id] = held + grown
                tail = table[-1]
                fill[tail] = fill[tail] + grown
                continue
            after = held + grown
            new_blocks = (after + bs - 1) // bs - len(table)
            grows.append((seq_id, table, held, after))
            num_new += new_blocks
            order = num_decodes + idx
            if per_step == 1:  # as a decode
                key = -held % bs * num_seqs + order
                for _ in range(new_blocks):
                    starts.append(key)
                    key += bs * num_seqs
                continue
            add_chunk_starts(starts, many, order, held, per_step, left, num_steps, bs, num_seqs)
        if num_new > len(self._free) + len(self._cached.evictable):
            self._undo_tail_growth(decodes, runs, grows, num_steps)
            raise OutOfBlocksError(f"need {num_new} blocks, {self.num_free_blocks} free")
        self.num_filled_slots += added
        if not num_new:
            return
        # (full: each sequence's last block is set below)
        deal_blocks(starts, many, self._take_blocks(num_new), order_tables)
        for seq_id, table, held, after in grows:
            tokens[seq_id] = after
            if held % bs:
                fill[table[held // bs]] = bs
            fill[table[-1]] = after - (len(table) - 1) * bs

    def _undo_tail_growth(
        self, decodes: Sequence[int], runs: Sequence[SeqRun], grows: list[_Grow], steps: int
    ) -> None:
        """Take back the growth that ``append_steps`` gave inside their tail blocks to the
        ``decodes`` and ``runs`` it went through before it found it could not go on (those
        not in ``grows``, which were to take blocks and are untouched yet)."""
        deferred = {seq_id for seq_id, _, _, _ in grows}
        grown_by = [(seq_id, steps) for seq_id in decodes]
        grown_by += [(seq_id, min(steps * per_step, left)) for seq_id, per_step, left in runs]
        for seq_id, grown in grown_by:
            table = self._tables[seq_id]
            if grown > 0 and seq_id not in deferred and table is not None:
                self._num_tokens[seq_id] -= grown
                self._fill[table[-1]] -= grown

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
        if seq_id in self._host.tables:
            self._host.release_table(seq_id)
        else:
            table = self._table(seq_id)
            self._tables[seq_id] = None
            ref = self._ref
            if not self._cached.by_key and (
                # (no block is shared anywhere: every used block's count is 1, no need to look)
                not self.num_shared_refs or list(map(ref.__getitem__, table)).count(1) == len(table)
            ):
                # The common case: every block held by this sequence alone, none cached. Its
                # blocks hold exactly its tokens; a free block's fill is never read (it is set
                # when the block is handed out again), so it is left as it is.
                for block_id in table:
                    ref[block_id] = 0
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
        return self._cached.add(block_id, key)

    # -- swapping ------------------------------------------------------------------------

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        blocks = count_holders(self._table(s) for s in seq_ids)
        return len(blocks) <= self._host.num_free

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockPair]:
        """Move the sequences' blocks to the CPU pool; returns ``(gpu_block, cpu_block)`` pairs.

        Blocks shared among ``seq_ids`` stay shared on the CPU side; blocks also held by other
        sequences keep their GPU copy for those.
        """
        tables = [self._table(s) for s in seq_ids]
        mapping = self._host.store(seq_ids, tables, self._fill, self._cached.block_key)
        for seq_id, table in zip(seq_ids, tables, strict=True):
            self._tables[seq_id] = None  # (its token count stays, for swapping in)
            for block_id in reversed(table):
                self._release(block_id)
        return mapping

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockPair]:
        """Bring swapped sequences back to fresh GPU blocks; returns ``(cpu_block, gpu_block)``."""
        host = self._host
        counts = count_holders(host.tables[s] for s in seq_ids)
        if len(counts) > self.num_free_blocks:
            raise OutOfBlocksError(f"need {len(counts)} blocks, {self.num_free_blocks} free")
        mapping: dict[int, int] = {}
        for cpu_id, count in counts.items():
            gpu_id = self._take_block()
            self._ref[gpu_id] = count
            self.num_shared_refs += count - 1
            self._fill[gpu_id] = host.fill[cpu_id]
            self.num_filled_slots += host.fill[cpu_id]
            key = host.key[cpu_id]
            if key is not None:
                self._cached.restore(gpu_id, key)
            mapping[cpu_id] = gpu_id
        for seq_id in seq_ids:
            self._tables[seq_id] = [mapping[c] for c in host.release_table(seq_id)]
        return list(mapping.items())
