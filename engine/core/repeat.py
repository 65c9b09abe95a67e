"""Skipping ahead exactly: when the step just run will repeat unchanged (decodes, plus at most
one budget-sized prompt chunk), apply many such steps at once with the same outcome as
scheduling them one by one; and when the next step is only the running decodes (plus one
prompt chunk filling the budget), build it without running the policy (``continuation``) so
it can be repeated at once too. ``Scheduler`` exposes these as methods."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.core.batch import ScheduledBatch, ScheduledRequest
from engine.core.growth import Growth, RepeatShape
from engine.core.kv_manager import PagedKVManager
from engine.core.memory import MemorySnapshot
from engine.core.request import Request, RequestStatus
from engine.core.step import arrival_order

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler

_NEVER = 1 << 62  # positions left for a decode: it grows until it finishes


def repeat_limit(s: Scheduler, batch: ScheduledBatch) -> int:
    """How many more steps exactly like ``batch`` the scheduler would now produce if nothing
    arrives: 0 unless ``batch`` (already updated) was a steady step.

    A steady step decodes one position for every running request, plus at most one prompt
    chunk that uses up the token budget, and moves no memory; the next one is then the same
    step again until a request finishes, the prompt reaches its last chunk or the cache runs
    out of blocks for growth. The run may end with the prompt's last chunk, alone or with the
    waiting head admitted in the budget it leaves (``repeat_shape`` says which). Repeating in
    bulk (``repeat``) gives the same state as scheduling step by step, which is what lets a
    simulator skip ahead exactly.
    """
    if s._changed_since_schedule:
        return 0
    if batch is s._continued and s._repeat_checked[0] == batch.step_idx:
        return s._repeat_checked[1]  # checked when ``continuation`` built it
    s._repeat_growth = []
    s._repeat_checked = (batch.step_idx, _steady_limit(s, batch))
    return s._repeat_checked[1]


def _checked_growth(s: Scheduler, batch: ScheduledBatch) -> list[Growth]:
    """``growth(batch)``, kept from the ``repeat_limit`` call that allowed the repeat."""
    if s._repeat_checked[0] == batch.step_idx and s._repeat_growth:
        return s._repeat_growth
    return growth(batch)


def repeat_shape(s: Scheduler, batch: ScheduledBatch) -> RepeatShape:
    """The aggregate shape of repeating ``batch``, kept from the ``repeat_limit`` call that
    allowed the repeat (call before ``repeat``)."""
    if s._repeat_checked[0] == batch.step_idx and s._repeat_growth:
        return s._repeat_shape
    bs = s.kv.block_size
    shape = RepeatShape(0, 0, [0] * bs, [])
    for scheduled, (request, per_step, left) in zip(batch.requests, growth(batch), strict=True):
        width = len(scheduled.seq_ids)
        computed = request.num_computed_tokens
        if left == _NEVER:
            shape.decode_seqs += width
            shape.decode_tokens += computed * width
            shape.decode_phases[computed % bs] += width
        else:
            shape.chunks.append((per_step, computed, left, width))
    return shape


def _steady_limit(s: Scheduler, batch: ScheduledBatch) -> int:
    """Repeats allowed for ``batch``: one position per decoding request, plus at most one
    prompt chunk that used up the step's token budget (the policy would cut the same chunk
    again), up to that prompt's last chunk if nothing else could join then."""
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
        return 0
    if sum([scheduled.is_prefill for scheduled in batch.requests]) > 1:
        return 0  # two prompts in one step: the next step cannot be the same
    limit = 1 << 62
    chunked: Request | None = None
    chunk = pending = 0
    running = RequestStatus.RUNNING
    grown: list[Growth] = []
    bs = s.kv.block_size
    phases = [0] * bs
    decode_seqs = decode_tokens = 0
    chunks: list[tuple[int, int, int, int]] = []
    for scheduled in batch.requests:
        request = scheduled.request
        if request.status is not running:
            return 0
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
                return 0
            remaining = request.max_output_tokens - outputs
            if remaining < limit:
                limit = remaining
            grown.append((request, 1, _NEVER))
            computed = request.num_computed_tokens
            phases[computed % bs] += width
            decode_seqs += width
            decode_tokens += computed * width
            continue
        if width != len(request.active_seq_ids):
            return 0
        if (
            chunked is not None
            or not request.is_prefill  # its last chunk is done: it decodes from now on
            or not _repeatable_chunk(s, batch, scheduled)
        ):
            return 0
        chunked = request
        chunk, pending = scheduled.num_positions, request.num_pending_positions
        grown.append((request, chunk, pending))
        chunks.append((chunk, request.num_computed_tokens, pending, width))
    shape = RepeatShape(decode_seqs, decode_tokens, phases, chunks)
    return _allowed(s, limit, grown, shape, chunked, chunk, pending)


def _allowed(
    s: Scheduler,
    limit: int,
    grown: list[Growth],
    shape: RepeatShape,
    chunked: Request | None,
    chunk: int = 0,
    pending: int = 0,
) -> int:
    """Repeats allowed with decodes that may run ``limit`` more steps, growing as ``grown``
    says, and the prompt ``chunked`` (if any) taking ``chunk`` of its ``pending`` positions
    per step: up to the prompt's last chunk if nothing else could join then, and as far as
    memory lets everyone grow."""
    if chunked is not None:
        last = -(-pending // chunk)  # the step with its last (maybe shorter) chunk
        if limit >= last:  # (else a decode finishes first: the run stops there)
            last_chunk = pending - (last - 1) * chunk
            repeats, positions = _last_chunk(s, chunked, grown, shape, last, last_chunk)
            limit = last if repeats else last - 1
            if positions:
                # That step also admits the waiting head, with the budget the chunk leaves.
                shape.admit_step = last - 1
                shape.admit_positions = positions
                shape.admit_request = s.waiting[0]
    if limit <= 0:
        return 0
    s._repeat_growth = grown
    s._repeat_shape = shape
    return s.kv.growth_capacity(grown, limit, shape)


def continuation(s: Scheduler) -> ScheduledBatch | None:
    """The step ``schedule`` would produce now, built without running the policy, when that
    step is every running request decoding one position, plus (with a policy that
    ``continues_chunks``) at most one running prompt taking the rest of the token budget as
    its chunk, and nothing else, and when it repeats (see ``repeat_limit``); else None
    (then the policy must schedule the next step).

    The batch stands for that step as if it had just run, as ``repeat_limit`` and ``repeat``
    expect: a driver repeats it at once instead of scheduling it in full. Nothing is changed
    here.
    """
    policy = s.policy
    if (
        not policy.continues_decodes
        or not s.running
        or s._changed_since_schedule
        or s._to_release
        or s.incoming
        or s.held
        or s.swapped
    ):
        return None
    seq_budget = policy.seq_budget()
    budget = policy.token_budget()
    if budget is None or (seq_budget is not None and len(s.running) > seq_budget):
        return None
    # Whether the waiting head could get in: memory only shrinks while the running requests
    # grow, so one that does not fit now never fits during the repeats. With prefix caching
    # its hits could grow as blocks fill, so it is taken to fit.
    head_fits = False
    if s.waiting:
        head = s.waiting[0]
        head_fits = s.cache_config.enable_prefix_caching or s.kv.can_admit(
            head, head.num_pending_positions, ()
        )
    if head_fits:
        # Then only a prompt chunk filling the budget keeps the head out. The latest runner
        # is that prompt if there is one; if its next chunk is its last, the head most
        # likely joins that step: a step the policy schedules as cheaply as this would.
        last = s.running[-1]
        if last.num_computed_tokens >= last.num_prompt_tokens or (
            last.num_pending_positions <= budget - (len(s.running) - 1)
        ):
            return None
    running = RequestStatus.RUNNING
    limit = 1 << 62
    grown: list[Growth] = []
    prompt: Request | None = None
    pending = 0
    bs = s.kv.block_size
    phases = [0] * bs
    decode_tokens = 0
    # As if the step that computed each one's last positions had just run.
    requests: list[ScheduledRequest] = []
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
            grown.append((request, 1, _NEVER))
            phases[computed % bs] += 1
            decode_tokens += computed
            requests.append(ScheduledRequest(request, 1, computed - 1, (live[0],), False))
        elif prompt is None and policy.continues_chunks and request.n == 1:
            prompt = request
        else:
            return None
    decode_seqs = len(grown)
    chunk = budget - decode_seqs
    if chunk <= 0:
        return None
    shape = RepeatShape(decode_seqs, decode_tokens, phases, [])
    if prompt is not None:
        # Decodes go first; the prompt's chunk fills the budget (``_allowed`` decides what
        # happens at its last chunk, which leaves budget to the waiting head).
        pending = prompt.num_pending_positions
        if pending <= 0:
            return None
        computed = prompt.num_computed_tokens
        grown.append((prompt, chunk, pending))
        shape.chunks.append((chunk, computed, pending, 1))
        requests.append(
            ScheduledRequest(prompt, chunk, computed - chunk, (prompt.live_seq_ids[0],), True)
        )
    elif head_fits:
        return None  # decodes alone would leave budget to the head
    limit = _allowed(s, limit, grown, shape, prompt, chunk, pending)
    if limit <= 0:
        return None
    batch = ScheduledBatch(
        step_idx=s.step_idx - 1,
        now_s=s.step_end_s[-1] if s.step_end_s else 0.0,
        requests=requests,
        num_running=len(s.running),
        num_waiting=len(s.waiting),
    )
    s._repeat_checked = (batch.step_idx, limit)
    s._continued = batch
    return batch


def growth(batch: ScheduledBatch) -> list[Growth]:
    """(request, positions per repeated step, positions left in its phase) for each."""
    return [
        (
            s.request,
            s.num_positions,
            s.request.num_pending_positions if s.is_prefill else _NEVER,
        )
        for s in batch.requests
    ]


def _last_chunk(
    s: Scheduler,
    request: Request,
    grown: list[Growth],
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
    if not s.kv.can_admit_after(head, pending, (), grown, last, shape):
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


def repeat(s: Scheduler, batch: ScheduledBatch, step_end_s: Sequence[float]) -> list[Request]:
    """Apply ``len(step_end_s)`` more steps identical to ``batch`` (see ``repeat_limit``),
    ending at the given times; returns the requests that finished.

    Requests that arrived during the last of these steps wait for the next ``schedule``.
    """
    count = len(step_end_s)
    checked_step, limit = s._repeat_checked
    if checked_step != batch.step_idx or not 0 < count <= limit:
        raise ValueError(f"cannot repeat this batch {count} times (ask repeat_limit first)")
    grown = _checked_growth(s, batch)
    shape = repeat_shape(s, batch)
    s._repeat_checked = (-1, 0)
    s._continued = None
    first_idx = len(s.step_end_s)
    s.step_end_s.extend(step_end_s)
    finished: list[Request] = []
    # Everyone grows before anyone samples a first token or finishes, as in the steps
    # themselves: those requests are dealt with after the loop. A decode that goes on is
    # done in the loop (what _sample and TokenTimeline.add do, inlined for speed), unless
    # blocks are committed to the prefix cache: commits keep the requests' order.
    kv = s.kv
    grow = kv.grow
    # One sequence growing in a paged cache: straight to the allocator (one call less each).
    append = kv.allocator.append_slots if isinstance(kv, PagedKVManager) else None
    commit = s.cache_config.enable_prefix_caching
    last_idx = first_idx + count - 1
    last_s = step_end_s[-1]
    later: list[tuple[Request, int, int]] = []
    for request, per_step, left in grown:
        num_positions = min(count * per_step, left)
        if append is not None and not request.forked:
            append(request.live_seq_ids[0], num_positions)
        else:
            grow(request, num_positions)
        if left == _NEVER and not commit:  # a decode
            outputs = request.num_output_tokens + count
            if outputs < request.max_output_tokens and request.first_token_s is not None:
                request.num_computed_tokens += num_positions
                request.num_output_tokens = outputs
                tokens = request.tokens
                counts = tokens.run_counts
                if counts and tokens.run_starts[-1] + counts[-1] == first_idx:
                    counts[-1] += count
                    tokens.last_s = last_s
                    tokens.num_emissions += count
                else:
                    tokens.add(first_idx, count)
                continue
        later.append((request, left, num_positions))
    if shape.admit_step < count:
        _admit_head(s, shape, s.step_end_s[first_idx + count - 2])
    for request, left, num_positions in later:
        request.num_computed_tokens += num_positions
        if left == _NEVER:
            s._sample(request, None, first_idx, count)
        elif request.num_computed_tokens == request.num_tokens:
            s._sample(request, None, last_idx)  # its prompt's last chunk
        if commit:
            # Step-by-step, each step registers its blocks when it is scheduled (Step.commit);
            # at the end of the run that is every full block computed so far.
            s.kv.commit(request, request.num_computed_tokens)
        if not request.live_seq_ids:
            s._finish(request, last_s, finished)
    if not s.running and s.held:
        finished.extend(s._release_held(step_end_s[-1]))
    s.step_idx += count
    return finished


def _admit_head(s: Scheduler, shape: RepeatShape, start_s: float) -> None:
    """The admission a repeat's last step folds in (see ``_admission_at``), as ``Step``
    would make it in the step starting at ``start_s``, and that step's computing of the
    head's first chunk."""
    head = shape.admit_request
    if head is None or not s.waiting or s.waiting[0] is not head:
        raise RuntimeError("the waiting head this repeat was to admit is no longer waiting")
    positions = shape.admit_positions
    s.kv.admit(head, positions, ())
    s.waiting.popleft()
    head.status = RequestStatus.RUNNING
    bisect.insort(s.running, head, key=arrival_order)
    if head.first_scheduled_s is None:
        head.first_scheduled_s = start_s
    head.num_computed_tokens = positions


def repeat_tokens(s: Scheduler, batch: ScheduledBatch, count: int) -> tuple[int, int]:
    """(prompt tokens, decode tokens) that ``count`` repeats of ``batch`` compute (call
    before ``repeat``)."""
    shape = repeat_shape(s, batch)
    prefill = sum(min(count * per_step, left) * seqs for per_step, _, left, seqs in shape.chunks)
    if shape.admit_step < count:
        prefill += shape.admit_positions
    return prefill, count * shape.decode_seqs


def repeat_memory_sum(
    s: Scheduler, batch: ScheduledBatch, count: int, next_waiting: Request | None
) -> MemorySnapshot:
    """The sum of the memory snapshots ``count`` repeats of ``batch`` take (call before
    ``repeat``; ``next_waiting`` is the waiting head when they started): what a
    step-by-step record would add up to."""
    return s.kv.repeat_memory_sum(
        _checked_growth(s, batch), count, next_waiting, repeat_shape(s, batch)
    )
