"""Chunked prefill (Sarathi-Serve): a per-step token budget filled by running decodes first,
then by prompt chunks of partially prefilled and waiting requests."""

from __future__ import annotations

from core.policies.base import Policy, StepContext
from core.request import RequestStatus


class ChunkedPrefill(Policy):
    name = "chunked"
    repeats_budget_chunks = True
    continues_decodes = True
    continues_chunks = True

    def schedule(self, ctx: StepContext) -> None:
        for request in ctx.schedule_decodes(ctx.running):
            if request.status is RequestStatus.RUNNING:
                fit = ctx.token_budget_left // request.width
                num_positions = min(ctx.pending_positions(request), fit)
                if num_positions > 0:
                    ctx.schedule(request, num_positions)
        if ctx.preempted_any or not self.resume_swapped(ctx):
            return
        self.fill_from_waiting(ctx, chunked=True)
