"""The order in which sequences growing together over a run of steps take new blocks: the one
that appending step by step (each step, sequence after sequence) gives, found with one sort.
``BlockAllocator.append_steps`` keys each block start ``step * num_seqs + index`` (the
sequence's index in the step's order), so that sorted keys are in that order."""

from __future__ import annotations

# One sequence's growth over a run of identical steps, as ``BlockAllocator.append_steps`` takes
# it: (seq_id, positions per step, positions left: it stops growing after these, a prompt's last
# chunk). A plain tuple: fast-forward builds one per growing prompt per run.
SeqRun = tuple[int, int, int]


def add_chunk_starts(
    starts: list[int],
    many: dict[int, int],
    index: int,
    held: int,
    per_step: int,
    left: int,
    num_steps: int,
    block_size: int,
    num_seqs: int,
) -> None:
    """Key the steps in which sequence ``index`` (of ``num_seqs``), holding ``held`` tokens in
    whole blocks' worth of table and growing ``per_step`` positions a step until ``left``,
    starts blocks: one key each, into ``starts``; the number of blocks, where more than one,
    into ``many``."""
    bs = block_size
    blocks = (held + bs - 1) // bs
    for step in range(num_steps):
        need = (held + min((step + 1) * per_step, left) + bs - 1) // bs - blocks
        if need:
            key = step * num_seqs + index
            starts.append(key)
            if need > 1:
                many[key] = need
            blocks += need


def deal_blocks(
    starts: list[int], many: dict[int, int], blocks: list[int], tables: list[list[int]]
) -> None:
    """Give ``blocks`` out in the order of the sorted ``starts``: each key's sequence (its
    index in ``tables``) takes the next block, or the next ``many[key]``."""
    num_seqs = len(tables)
    starts.sort()
    idx = 0
    if not many:
        for key in starts:
            tables[key % num_seqs].append(blocks[idx])
            idx += 1
        return
    for key in starts:
        count = many.get(key, 1)
        tables[key % num_seqs].extend(blocks[idx : idx + count])
        idx += count
