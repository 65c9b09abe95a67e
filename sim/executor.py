"""The simulator's executor: turns a scheduled batch into a StepShape and prices it with the
cost model instead of running a model."""

from __future__ import annotations

import math

from engine.core.batch import ScheduledBatch, StepResult
from sim.cost_model import CostModel, StepShape


def step_shape(batch: ScheduledBatch, block_size: int) -> StepShape:
    """What the cost model needs to know about ``batch``."""
    prefill: list[tuple[int, int]] = []
    decode: list[int] = []
    for scheduled in batch.requests:
        width = len(scheduled.seq_ids)
        if scheduled.is_prefill:
            prefill.extend([(scheduled.num_positions, scheduled.num_computed_tokens)] * width)
        else:
            decode.extend([scheduled.num_computed_tokens + 1] * width)
    # Contiguous prompt copies move slots, priced as the blocks they would fill.
    range_blocks = sum(-(-n // block_size) for _, _, n in batch.range_copies)
    return StepShape(
        prefill_chunks=tuple(prefill),
        decode_context_tokens=tuple(decode),
        num_padding_tokens=batch.num_padding_tokens,
        num_copy_blocks=len(batch.copies) + range_blocks,
        num_swap_out_blocks=len(batch.swap_out),
        num_swap_in_blocks=len(batch.swap_in),
        block_size=block_size,
    )


def _is_plain(batch: ScheduledBatch) -> bool:
    """No padding and no memory moves: the step's cost depends on its tokens alone."""
    return not (
        batch.num_padding_tokens
        or batch.copies
        or batch.range_copies
        or batch.swap_out
        or batch.swap_in
    )


class CostModelExecutor:
    """Executes a batch by asking the cost model how long it would take.

    A step without padding or memory moves is priced from aggregates (its prefill chunks, and
    the count, summed context and summed blocks of its decodes) when the cost model offers
    that path; ``repeat_end_times`` prices the same step repeated with the very same
    arithmetic, so skipping ahead changes no result.
    """

    def __init__(self, cost_model: CostModel, block_size: int) -> None:
        self.cost_model = cost_model
        self.block_size = block_size
        self._aggregate = getattr(cost_model, "aggregate_step_time_s", None)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        if batch.is_empty and not (batch.swap_out or batch.copies):
            return StepResult(duration_s=0.0)
        if self._aggregate is not None and _is_plain(batch):
            chunks, contexts = _split(batch)
            bs = self.block_size
            blocks = sum(-(-c // bs) for c in contexts)
            return StepResult(
                self._aggregate(tuple(chunks), len(contexts), sum(contexts), blocks, bs)
            )
        return StepResult(self.cost_model.step_time_s(step_shape(batch, self.block_size)))

    def repeat_end_times(
        self, batch: ScheduledBatch, start_s: float, max_steps: int, stop_at_s: float = math.inf
    ) -> list[float]:
        """End times of up to ``max_steps`` repeats of the (already executed) ``batch`` from
        ``start_s``: its decodes each one token further, its prompt chunks each one chunk
        further. Stops after the first step that ends at or after ``stop_at_s``."""
        chunks, contexts = _split(batch)
        # The next step's state: one more token of context, one chunk further along.
        contexts = [c + 1 for c in contexts]
        chunks = [(n, ctx + n) for n, ctx in chunks]
        bs = self.block_size
        ends: list[float] = []
        now_s = start_s
        if self._aggregate is None or not _is_plain(batch):
            padding = batch.num_padding_tokens  # static batching: finished members ride along
            for _ in range(max_steps):
                shape = StepShape(
                    prefill_chunks=tuple(chunks),
                    decode_context_tokens=tuple(contexts),
                    num_padding_tokens=padding,
                    block_size=bs,
                )
                now_s += self.cost_model.step_time_s(shape)
                ends.append(now_s)
                if now_s >= stop_at_s:
                    break
                contexts = [c + 1 for c in contexts]
                chunks = [(n, ctx + n) for n, ctx in chunks]
            return ends
        num_seqs = len(contexts)
        total = sum(contexts)
        blocks = sum(-(-c // bs) for c in contexts)
        # A sequence starts a new block when its context becomes k * bs + 1.
        by_phase = [0] * bs
        for c in contexts:
            by_phase[c % bs] += 1
        step_chunks = tuple(chunks)
        stepper = getattr(self.cost_model, "repeat_stepper", None)
        if stepper is not None:
            step_time = stepper(step_chunks, num_seqs, bs)
        else:
            aggregate = self._aggregate

            def step_time(c: tuple[tuple[int, int], ...], total: int, blocks: int) -> float:
                return aggregate(c, num_seqs, total, blocks, bs)  # type: ignore[no-any-return]

        for step in range(max_steps):
            now_s += step_time(step_chunks, total, blocks)
            ends.append(now_s)
            if now_s >= stop_at_s:
                break
            total += num_seqs
            blocks += by_phase[(-step) % bs]
            if step_chunks:
                step_chunks = tuple((n, ctx + n) for n, ctx in step_chunks)
        return ends


def _split(batch: ScheduledBatch) -> tuple[list[tuple[int, int]], list[int]]:
    """The step's prefill chunks (positions, context before) and decode contexts (including
    the new token), one per sequence."""
    chunks: list[tuple[int, int]] = []
    contexts: list[int] = []
    for scheduled in batch.requests:
        width = len(scheduled.seq_ids)
        if scheduled.is_prefill:
            chunks.extend([(scheduled.num_positions, scheduled.num_computed_tokens)] * width)
        else:
            contexts.extend([scheduled.num_computed_tokens + 1] * width)
    return chunks, contexts
