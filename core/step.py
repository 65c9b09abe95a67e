"""One scheduling step's context: the policy's read-only view of the queues and budgets, and
the mechanism behind ``StepContext.schedule`` (growth, preemption, admission, swap-in)."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from typing import Final

from core.batch import ScheduledBatch, ScheduledRequest
from core.block_allocator import BlockPair
from core.config import CacheConfig
from core.kv_manager import KVCacheManager, PagedKVManager, RangeCopy
from core.policies import Policy
from core.request import Request, RequestStatus


class StepHost:
    """What a step needs from its scheduler (``Scheduler`` is the one implementation; naming
    it here instead keeps the import one-way). A base class, where ``KVCacheManager`` and
    ``StepContext`` are protocols: a step reads these in its hot loop, and the compiled build
    reads a protocol's attributes generically (0.6-0.9% of its instructions;
    docs/compiled_core.md)."""

    policy: Policy
    cache_config: CacheConfig
    kv: KVCacheManager
    running: list[Request]
    waiting: deque[Request]
    swapped: deque[Request]
    arrivals_done: bool
    num_held_samples: int
    finishing: list[Request]
    # ``scheduling_policy="priority"``: the queues in `priority_order`, running in the order
    # requests joined it, preemption by lowest priority (`Step._pick_victim`).
    by_priority: bool

    def preempt(self, victim: Request, batch: ScheduledBatch) -> None:
        raise NotImplementedError


# A budget no step can use up (the policy set none).
_UNLIMITED: Final = (1 << 62) - 1


def commit_scheduled(kv: KVCacheManager, request: Request, computed_end: int, known: int) -> None:
    """As vLLM's ``allocate_slots``: once a step schedules ``request`` up to ``computed_end``
    tokens, the full blocks among them whose tokens are known (the first ``known``) enter the
    prefix cache, at schedule time, not when the step ends. The one place of this rule: the
    step (``Step``) and fast-forward's bulk steps both call it."""
    kv.commit(request, min(computed_end, known))


def arrival_order(request: Request) -> tuple[float, int]:
    """FCFS order: arrival time, then the order requests were added."""
    return (request.arrival_s, request.internal_idx)


def insert_by_arrival_into(queue: deque[Request], request: Request) -> None:
    """FCFS insert into a waiting or swapped queue; a preempted request lands ahead of
    everything that arrived later."""
    key = arrival_order(request)
    if not queue or arrival_order(queue[-1]) <= key:
        queue.append(request)  # an arrival: the common case
        return
    # A preempted request is older than most of the queue: search from the front.
    idx = 0
    while arrival_order(queue[idx]) <= key:
        idx += 1
    queue.insert(idx, request)


def priority_order(request: Request) -> tuple[int, float, str, int]:
    """vLLM's order under ``--scheduling-policy priority`` (its ``Request.__lt__``): priority,
    lower first, then arrival time, then request id; then the order requests were added."""
    return (request.priority, request.arrival_s, request.request_id, request.internal_idx)


def enqueue(queue: deque[Request], request: Request, by_priority: bool) -> None:
    """Put ``request`` in a waiting or swapped queue in the scheduling policy's order: by
    arrival (`insert_by_arrival_into`), or by `priority_order` as vLLM's heap pops them."""
    if by_priority:
        queue.insert(bisect_right(queue, priority_order(request), key=priority_order), request)
    else:
        insert_by_arrival_into(queue, request)


def join_running(running: list[Request], request: Request, by_priority: bool) -> None:
    """Add ``request`` to the running list: in arrival order under FCFS (which is the order
    vLLM appends them in, as FCFS admits and preempts by arrival), at the end under priority
    scheduling, where vLLM's running list keeps the order requests joined it."""
    if by_priority:
        running.append(request)
    else:
        insert_by_arrival(running, request)


def insert_by_arrival(running: list[Request], request: Request) -> None:
    """``bisect.insort(running, request, key=arrival_order)``, written out: the compiled build
    calls a key function through the interpreter at each comparison, 0.9% of a compiled
    chunked run's instructions (docs/compiled_core.md)."""
    arrival_s, idx = request.arrival_s, request.internal_idx
    lo, hi = 0, len(running)
    while lo < hi:
        mid = (lo + hi) // 2
        other = running[mid]
        if arrival_s < other.arrival_s or (
            arrival_s == other.arrival_s and idx < other.internal_idx
        ):
            hi = mid
        else:
            lo = mid + 1
    running.insert(lo, request)


class Step:
    """The ``StepContext`` of one ``Scheduler.schedule`` call."""

    def __init__(self, scheduler: StepHost, now_s: float, batch: ScheduledBatch) -> None:
        self.s = scheduler
        self._now_s = now_s
        self.batch = batch
        budget = scheduler.policy.token_budget()
        self._token_budget = budget if budget is not None else _UNLIMITED
        seqs = scheduler.policy.seq_budget()
        # Requests that finished in the step before still hold their slots (StepHost.finishing).
        finishing = scheduler.finishing
        held = sum(r.n for r in finishing) if finishing else 0
        self._seq_budget = seqs - held if seqs is not None else _UNLIMITED
        self._scheduled: set[int] = set()
        self._preempted: set[int] = set()
        self._range_copies = scheduler.cache_config.memory_model == "contiguous"
        self._hits: dict[int, Sequence[int]] = {}
        self._commit = scheduler.cache_config.enable_prefix_caching
        # Under priority scheduling a request already in the step can be preempted: the block
        # copies its scheduling added, by request, to take back then (`_unschedule`).
        self._copies_of: dict[int, tuple[list[BlockPair], list[RangeCopy]]] = {}

    # -- read-only view ----------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self._now_s

    @property
    def running(self) -> Sequence[Request]:
        return tuple(self.s.running)

    @property
    def waiting(self) -> Sequence[Request]:
        # The live queue, not a copy (it can be very long): admitting its head removes it.
        return self.s.waiting

    @property
    def swapped(self) -> Sequence[Request]:
        return tuple(self.s.swapped)

    @property
    def arrivals_done(self) -> bool:
        return self.s.arrivals_done

    @property
    def token_budget_left(self) -> int:
        return self._token_budget

    @property
    def preempted_any(self) -> bool:
        return bool(self.batch.preempted_ids)

    @property
    def num_held_samples(self) -> int:
        return self.s.num_held_samples

    def pending_positions(self, request: Request) -> int:
        pending = request.num_pending_positions
        if request.status is RequestStatus.WAITING:
            pending -= len(self._prefix_hits(request)) * self.s.kv.block_size
        return pending

    def add_padding(self, num_tokens: int) -> None:
        self.batch.num_padding_tokens += num_tokens

    def wake_at(self, when_s: float) -> None:
        current = self.batch.next_wakeup_s
        self.batch.next_wakeup_s = when_s if current is None else min(current, when_s)

    # -- acting ------------------------------------------------------------------------------

    def _prefix_hits(self, request: Request) -> Sequence[int]:
        hits = self._hits.get(request.internal_idx)
        if hits is None:
            hits = self._hits[request.internal_idx] = self.s.kv.prefix_hit_blocks(request)
        return hits

    def schedule(self, request: Request, num_positions: int) -> bool:
        idx = request.internal_idx
        if num_positions <= 0 or idx in self._scheduled or idx in self._preempted:
            return False
        status = request.status
        if not request.kv_ready:
            return False
        live = request.live_seq_ids
        if (
            num_positions == 1
            and status is RequestStatus.RUNNING
            and len(live) == 1
            and self._token_budget >= 1
            and self._seq_budget >= 1
            and request.num_computed_tokens + 1 == request.num_tokens
            and self.s.kv.grow_in_place(live[0])
        ):
            # The common case, kept short: one sequence decoding into room it already holds.
            self._record(request, 1, [], 1, 1)
            return True
        pending = request.num_pending_positions
        if status is RequestStatus.WAITING:
            pending -= len(self._prefix_hits(request)) * self.s.kv.block_size
        if num_positions > pending:
            raise ValueError(
                f"policy scheduled {num_positions} positions for {request.request_id!r}, "
                f"which has {pending} pending"
            )
        width = request.width
        seqs = len(request.live_seq_ids)  # a sample group counts whole, forked or not
        if num_positions * width > self._token_budget or seqs > self._seq_budget:
            return False
        copies: list[BlockPair] | None
        if status is RequestStatus.RUNNING:
            copies = self._grow_running(request, num_positions)
            if copies is None:
                return False
        elif status is RequestStatus.WAITING:
            if not self._admit(request, num_positions, pending):
                return False
            copies = []
        elif status is RequestStatus.SWAPPED:
            if not self.s.kv.can_swap_in(request, num_positions, watermark=bool(self.s.running)):
                return False
            self._swap_in(request)
            copies = self.s.kv.grow(request, num_positions)
        else:
            return False
        tables = self.batch.block_tables
        if tables is not None:
            # Admitted, grown, copied or swapped in: the executor gets the tables whole.
            for seq_id, table in zip(
                request.active_seq_ids, self.s.kv.block_tables(request), strict=True
            ):
                tables[seq_id] = tuple(table)
        self._record(request, num_positions, copies, width, seqs)
        return True

    def schedule_decodes(
        self, requests: Sequence[Request], in_order: bool = False
    ) -> list[Request]:
        """``schedule(request, 1)`` for each decoding request, in order (the same decisions,
        taken faster); returns the requests that are not decoding, in order. With
        ``in_order``, stops at the first request that is not decoding and returns it with
        every request after it, none of them scheduled."""
        others: list[Request] = []
        kv = self.s.kv
        grow_in_place = kv.grow_in_place
        # Paged memory's allocator, called directly: one call a decode instead of two, and in
        # the compiled build a C call (docs/compiled_core.md).
        alloc = kv.allocator if isinstance(kv, PagedKVManager) else None
        scheduled, preempted = self._scheduled, self._preempted
        requests_out = self.batch.requests
        running = RequestStatus.RUNNING
        commit = self._commit
        # Decodes the budgets leave room for on the short path (none with contiguous memory,
        # whose growth may copy ranges); kept in a local and handed back before any other call.
        room = 0 if self._range_copies else min(self._token_budget, self._seq_budget)
        taken = 0
        for idx, request in enumerate(requests):
            computed = request.num_computed_tokens
            prompt = request.num_prompt_tokens
            if computed < prompt or computed + 1 != prompt + request.num_output_tokens:
                if in_order:
                    self._take_decodes(taken)
                    return list(requests[idx:])
                others.append(request)
                continue
            live = request.live_seq_ids
            internal_idx = request.internal_idx
            if (
                taken < room
                and len(live) == 1
                and request.status is running
                and request.kv_ready
                and internal_idx not in scheduled
                and (not preempted or internal_idx not in preempted)
                and (
                    alloc.append_in_place(live[0]) if alloc is not None else grow_in_place(live[0])
                )
            ):
                scheduled.add(internal_idx)
                taken += 1
                requests_out.append(ScheduledRequest(request, 1, computed, (live[0],), False))
                if commit:
                    commit_scheduled(self.s.kv, request, computed + 1, request.num_tokens)
            else:
                self._take_decodes(taken)
                taken = 0
                self.schedule(request, 1)
                room = 0 if self._range_copies else min(self._token_budget, self._seq_budget)
        self._take_decodes(taken)
        return others

    def _take_decodes(self, count: int) -> None:
        """Charge ``count`` decodes scheduled on ``schedule_decodes``' short path to the
        budgets."""
        self._token_budget -= count
        self._seq_budget -= count

    def _grow_running(self, request: Request, num_positions: int) -> list[BlockPair] | None:
        kv = self.s.kv
        copies = kv.try_grow(request, num_positions)
        while copies is None:
            victim = self._pick_victim(request)
            self._preempted.add(victim.internal_idx)
            self.s.preempt(victim, self.batch)
            if victim is request:
                return None
            copies = kv.try_grow(request, num_positions)
        return copies

    def _pick_victim(self, request: Request) -> Request:
        """FCFS: the most recently arrived running request not already in this step. Priority
        scheduling: vLLM's ``max(running, key=(priority, arrival))``, the first such in running
        order, ``request`` included; one already in this step leaves it (`_unschedule`)."""
        if self.s.by_priority:
            victim: Request | None = None
            worst = (0, 0.0)
            for candidate in self.s.running:
                key = (candidate.priority, candidate.arrival_s)
                if candidate.kv_ready and (victim is None or key > worst):
                    victim, worst = candidate, key
            if victim is None:
                return request
            if victim is not request and victim.internal_idx in self._scheduled:
                self._unschedule(victim)
            return victim
        for candidate in reversed(self.s.running):
            if candidate.internal_idx not in self._scheduled and candidate.kv_ready:
                return candidate
        return request

    def _unschedule(self, request: Request) -> None:
        """Take ``request``, scheduled earlier in this step, out of it again (before it is
        preempted): its tokens and sequences go back to the budgets, as in vLLM, and the batch
        forgets its block copies and tables."""
        batch = self.batch
        for pos in range(len(batch.requests) - 1, -1, -1):
            entry = batch.requests[pos]
            if entry.request is request:
                del batch.requests[pos]
                self._token_budget += entry.num_new_tokens
                self._seq_budget += len(request.live_seq_ids)
                break
        self._scheduled.discard(request.internal_idx)
        copies, range_copies = self._copies_of.pop(request.internal_idx, ([], []))
        for pair in copies:
            batch.copies.remove(pair)
        for copy in range_copies:
            batch.range_copies.remove(copy)
        request.num_cow_copies -= len(copies)
        if batch.block_tables is not None:
            for seq_id in request.seq_ids:
                batch.block_tables.pop(seq_id, None)

    def _admit(self, request: Request, num_positions: int, pending: int) -> bool:
        kv = self.s.kv
        hits = self._prefix_hits(request)
        # As vLLM (scheduler_reserve_full_isl, on by default), admit only if the whole known
        # prompt fits, even when this step computes just a chunk: admitting on a chunk alone
        # thrashes under load. The watermark is kept free only while some request runs.
        if not kv.can_admit(request, pending, hits, watermark=bool(self.s.running)):
            return False
        kv.admit(request, num_positions, hits)
        hit_tokens = len(hits) * kv.block_size
        request.num_computed_tokens = hit_tokens
        request.num_prefix_hit_tokens += hit_tokens
        request.num_prefix_lookup_tokens += request.num_tokens
        if request.num_recomputed_tokens:
            # Hits on its own blocks after a recompute preemption are not recomputed.
            request.num_recomputed_tokens -= min(hit_tokens, request.num_recomputed_tokens)
        self.s.waiting.remove(request)
        self._to_running(request)
        if request.first_scheduled_s is None:
            request.first_scheduled_s = self._now_s
        return True

    def _swap_in(self, request: Request) -> None:
        pairs = self.s.kv.swap_in(request)
        self.batch.swap_in.extend(pairs)
        request.num_blocks_swapped_in += len(pairs)
        self.s.swapped.remove(request)
        self._to_running(request)

    def _to_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        join_running(self.s.running, request, self.s.by_priority)

    def _record(
        self,
        request: Request,
        num_positions: int,
        copies: list[BlockPair],
        width: int,
        seqs: int,
    ) -> None:
        batch = self.batch
        computed_end = request.num_computed_tokens + num_positions
        range_copies: list[RangeCopy] = []
        if copies:
            batch.copies.extend(copies)
            request.num_cow_copies += len(copies)
        if self._range_copies:
            range_copies = self.s.kv.take_range_copies(request)
            if range_copies:
                batch.range_copies.extend(range_copies)
        if (copies or range_copies) and self.s.by_priority:
            self._copies_of[request.internal_idx] = (copies, range_copies)
        if self._commit:
            # As vLLM's allocate_slots: full blocks of known tokens enter the prefix cache
            # when they are scheduled, not when the step ends.
            commit_scheduled(self.s.kv, request, computed_end, request.num_tokens)
        self._scheduled.add(request.internal_idx)
        self._token_budget -= num_positions * width
        self._seq_budget -= seqs
        computed = request.num_computed_tokens
        batch.requests.append(
            ScheduledRequest(
                request,
                num_positions,
                computed,
                tuple(request.live_seq_ids) if request.forked else (request.live_seq_ids[0],),
                num_positions > 1 or computed < request.num_prompt_tokens,
            )
        )
