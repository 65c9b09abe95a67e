"""Growing many sequences over a run of identical steps at once, in the paged allocator: what
fast-forward applies instead of appending step by step. Only skipping needs it, so it lives
here rather than in ``BlockAllocator``, whose state it works on directly (a friend of that
class: the counters and tables it changes are the allocator's own, kept as appending would)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, cast

from core.block_allocator import BlockAllocator
from core.errors import OutOfBlocksError


class SeqRun(NamedTuple):
    """One sequence's growth over a run of identical steps."""

    seq_id: int
    positions_per_step: int
    positions_left: int  # it stops growing after these (a prompt's last chunk)


def append_steps(
    alloc: BlockAllocator,
    runs: Sequence[tuple[int, int, int]],
    num_steps: int,
    decodes: Sequence[int] = (),
) -> None:
    """Grow every sequence of ``runs`` in ``alloc`` for ``num_steps`` steps at once, taking
    blocks in the order that appending step by step (each step, sequence after sequence) would
    take them, so the block tables come out the same. Each run is a ``SeqRun`` (a plain tuple
    of the same fields will do: hot callers build those). ``decodes`` are sequences growing one
    position every step, without end, that come before every run within a step (the common
    case, on a shorter path). No tail may need a copy-on-write; nothing changes if the pool
    runs out (``OutOfBlocksError``)."""
    bs = alloc.block_size
    tables, tokens, ref, fill = alloc._tables, alloc._num_tokens, alloc._ref, alloc._fill
    shared = alloc.num_shared_refs  # 0: no block is shared, so no tail needs a look
    num_decodes = len(decodes)
    num_seqs = num_decodes + len(runs)
    # Where blocks start, each as step * num_seqs + the sequence's index (decodes, then
    # runs): sorted, the order of the steps. A key starting more than one block (a prompt
    # chunk) gives its count in ``many``.
    starts: list[int] = []
    many: dict[int, int] = {}
    num_new = 0
    # Sequences that stay inside their tail block grow at once (most decodes in a short
    # run; undone if the pool runs out). The rest take blocks below: (sequence, its table,
    # tokens held, tokens after).
    grows: list[tuple[int, list[int], int, int]] = []
    # Each sequence's table by its order, for placing the blocks taken below.
    order_tables: list[list[int]] = []
    added = num_decodes * num_steps
    for order, seq_id in enumerate(decodes):
        table = tables[seq_id]
        if table is None:
            _undo_in_place(alloc, decodes[:order], (), grows, num_steps)
            raise ValueError(f"sequence {seq_id} has no block table")
        held = tokens[seq_id]
        order_tables.append(table)
        partial = held % bs
        if partial:
            if shared and ref[table[-1]] != 1:
                _undo_in_place(alloc, decodes[:order], (), grows, num_steps)
                raise ValueError(f"sequence {seq_id} shares its tail block: it needs a copy")
            if partial + num_steps <= bs:
                tokens[seq_id] = held + num_steps
                tail = table[-1]
                fill[tail] = fill[tail] + num_steps  # (typed: no generic in-place add)
                continue
        new_blocks = (held + num_steps + bs - 1) // bs - len(table)
        grows.append((seq_id, table, held, held + num_steps))
        num_new += new_blocks
        # A block every bs steps, from step -held % bs on (most often one, in short runs).
        key = -held % bs * num_seqs + order
        starts.append(key)
        for _ in range(new_blocks - 1):
            key += bs * num_seqs
            starts.append(key)
    for idx, (seq_id, per_step, left) in enumerate(runs):
        grown = num_steps * per_step
        if grown > left:
            grown = left
        if grown <= 0:
            order_tables.append([])  # (takes no block)
            continue
        table = tables[seq_id]
        if table is None:
            _undo_in_place(alloc, decodes, runs[:idx], grows, num_steps)
            raise ValueError(f"sequence {seq_id} has no block table")
        held = tokens[seq_id]
        order_tables.append(table)
        partial = held % bs
        if partial:
            if shared and ref[table[-1]] != 1:
                _undo_in_place(alloc, decodes, runs[:idx], grows, num_steps)
                raise ValueError(f"sequence {seq_id} shares its tail block: it needs a copy")
            if partial + grown <= bs:
                tokens[seq_id] = held + grown
                tail = table[-1]
                fill[tail] = fill[tail] + grown
                added += grown
                continue
        after = held + grown
        new_blocks = (after + bs - 1) // bs - len(table)
        added += grown
        grows.append((seq_id, table, held, after))
        num_new += new_blocks
        order = num_decodes + idx
        if per_step == 1:  # a block every bs steps
            key = -held % bs * num_seqs + order
            starts.append(key)
            for _ in range(new_blocks - 1):
                key += bs * num_seqs
                starts.append(key)
            continue
        blocks = len(table)
        for step in range(num_steps):
            need = (held + min((step + 1) * per_step, left) + bs - 1) // bs - blocks
            if need:
                key = step * num_seqs + order
                starts.append(key)
                if need > 1:
                    many[key] = need
                blocks += need
    alloc.num_filled_slots += added
    if not num_new:
        return
    free = alloc._free
    if num_new > len(free) + len(alloc._evictable):
        alloc.num_filled_slots -= added
        _undo_in_place(alloc, decodes, runs, grows, num_steps)
        raise OutOfBlocksError(f"need {num_new} blocks, {alloc.num_free_blocks} free")
    if num_new <= len(free):
        # No eviction: blocks come off the free stack in order.
        taken = free[-num_new:]
        del free[-num_new:]
        taken.reverse()
        alloc.num_used_blocks += num_new
    else:
        taken = [alloc._take_block() for _ in range(num_new)]
    # (through the lists typed as holding objects, with 1 and bs boxed once: a compiled build
    # would box both again for every block, a prompt chunk's dozens a step)
    ref_objects = cast("list[object]", ref)
    fill_objects = cast("list[object]", fill)
    one: object = 1
    full: object = bs
    for block_id in taken:
        ref_objects[block_id] = one
        fill_objects[block_id] = full  # (the last block of each sequence is set below)
    starts.sort()
    idx = 0
    if not many:
        for key in starts:
            order_tables[key % num_seqs].append(taken[idx])
            idx += 1
    else:
        for key in starts:
            count = many.get(key, 1)
            table = order_tables[key % num_seqs]
            if count == 1:
                table.append(taken[idx])
            else:
                table.extend(taken[idx : idx + count])
            idx += count
    for seq_id, table, held, after in grows:
        tokens[seq_id] = after
        if held % bs:
            fill[table[held // bs]] = bs
        fill[table[-1]] = after - (len(table) - 1) * bs


def _undo_in_place(
    alloc: BlockAllocator,
    decodes: Sequence[int],
    runs: Sequence[tuple[int, int, int]],
    grows: list[tuple[int, list[int], int, int]],
    num_steps: int,
) -> None:
    """Take back the growth that ``append_steps`` gave inside their tail blocks to the
    ``decodes`` and ``runs`` it went through before it found it could not go on (those
    not in ``grows``, which were to take blocks and are untouched yet)."""
    deferred = {seq_id for seq_id, _, _, _ in grows}
    grown_by = [(seq_id, num_steps) for seq_id in decodes]
    grown_by += [(seq_id, min(num_steps * per_step, left)) for seq_id, per_step, left in runs]
    for seq_id, grown in grown_by:
        table = alloc._tables[seq_id]
        if grown > 0 and seq_id not in deferred and table is not None:
            alloc._num_tokens[seq_id] -= grown
            alloc._fill[table[-1]] -= grown
