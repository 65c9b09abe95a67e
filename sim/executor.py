"""The simulator's executor: turns a scheduled batch into a StepShape and prices it with the
cost model instead of running a model."""

from __future__ import annotations

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


class CostModelExecutor:
    """Executes a batch by asking the cost model how long it would take."""

    def __init__(self, cost_model: CostModel, block_size: int) -> None:
        self.cost_model = cost_model
        self.block_size = block_size

    def execute(self, batch: ScheduledBatch) -> StepResult:
        if batch.is_empty and not (batch.swap_out or batch.copies):
            return StepResult(duration_s=0.0)
        return StepResult(self.cost_model.step_time_s(step_shape(batch, self.block_size)))
