"""The policy protocol: a policy decides who runs and how many positions each gets; the
scheduler's ``StepContext`` carries the decision out (allocation, preemption, swapping)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from core.config import MemoryModel, SchedulerConfig
from core.request import Request


class StepContext(Protocol):
    """A policy's read-only view of one step, and its one way to act: ``schedule``. The
    scheduler's ``Step`` implements it."""

    @property
    def now_s(self) -> float: ...

    @property
    def running(self) -> Sequence[Request]: ...

    @property
    def waiting(self) -> Sequence[Request]:
        """The live waiting queue (FCFS); admitting a request removes it from here."""
        ...

    @property
    def swapped(self) -> Sequence[Request]: ...

    @property
    def arrivals_done(self) -> bool: ...

    @property
    def token_budget_left(self) -> int: ...

    @property
    def preempted_any(self) -> bool: ...

    @property
    def num_held_samples(self) -> int: ...

    def pending_positions(self, request: Request) -> int:
        """Positions the request could compute now (after prefix-cache hits, if waiting)."""
        ...

    def schedule(self, request: Request, num_positions: int) -> bool:
        """Give ``request`` ``num_positions`` positions this step; False if it cannot run
        (budget, memory, or it was preempted). May preempt later-arrived running requests."""
        ...

    def schedule_decodes(
        self, requests: Sequence[Request], in_order: bool = False
    ) -> list[Request]:
        """``schedule(request, 1)`` for each decoding request in order (faster); returns the
        requests that are not decoding (prompts, recomputes), in order. With ``in_order``
        it stops at the first request that is not decoding and returns it and all after it
        (unscheduled), so a policy that keeps the running order can go on from there."""
        ...

    def add_padding(self, num_tokens: int) -> None: ...

    def wake_at(self, when_s: float) -> None:
        """Ask to be scheduled again at ``when_s`` even if nothing arrives."""
        ...


class Policy:
    """Base of every batching policy; subclasses implement ``schedule``."""

    name: ClassVar[str] = ""
    default_memory_model: ClassVar[MemoryModel] = "paged"
    # Static batching keeps finished sequences (and their memory) until the whole batch ends.
    holds_until_batch_end: ClassVar[bool] = False
    # True if, when a step's token budget is used up by decodes plus one running prompt's
    # chunk, the next step (nothing else changing) gives that prompt the same chunk again:
    # lets the scheduler skip over such steps exactly.
    repeats_budget_chunks: ClassVar[bool] = False
    # True if, when every running request is decoding and the waiting head cannot be
    # admitted, the step is exactly one position for each running request (in running order)
    # and nothing else: lets the scheduler build that step without running the policy.
    continues_decodes: ClassVar[bool] = False
    # True if, besides, one running prompt next to the decodes gets the rest of the budget
    # as its chunk (decodes are scheduled first).
    continues_chunks: ClassVar[bool] = False
    # The scheduler settings (by field name) only some policies read: a run of a policy that
    # does not list one never reads it (`core.flags.unused_settings` names it to the user).
    reads: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def token_budget(self) -> int | None:
        """Tokens one step may compute (None: unlimited)."""
        return self.config.max_num_batched_tokens

    def seq_budget(self) -> int | None:
        """Sequences one step may hold (None: unlimited)."""
        return self.config.max_num_seqs

    def rejection_reason(self, request: Request) -> str | None:
        """Why this policy could never serve ``request`` (None if it can)."""
        seqs = self.seq_budget()
        if seqs is not None and request.n > seqs:
            return f"{request.n} parallel samples exceed max_num_seqs={seqs}"
        tokens = self.token_budget()
        if tokens is not None and request.n > tokens:
            return (
                f"{request.n} parallel samples need {request.n} tokens per decode step, more "
                f"than max_num_batched_tokens={tokens}"
            )
        return None

    def schedule(self, ctx: StepContext) -> None:
        raise NotImplementedError

    def fill_from_waiting(self, ctx: StepContext, chunked: bool) -> None:
        """Admit waiting requests in FCFS order until one does not fit.

        With ``chunked`` a request may start with part of its prompt. Otherwise its known
        tokens must fit whole, a preempted request's recompute included: as vLLM with chunked
        prefill off, it waits for a step with room for all of them. Only a recompute longer
        than the whole step budget is split (vLLM rules that out by asking for a budget of at
        least ``max_model_len`` when it does not chunk; here it would never run).
        """
        waiting = ctx.waiting  # live: each admitted request leaves it
        budget = self.token_budget()
        idx = 0
        while idx < len(waiting):
            request = waiting[idx]
            pending = ctx.pending_positions(request)
            fit = ctx.token_budget_left // request.width
            if pending > fit and not chunked:
                oversized = budget is not None and pending * request.width > budget
                if not (request.num_preemptions and oversized):
                    break
            num_positions = min(pending, fit)
            if num_positions <= 0 or not ctx.schedule(request, num_positions):
                break
            if idx < len(waiting) and waiting[idx] is request:
                idx += 1  # scheduled but still waiting (never happens today; stay safe)

    def resume_swapped(self, ctx: StepContext) -> bool:
        """Swap requests back in FCFS; True if every swapped request is back."""
        for request in ctx.swapped:
            fit = ctx.token_budget_left // request.width
            num_positions = min(ctx.pending_positions(request), fit)
            if num_positions <= 0 or not ctx.schedule(request, num_positions):
                return False
        return True
