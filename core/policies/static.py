"""Request-level batching (FasterTransformer-style): a batch of up to B requests runs until
its last sequence finishes; prompts are padded to the longest and finished sequences keep
their slot. ``dynamic`` also starts a batch when the oldest request has waited long enough."""

from __future__ import annotations

from typing import ClassVar

from core.config import MemoryModel
from core.policies.base import Policy, StepContext


class StaticBatching(Policy):
    name = "static"
    default_memory_model: ClassVar[MemoryModel] = "contiguous"
    holds_until_batch_end = True
    reads: ClassVar[frozenset[str]] = frozenset({"batch_size"})

    def token_budget(self) -> int | None:
        return None

    def seq_budget(self) -> int | None:
        return None  # the batch is B requests, whatever their sample count

    def ready(self, ctx: StepContext) -> bool:
        return len(ctx.waiting) >= self.config.batch_size or ctx.arrivals_done

    def schedule(self, ctx: StepContext) -> None:
        if ctx.running or ctx.num_held_samples:
            for request in ctx.running:
                ctx.schedule(request, ctx.pending_positions(request))
            ctx.add_padding(ctx.num_held_samples)
            return
        if ctx.swapped:
            self.resume_swapped(ctx)
            return
        if not ctx.waiting:
            return
        if not self.ready(ctx):
            return
        admitted: list[int] = []
        waiting = ctx.waiting
        for request in [waiting[i] for i in range(min(len(waiting), self.config.batch_size))]:
            if not ctx.schedule(request, ctx.pending_positions(request)):
                break
            admitted.append(request.num_prompt_tokens)
        if admitted:
            longest = max(admitted)
            ctx.add_padding(sum(longest - n for n in admitted))


class DynamicBatching(StaticBatching):
    name = "dynamic"
    reads: ClassVar[frozenset[str]] = frozenset({"batch_size", "max_wait_s"})

    def ready(self, ctx: StepContext) -> bool:
        if super().ready(ctx):
            return True
        deadline_s = ctx.waiting[0].arrival_s + self.config.max_wait_s
        if ctx.now_s >= deadline_s:
            return True
        ctx.wake_at(deadline_s)
        return False
