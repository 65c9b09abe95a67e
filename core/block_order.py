"""Which sequence takes each new block when several sequences grow together over a run of
steps: the order that appending step by step (each step, sequence after sequence) gives, worked
out in one sort. ``BlockAllocator.append_steps`` deals its blocks by it."""

from __future__ import annotations

from collections.abc import Sequence

# One sequence's growth over a run of identical steps, as ``BlockAllocator.append_steps`` takes
# it: (seq_id, positions per step, positions left: it stops growing after these, a prompt's last
# chunk). A plain tuple: fast-forward builds one per growing prompt per run.
SeqRun = tuple[int, int, int]

# A sequence growing over the run: (its index in the step's order, tokens held, tokens after
# the run, positions per step, positions left: it stops growing after these, its id). A plain
# tuple: the allocator builds one per sequence that needs a block, per run.
Growing = tuple[int, int, int, int, int, int]


def taking_order(
    growing: Sequence[Growing], num_steps: int, block_size: int, num_seqs: int
) -> list[int]:
    """The index of the sequence that takes each new block, in taking order, for sequences
    out of ``num_seqs`` (indices ``0 .. num_seqs - 1``) growing over ``num_steps`` steps.

    Each block start is keyed ``step * num_seqs + index``, so that sorting the keys sorts the
    starts by step and, within a step, by sequence. A sequence holding exactly the tokens of
    its table (every table does) starts a block whenever it passes a multiple of
    ``block_size``; a prompt chunk may start several in one step (``many``)."""
    bs = block_size
    stride = bs * num_seqs
    starts: list[int] = []
    many: dict[int, int] = {}
    for idx, held, after, per_step, left, _ in growing:
        if per_step == 1:  # a block every bs steps, from step -held % bs on
            key = -held % bs * num_seqs + idx
            for _ in range((after + bs - 1) // bs - (held + bs - 1) // bs):
                starts.append(key)
                key += stride
            continue
        blocks = (held + bs - 1) // bs
        for step in range(num_steps):
            need = (held + min((step + 1) * per_step, left) + bs - 1) // bs - blocks
            if need:
                key = step * num_seqs + idx
                starts.append(key)
                if need > 1:
                    many[key] = need
                blocks += need
    starts.sort()
    if not many:
        return [key % num_seqs for key in starts]
    order: list[int] = []
    for key in starts:
        order.extend([key % num_seqs] * many.get(key, 1))
    return order
