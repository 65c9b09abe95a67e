"""The simulator's executor: turns a scheduled batch into a StepShape and prices it with the
cost model instead of running a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from core.batch import ScheduledBatch, StepResult
from records.step_shapes import batch_sequences
from sim.costmodel.base import CostModel, StepShape
from sim.costmodel.roofline import RooflineCostModel
from sim.fastforward import RepeatShape


def step_shape(batch: ScheduledBatch, block_size: int) -> StepShape:
    """What the cost model needs to know about ``batch``."""
    prefill, decode = batch_sequences(batch)
    # Contiguous prompt copies move slots, priced as the blocks they would fill.
    range_blocks = sum(-(-n // block_size) for _, _, n in batch.range_copies)
    return StepShape(
        prefill_chunks=prefill,
        decode_context_tokens=decode,
        num_padding_tokens=batch.num_padding_tokens,
        num_copy_blocks=len(batch.copies) + range_blocks,
        num_swap_out_blocks=len(batch.swap_out),
        num_swap_in_blocks=len(batch.swap_in),
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


class StepExecutor(Protocol):
    """What a replica needs of its executor: ``CostModelExecutor``, or a wrapper of it (the
    validation's recorder). Typed as a protocol so that a compiled build, which checks the
    classes of typed attributes at run time, accepts the wrapper too."""

    def execute(self, batch: ScheduledBatch) -> StepResult: ...

    def repeat_end_times(
        self,
        batch: ScheduledBatch,
        start_s: float,
        max_steps: int,
        shape: RepeatShape | None = None,
    ) -> list[float]: ...


class CostModelExecutor:
    """Executes a batch by asking the cost model how long it would take.

    A step without padding or memory moves is priced from aggregates (its prefill chunks, and
    the count, summed context and summed blocks of its decodes) when the cost model offers
    that path; ``repeat_end_times`` prices the same step repeated with the very same
    arithmetic, so skipping ahead changes no result.
    """

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        # The deployment's block size, which the cost model was built for.
        self.block_size: int = cost_model.block_size
        # A cost model whose host clock reads more than a step's aggregates (each decode's
        # context) is priced by shape, step by step.
        aggregates = getattr(cost_model, "prices_aggregates", True)
        self._aggregate = getattr(cost_model, "aggregate_step_time_s", None) if aggregates else None
        # The roofline, typed as such: a compiled build then calls its methods and its
        # stepper's directly rather than through the interpreter's call protocol.
        self._roofline = (
            cost_model if isinstance(cost_model, RooflineCostModel) and aggregates else None
        )
        self._padding = 0
        self._last_split: tuple[
            ScheduledBatch | None, tuple[tuple[int, int], ...], tuple[int, ...]
        ] = (None, (), ())

    @property
    def prices_from_shape(self) -> bool:
        """Whether ``repeat_end_times`` prices a plain run from its ``shape`` alone, never
        reading the batch's requests (the cost model prices aggregates)."""
        return self._aggregate is not None

    def execute(self, batch: ScheduledBatch) -> StepResult:
        if batch.is_empty and not (batch.swap_out or batch.copies):
            return StepResult(duration_s=0.0)
        if self._aggregate is not None and _is_plain(batch):
            # ``batch_sequences`` in aggregate, in one pass: the chunks, in order, and the
            # decodes' count, summed context and summed blocks.
            bs = self.block_size
            chunks: list[tuple[int, int]] = []
            num_seqs = total = blocks = 0
            for scheduled in batch.requests:
                width = len(scheduled.seq_ids)
                if scheduled.is_prefill:
                    chunk = (scheduled.num_positions, scheduled.num_computed_tokens)
                    for _ in range(width):
                        chunks.append(chunk)
                else:
                    context = scheduled.num_computed_tokens + 1
                    num_seqs += width
                    total += context * width
                    blocks += -(-context // bs) * width
            return StepResult(self._aggregate_s(tuple(chunks), num_seqs, total, blocks))
        return StepResult(self.cost_model.step_time_s(step_shape(batch, self.block_size)))

    def repeat_end_times(
        self,
        batch: ScheduledBatch,
        start_s: float,
        max_steps: int,
        shape: RepeatShape | None = None,
    ) -> list[float]:
        """End times of up to ``max_steps`` repeats of the (already executed and updated)
        ``batch`` from ``start_s``: its decodes each one token further, its prompt chunks each
        one chunk further (the last one shorter if the prompt ends). ``shape`` is the same
        repeat in aggregate (the scheduler's ``repeat_shape``), which saves a pass over the
        batch (for a batch with padding or memory moves it is not used), and says whether a
        step also admits the waiting head with its first chunk.

        Long because it prices every skipped step: the aggregate path, the per-request path
        and their shared end-time loop stay in one frame, each state kept in locals."""
        bs = self.block_size
        # The step (if any) that also computes an admitted head's first chunk, after the rest.
        admit_step = shape.admit_step if shape is not None else -1
        admitted = ((shape.admit_positions, 0),) if shape is not None else ()
        if shape is not None and self._aggregate is not None and _is_plain(batch):
            # The next step's state: one more token of context, one chunk further along.
            chunks = [(n, held) for n, held, _, seqs in shape.chunks for _ in range(seqs)]
            lefts = [left for _, _, left, seqs in shape.chunks for _ in range(seqs)]
            num_seqs = shape.decode_seqs
            total = shape.decode_tokens + num_seqs
            phases = shape.decode_phases
            # Blocks of c + 1 tokens for each sequence holding c: c // bs + 1.
            remainders = 0
            for phase in range(bs):
                remainders += phase * phases[phase]
            blocks = (shape.decode_tokens - remainders) // bs + num_seqs
            # A sequence starts a new block when its context becomes k * bs + 1.
            by_phase = [phases[-1], *phases[:-1]]
            contexts: Sequence[int] = ()  # not needed by the aggregate pricers
        else:
            split, contexts = self._split(batch)
            lefts = [s.request.num_pending_positions for s in batch.requests if s.is_prefill]
            chunks = [(n, ctx + n) for n, ctx in split]
            num_seqs = len(contexts)
            total = sum(contexts) + num_seqs
            blocks = 0
            by_phase = [0] * bs
            for c in contexts:
                blocks += (c + bs) // bs  # blocks of c + 1 tokens
                by_phase[(c + 1) % bs] += 1
        vectorized = getattr(self.cost_model, "decode_repeat_durations", None)
        if (
            vectorized is not None
            and self._aggregate is not None
            and not chunks
            and num_seqs
            and max_steps >= _VECTOR_MIN_STEPS
            and _is_plain(batch)
        ):
            return _decode_ends(vectorized, start_s, max_steps, num_seqs, total, blocks, by_phase)
        ends: list[float] = []
        now_s = start_s
        if self._aggregate is None or not _is_plain(batch):
            # Static batching (members ride along as padding): a full StepShape per step.
            self._padding = batch.num_padding_tokens
            contexts = [c + 1 for c in contexts]
            for step in range(max_steps):
                shaped = _step_chunks(chunks, lefts, step)
                if step == admit_step:
                    shaped += admitted
                now_s += self._priced_by_shape(shaped, contexts, total, blocks)
                ends.append(now_s)
                contexts = [c + 1 for c in contexts]
            return ends
        roofline = self._roofline
        # The roofline's stepper for steps whose chunks are all whole (bit-identical to
        # ``execute``); a prompt's last, shorter chunk is priced from aggregates.
        full = None if roofline is None else roofline.stepper(tuple(chunks), num_seqs)
        whole = 0
        if full is not None:
            # The steps before the first prompt's last, shorter chunk (all, without chunks).
            whole = max_steps
            # (indexed: ``zip(strict=True)`` is a keyword call the compiled build leaves to
            # the interpreter, once a run)
            for idx in range(len(chunks)):
                n = chunks[idx][0]
                if lefts[idx] // n < whole:
                    whole = lefts[idx] // n
        step_chunks: tuple[tuple[int, int], ...] = ()
        if full is not None and not chunks and admit_step >= max_steps:
            # Decodes alone, every step on the stepper: the same loop with nothing to decide.
            for step in range(max_steps):
                now_s += full.step(step_chunks, total, blocks)
                ends.append(now_s)
                total += num_seqs
                blocks += by_phase[(-step) % bs]
            return ends
        for step in range(max_steps):
            if chunks:
                step_chunks = _step_chunks(chunks, lefts, step)
            if step == admit_step:
                now_s += self._aggregate_s(step_chunks + admitted, num_seqs, total, blocks)
            elif full is not None and step < whole:
                now_s += full.step(step_chunks, total, blocks)
            else:
                now_s += self._aggregate_s(step_chunks, num_seqs, total, blocks)
            ends.append(now_s)
            total += num_seqs
            blocks += by_phase[(-step) % bs]
        return ends

    def _aggregate_s(
        self, chunks: tuple[tuple[int, int], ...], num_seqs: int, total: int, blocks: int
    ) -> float:
        """The cost model's ``aggregate_step_time_s`` (which it offers) of a step."""
        if self._roofline is not None:
            return self._roofline.aggregate_step_time_s(chunks, num_seqs, total, blocks)
        aggregate = self._aggregate
        assert aggregate is not None
        duration_s: float = aggregate(chunks, num_seqs, total, blocks)
        return duration_s

    def _split(self, batch: ScheduledBatch) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        """``batch_sequences(batch)``, kept for the batch last split (executed, then
        repeated)."""
        if self._last_split[0] is not batch:
            self._last_split = (batch, *batch_sequences(batch))
        return self._last_split[1], self._last_split[2]

    def _priced_by_shape(
        self, step_chunks: tuple[tuple[int, int], ...], contexts: list[int], total: int, blocks: int
    ) -> float:
        shape = StepShape(
            prefill_chunks=step_chunks,
            decode_context_tokens=tuple(contexts),
            num_padding_tokens=self._padding,
        )
        return self.cost_model.step_time_s(shape)


# Shorter runs are cheaper to price one step at a time: through ``repeat_end_times``, the
# vectorized call costs a fixed 18-30 us (a dozen numpy operations on small arrays), the loop
# ~3 us plus ~0.4 us a step from the sources, and a quarter of that from a compiled build
# (docs/compiled_core.md), whose numpy calls cost the same (Llama-2-70B, 19 decodes, a 2-core
# Xeon, 2026-11-26; vectorized against loop in us, sources: 16 steps 18 / 12, 32: 18 / 18,
# 64: 19 / 33; compiled: 64: 18 / 8, 128: 19 / 15, 256: 23 / 27). Both give the same times.
_VECTOR_MIN_STEPS = 32 if __file__.endswith(".py") else 192


def _decode_ends(
    durations: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
    start_s: float,
    count: int,
    num_seqs: int,
    total: int,
    blocks: int,
    by_phase: list[int],
) -> list[float]:
    """End times of ``count`` decode-only steps priced in one vectorized call: step k holds
    ``total + k * num_seqs`` context tokens, and its blocks grow by the sequences whose context
    crosses a block boundary (``by_phase``, read backwards from phase 0). The running sum is a
    sequential accumulate, so the times equal those of adding one step at a time."""
    bs = len(by_phase)
    steps = np.arange(count, dtype=np.int64)
    totals = total + steps * num_seqs
    phase_order = np.array(by_phase, dtype=np.int64)[(-steps[:-1]) % bs]
    sum_blocks = np.empty(count, dtype=np.int64)
    sum_blocks[0] = blocks
    np.add.accumulate(phase_order, out=sum_blocks[1:])
    sum_blocks[1:] += blocks
    step_s = durations(num_seqs, totals, sum_blocks)
    ends = np.empty(count + 1)
    ends[0] = start_s
    ends[1:] = step_s
    return np.add.accumulate(ends)[1:].tolist()  # type: ignore[no-any-return]


def _step_chunks(
    chunks: list[tuple[int, int]], lefts: list[int], step: int
) -> tuple[tuple[int, int], ...]:
    """The prompt chunks of repeat ``step`` (0 = the first): each one chunk further along,
    the last one shorter if its prompt ends."""
    if len(chunks) == 1:  # the usual case, without the generator
        n, ctx = chunks[0]
        return ((min(n, lefts[0] - step * n), ctx + step * n),)
    return tuple(
        (min(n, left - step * n), ctx + step * n)
        for (n, ctx), left in zip(chunks, lefts, strict=True)
    )
