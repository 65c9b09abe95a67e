"""Continuous (iteration-level) batching, as in Orca and vLLM: requests join and leave at every
step; a prompt is computed whole in the step that admits it."""

from __future__ import annotations

from core.policies.base import Policy, StepContext
from core.request import Request


class ContinuousBatching(Policy):
    name = "continuous"
    repeats_budget_chunks = True
    continues_decodes = True

    def rejection_reason(self, request: Request) -> str | None:
        if request.num_prompt_tokens > self.config.max_num_batched_tokens:
            return (
                f"prompt of {request.num_prompt_tokens} tokens exceeds the step budget "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens} and this policy "
                "does not chunk prompts"
            )
        return super().rejection_reason(request)

    def schedule(self, ctx: StepContext) -> None:
        # Running order: the decodes ahead of the first other request go the fast way.
        for request in ctx.schedule_decodes(ctx.running, in_order=True):
            pending = ctx.pending_positions(request)
            # Only a recompute longer than the whole budget can be left here: split it.
            num_positions = min(pending, ctx.token_budget_left // request.width)
            if num_positions > 0:
                ctx.schedule(request, num_positions)
        # vLLM's rule: nothing new joins in a step that preempted, or while others are out.
        if ctx.preempted_any or not self.resume_swapped(ctx):
            return
        self.fill_from_waiting(ctx, chunked=False)
