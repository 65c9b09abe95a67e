"""Chunked prefill (Sarathi-Serve): a per-step token budget filled by running decodes first,
then by prompt chunks of partially prefilled and waiting requests."""

from __future__ import annotations

from engine.core.policies.base import Policy, StepContext


class ChunkedPrefill(Policy):
    name = "chunked"
    repeats_budget_chunks = True

    def schedule(self, ctx: StepContext) -> None:
        running = ctx.running
        for request in running:
            if not request.is_prefill:
                ctx.schedule(request, 1)
        for request in running:
            if request.is_prefill:
                fit = ctx.token_budget_left // request.width
                num_positions = min(ctx.pending_positions(request), fit)
                if num_positions > 0:
                    ctx.schedule(request, num_positions)
        if ctx.preempted_any or not self.resume_swapped(ctx):
            return
        self.fill_from_waiting(ctx, chunked=True)
