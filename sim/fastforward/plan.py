"""Planning a run of identical steps (``RunPlan``): after a step, whether it will repeat
unchanged (decodes, plus at most one budget-sized prompt chunk) and how often; or, when the
next step is only the running decodes (plus one prompt chunk filling the budget), that step
built without running the policy. Reads the scheduler through its public members only."""

from __future__ import annotations

from dataclasses import dataclass

from core.batch import ScheduledBatch, ScheduledRequest
from core.kv_manager import PagedKVManager
from core.request import Request, RequestStatus
from core.scheduler import Scheduler
from sim.fastforward.growth import (
    UNBOUNDED,
    ChunkRun,
    RepeatShape,
    RequestGrowth,
)
from sim.fastforward.memory import RunMemory


@dataclass(frozen=True, slots=True, init=False)
class RunPlan:
    """Up to ``max_steps`` more steps exactly like ``batch`` (already executed and updated),
    if nothing arrives: what each request grows per step (``growth``, in batch order) and
    the same in aggregate (``shape``). ``step_idx`` is the scheduler's step counter when the
    plan was made (applying checks that no step ran since); ``next_waiting`` the waiting
    head then (memory snapshots look at it). ``decode_seq_ids``, when given, are the decodes'
    sequences in order, one each, ahead of any prompt chunk (the growth's last entry then):
    paged memory grows them on a shorter path. Only ``plan_repeat`` and ``plan_continuation``
    build one (``max_steps`` > 0, one growth per scheduled request), once per planned run,
    with the ``__init__`` written out (see ``RepeatShape``). A plan that ``plan_continuation``
    made without ``itemized`` has a batch with no ``requests``: ``growth`` still holds one
    entry for each."""

    batch: ScheduledBatch
    max_steps: int
    growth: tuple[RequestGrowth, ...]
    shape: RepeatShape
    step_idx: int
    next_waiting: Request | None
    decode_seq_ids: tuple[int, ...] | None

    def __init__(
        self,
        batch: ScheduledBatch,
        max_steps: int,
        growth: tuple[RequestGrowth, ...],
        shape: RepeatShape,
        step_idx: int,
        next_waiting: Request | None,
        decode_seq_ids: tuple[int, ...] | None = None,
    ) -> None:
        object.__setattr__(self, "batch", batch)
        object.__setattr__(self, "max_steps", max_steps)
        object.__setattr__(self, "growth", growth)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "step_idx", step_idx)
        object.__setattr__(self, "next_waiting", next_waiting)
        object.__setattr__(self, "decode_seq_ids", decode_seq_ids)


def plan_repeat(s: Scheduler, memory: RunMemory, batch: ScheduledBatch) -> RunPlan | None:
    """The run repeating ``batch`` (just executed and updated), or None if the next step
    cannot be the same.

    A steady step decodes one position for every running request, plus at most one prompt
    chunk that uses up the token budget, and moves no memory; the next one is then the same
    step again until a request finishes, the prompt reaches its last chunk or the cache runs
    out of blocks for growth. The run may end with the prompt's last chunk, alone or with the
    waiting head admitted in the budget it leaves (``RepeatShape.admit_step``).

    Long because it runs after every simulated step: its checks and the one pass that gathers
    the run's shape (decode phases, the chunk, sequence ids) stay in one frame, without a call
    per request.
    """
    if s.changed_since_schedule:
        return None
    if (
        not batch.requests
        or len(batch.requests) != len(s.running)
        or batch.copies
        or batch.range_copies
        or batch.swap_out
        or batch.swap_in
        or batch.preempted_ids
        or batch.finished
    ):
        return None
    requests = batch.requests
    last = requests[-1]
    if last.is_prefill and len(requests) > 1 and requests[-2].is_prefill:
        # Two prompts, scheduled after the decodes: most often one ending and the waiting
        # head's first chunk (chunked prefill). The loop below would say the same at its end.
        return None
    last_repeats = last.is_prefill and last.request.is_prefill and _repeatable_chunk(s, batch, last)
    if last.is_prefill and not last_repeats:
        # Most often a whole prompt (continuous batching), after the decodes: as above. (Two
        # prompts elsewhere in the batch are ruled out below: the second finds ``chunked``
        # taken.)
        return None
    limit = UNBOUNDED
    chunked: Request | None = None
    chunk = pending = 0
    running = RequestStatus.RUNNING
    grown: list[RequestGrowth] = []
    bs = s.kv.block_size
    phases = [0] * bs
    decode_seqs = decode_tokens = 0
    chunks: list[ChunkRun] = []
    # The decodes' sequences, one each, when the allocator's shorter path can grow them
    # (as ``plan_continuation`` gives them): else None.
    seq_ids: list[int] | None = [] if isinstance(s.kv, PagedKVManager) else None
    for scheduled in batch.requests:
        request = scheduled.request
        if request.status is not running:
            return None
        width = len(scheduled.seq_ids)
        outputs = request.num_output_tokens
        if (
            scheduled.num_positions == 1
            and not scheduled.is_prefill
            # One position pending: the sampled token (after the fork, for every sample).
            and request.num_computed_tokens + 1 == request.num_prompt_tokens + outputs
            and (request.forked or request.n == 1)
        ):
            if width != len(request.live_seq_ids):
                return None
            remaining = request.max_output_tokens - outputs
            if remaining < limit:
                limit = remaining
            grown.append((request, 1, UNBOUNDED))
            computed = request.num_computed_tokens
            phase = computed % bs
            phases[phase] = phases[phase] + width  # (typed: no generic in-place add)
            decode_seqs += width
            decode_tokens += computed * width
            if seq_ids is not None:
                if width == 1 and request.n == 1 and chunked is None:
                    seq_ids.append(scheduled.seq_ids[0])
                else:  # (several samples, or a decode after the chunk: the general path)
                    seq_ids = None
            continue
        if width != len(request.active_seq_ids):
            return None
        if (
            chunked is not None
            or not request.is_prefill  # its last chunk is done: it decodes from now on
            or not (last_repeats if scheduled is last else _repeatable_chunk(s, batch, scheduled))
        ):
            return None
        chunked = request
        chunk, pending = scheduled.num_positions, request.num_pending_positions
        grown.append((request, chunk, pending))
        chunks.append((chunk, request.num_computed_tokens, pending, width))
        if request.n != 1:
            seq_ids = None
    shape = RepeatShape(decode_seqs, decode_tokens, tuple(phases), tuple(chunks))
    decode_seq_ids = tuple(seq_ids) if seq_ids is not None else None
    return _plan(s, memory, batch, limit, grown, shape, chunked, chunk, pending, decode_seq_ids)


def plan_continuation(s: Scheduler, memory: RunMemory, itemized: bool = True) -> RunPlan | None:
    """The run of the step ``schedule`` would produce now, built without running the policy,
    when that step is every running request decoding one position, plus (with a policy that
    ``continues_chunks``) at most one running prompt taking the rest of the token budget as
    its chunk, and nothing else, and when it repeats; else None (the policy must schedule
    the next step). The plan's batch stands for that step as if it had just run; without
    ``itemized`` its ``requests`` stay empty (the plan's ``growth`` and ``shape`` say the
    same), for a caller that needs only those: one ``ScheduledRequest`` fewer a request.

    Long for the reason ``plan_repeat`` is: asked before every policy run, it decides in one
    pass over the running requests, without a call per request."""
    policy = s.policy
    if (
        not policy.continues_decodes
        or not s.running
        or s.changed_since_schedule
        or s.incoming
        or s.held
        or s.swapped
    ):
        return None
    seq_budget = policy.seq_budget()
    budget = policy.token_budget()
    if budget is None or (seq_budget is not None and len(s.running) > seq_budget):
        return None
    head_fits = bool(s.waiting) and _head_fits(s)
    if head_fits and _head_may_join(s, budget):
        return None
    running = RequestStatus.RUNNING
    limit = UNBOUNDED
    grown: list[RequestGrowth] = []
    prompt: Request | None = None
    bs = s.kv.block_size
    phases = [0] * bs
    decode_tokens = 0
    # As if the step that computed each one's last positions had just run.
    requests: list[ScheduledRequest] = []
    seq_ids: list[int] = []
    for request in s.running:
        live = request.live_seq_ids
        if (
            len(live) != 1  # samples may share a tail block: the step would copy it
            or request.status is not running
            or not request.kv_ready
        ):
            return None
        outputs = request.num_output_tokens
        computed = request.num_computed_tokens
        prompt_tokens = request.num_prompt_tokens
        if (
            computed >= prompt_tokens
            and computed + 1 == prompt_tokens + outputs
            and (request.forked or request.n == 1)
        ):
            remaining = request.max_output_tokens - outputs
            if remaining < limit:
                limit = remaining
            grown.append((request, 1, UNBOUNDED))
            phase = computed % bs
            phases[phase] = phases[phase] + 1
            decode_tokens += computed
            if itemized:
                requests.append(ScheduledRequest(request, 1, computed - 1, (live[0],), False))
            seq_ids.append(live[0])
        elif prompt is None and policy.continues_chunks and request.n == 1:
            prompt = request
        else:
            return None
    decode_seqs = len(grown)
    chunk = budget - decode_seqs
    if chunk <= 0:
        return None
    chunks: tuple[ChunkRun, ...] = ()
    pending = 0
    if prompt is not None:
        # Decodes go first; the prompt's chunk fills the budget (``_plan`` decides what
        # happens at its last chunk, which leaves budget to the waiting head).
        pending = prompt.num_pending_positions
        if pending <= 0:
            return None
        computed = prompt.num_computed_tokens
        grown.append((prompt, chunk, pending))
        chunks = ((chunk, computed, pending, 1),)
        if itemized:
            requests.append(
                ScheduledRequest(prompt, chunk, computed - chunk, (prompt.live_seq_ids[0],), True)
            )
    elif head_fits:
        return None  # decodes alone would leave budget to the head
    batch = ScheduledBatch(
        step_idx=s.step_idx - 1,
        now_s=s.step_end_s[-1] if s.step_end_s else 0.0,
        requests=requests,
        num_running=len(s.running),
        num_waiting=len(s.waiting),
    )
    shape = RepeatShape(decode_seqs, decode_tokens, tuple(phases), chunks)
    return _plan(s, memory, batch, limit, grown, shape, prompt, chunk, pending, tuple(seq_ids))


def _head_fits(s: Scheduler) -> bool:
    """Whether the waiting head could get in: memory only shrinks while the running requests
    grow, so one that does not fit now never fits during the run. With prefix caching its
    hits could grow as blocks fill, so it is taken to fit."""
    head = s.waiting[0]
    return s.cache_config.enable_prefix_caching or s.kv.can_admit(
        head, head.num_pending_positions, ()
    )


def _head_may_join(s: Scheduler, budget: int) -> bool:
    """Whether the waiting head, which fits (``_head_fits``), may join the next step, so that
    only the policy can build it: when no prompt chunk filling the budget keeps it out. The
    latest runner is that prompt if there is one; if its next chunk is its last, the head
    most likely joins that step: a step the policy schedules as cheaply as this would."""
    last = s.running[-1]
    return last.num_computed_tokens >= last.num_prompt_tokens or (
        last.num_pending_positions <= budget - (len(s.running) - 1)
    )


def _plan(
    s: Scheduler,
    memory: RunMemory,
    batch: ScheduledBatch,
    limit: int,
    grown: list[RequestGrowth],
    shape: RepeatShape,
    chunked: Request | None,
    chunk: int,
    pending: int,
    decode_seq_ids: tuple[int, ...] | None = None,
) -> RunPlan | None:
    """The plan with decodes that may run ``limit`` more steps, growing as ``grown`` says,
    and the prompt ``chunked`` (if any) taking ``chunk`` of its ``pending`` positions per
    step: up to the prompt's last chunk if nothing else could join then, and as far as
    memory lets everyone grow."""
    if chunked is not None:
        last = -(-pending // chunk)  # the step with its last (maybe shorter) chunk
        if limit >= last:  # (else a decode finishes first: the run stops there)
            last_chunk = pending - (last - 1) * chunk
            repeats, positions = _last_chunk(s, memory, chunked, grown, shape, last, last_chunk)
            limit = last if repeats else last - 1
            if positions:
                # That step also admits the waiting head, with the budget the chunk leaves.
                shape = shape.admitting(last - 1, positions, s.waiting[0])
    if limit <= 0:
        return None
    max_steps = memory.growth_capacity(grown, limit, shape)
    if max_steps <= 0:
        return None
    head = s.waiting[0] if s.waiting else None
    return RunPlan(batch, max_steps, tuple(grown), shape, s.step_idx, head, decode_seq_ids)


def _last_chunk(
    s: Scheduler,
    memory: RunMemory,
    request: Request,
    grown: list[RequestGrowth],
    shape: RepeatShape,
    last: int,
    last_chunk: int,
) -> tuple[bool, int]:
    """Whether the step with ``request``'s last prompt chunk (repeat ``last``, of
    ``last_chunk`` positions) still belongs to the run, and the positions the waiting head
    is admitted with in that step (0: none).

    The chunk leaves budget to the waiting head. The step is the same batch again if the head
    cannot get in with the memory left once that step has grown everyone; it is the same batch
    plus exactly the head's first chunk if the head gets in with a prompt longer than the
    budget left (so nothing else can join) and is new (one sample, nothing computed, never
    preempted). Anything else is left to the policy, as is a recompute's last chunk (its last
    position would be a decode) and any step with requests swapped out or prefix caching on
    (the head's hits grow as the prompt's blocks are cached).
    """
    if request.n != 1 or request.num_output_tokens or s.swapped:
        return False, 0
    if not s.waiting:
        return True, 0
    if s.cache_config.enable_prefix_caching:
        return False, 0
    head = s.waiting[0]
    pending = head.num_pending_positions
    if not s.kv.can_admit(head, pending, ()):
        return True, 0  # no room now, and growth only takes memory away
    if not memory.can_admit_after(head, pending, (), grown, last, shape):
        return True, 0
    policy = s.policy
    budget = policy.token_budget()
    seq_budget = policy.seq_budget()
    room = (budget or 0) - shape.decode_seqs - last_chunk
    if (
        not policy.continues_chunks  # (continuous admits whole prompts only)
        or not isinstance(s.kv, PagedKVManager)
        or room <= 0
        or pending <= room
        or head.n != 1
        or head.num_preemptions
        or head.num_computed_tokens
        or not head.kv_ready
        or (seq_budget is not None and shape.decode_seqs + 2 > seq_budget)
    ):
        return False, 0
    return True, room


def _repeatable_chunk(s: Scheduler, batch: ScheduledBatch, scheduled: ScheduledRequest) -> bool:
    budget = s.policy.token_budget()
    return (
        s.policy.repeats_budget_chunks
        and budget is not None
        and len(scheduled.seq_ids) == 1
        and scheduled.is_prefill
        and batch.num_batched_tokens == budget
    )
