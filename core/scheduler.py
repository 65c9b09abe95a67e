"""The scheduler: waiting / running / swapped queues and the mechanism every policy shares —
admission, allocation, preemption (recompute or swap), forking, finishing and aborting."""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence

from core.batch import ScheduledBatch, StepResult
from core.config import CacheConfig, SchedulerConfig
from core.contiguous_allocator import ContiguousKVManager
from core.kv_manager import KVCacheManager, PagedKVManager
from core.kv_state import KVState
from core.memory import MemorySnapshot
from core.parallel_sampling import SampleGroup, fan_out
from core.policies import Policy, make_policy
from core.request import Request, RequestStatus, TokenTimeline
from core.step import Step, StepHost, enqueue, join_running


def make_kv_manager(config: CacheConfig) -> KVCacheManager:
    if config.memory_model == "paged":
        return PagedKVManager(config)
    return ContiguousKVManager(config)


class Scheduler(StepHost):
    """Drives one replica's requests through schedule → execute → update.

    The scheduler never reads a clock: every entry point takes ``now_s``. ``update`` gets the
    time the step *ended*. With ``record_block_tables`` (paged memory only) each batch names
    the block tables that changed (``ScheduledBatch.block_tables``), for an executor that
    keeps them between steps.

    With ``release_finished_late`` (vLLM's async scheduling, where step n + 1 is scheduled
    before step n's result is known), a request that finishes keeps its sequence slot and KV
    blocks through the next ``schedule``: vLLM skips it there but still counts it as running,
    and frees it only once it learns the step's result.
    """

    def __init__(
        self,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        policy: Policy | None = None,
        record_block_tables: bool = False,
        release_finished_late: bool = False,
    ) -> None:
        cache_config.check_resolved()
        if record_block_tables and cache_config.memory_model != "paged":
            raise ValueError(
                f"record_block_tables needs paged memory, got {cache_config.memory_model!r}"
            )
        self.cache_config = cache_config
        self.config = scheduler_config
        self.policy = policy if policy is not None else make_policy(scheduler_config)
        self.kv = make_kv_manager(cache_config)
        self.by_priority = scheduler_config.scheduling_policy == "priority"
        self.waiting: deque[Request] = deque()
        # FCFS: sorted by arrival, the tail preempted first (priority: in the order they joined)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.held: list[Request] = []  # finished, but keeping memory until the batch ends
        self.kv_held: dict[str, Request] = {}  # finished prefills whose KV is being sent
        self.release_finished_late = release_finished_late
        self.finishing: list[Request] = []  # finished, freed after the next schedule
        self.incoming: deque[Request] = deque()  # decode side: waiting for room for their KV
        self._to_release: list[str] = []
        self.arrivals_done = False
        self.step_idx = 0
        self.num_held_samples = 0
        self._requests: dict[str, Request] = {}
        # Fanned-out requests (n > 1 under ``parallel_sampling="fan_out"``): by child id.
        self._groups: dict[str, SampleGroup] = {}
        self._parents: dict[str, SampleGroup] = {}
        # End time of every executed step; token timelines point into it.
        self.step_end_s: array[float] = array("d")
        self._changed_since_schedule = False  # an arrival or abort the last schedule missed
        self._next_seq_id = 0
        self._next_internal_idx = 0
        self.record_block_tables = record_block_tables
        # Requests whose tables changed outside a step (forks, KV transfers), for the next batch.
        self._changed_tables: list[Request] = []

    # -- arrivals and removal --------------------------------------------------------------

    def add_request(self, request: Request, now_s: float) -> bool:
        """Queue ``request``; False if it is rejected (``request.reject_reason`` says why).
        With n > 1 and ``parallel_sampling="fan_out"`` its n children are queued instead, and
        ``update`` returns the request itself once they have all finished."""
        if request.n > 1 and self.config.parallel_sampling == "fan_out":
            return self._fan_out(request, now_s)
        return self._queue(request, now_s)

    def _fan_out(self, parent: Request, now_s: float) -> bool:
        if parent.request_id in self._parents or parent.request_id in self._requests:
            raise ValueError(f"request id {parent.request_id!r} is already in the scheduler")
        if parent.status is not RequestStatus.WAITING or parent.seq_ids:
            raise ValueError(f"request {parent.request_id!r} was already added somewhere")
        children = fan_out(parent)
        reason = self.rejection_reason(children[0])  # (all n alike)
        if reason is not None:
            parent.status = RequestStatus.REJECTED
            parent.reject_reason = reason
            parent.finish_s = now_s
            return False
        for child in children:
            self._queue(child, now_s)
            child.prompt_idx = children[0].internal_idx  # one prompt, content known or not
        group = SampleGroup(parent, children)
        self._parents[parent.request_id] = group
        for child in children:
            self._groups[child.request_id] = group
        return True

    def _queue(self, request: Request, now_s: float) -> bool:
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        if request.status is not RequestStatus.WAITING or request.seq_ids:
            raise ValueError(f"request {request.request_id!r} was already added somewhere")
        request.internal_idx = self._next_internal_idx
        self._next_internal_idx += 1
        reason = self.rejection_reason(request)
        if reason is not None:
            request.status = RequestStatus.REJECTED
            request.reject_reason = reason
            request.finish_s = now_s
            return False
        request.tokens = TokenTimeline(self.step_end_s)
        request.seq_ids = list(range(self._next_seq_id, self._next_seq_id + request.n))
        request.live_seq_ids = list(request.seq_ids)
        self._next_seq_id += request.n
        self._requests[request.request_id] = request
        enqueue(self.waiting, request, self.by_priority)
        # Policies admit in the queue's order and stop at the first waiting request that does
        # not fit, so an arrival behind a waiting head cannot change the next step.
        if self.waiting[0] is request:
            self._changed_since_schedule = True
        return True

    def cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens of ``request`` this replica's prefix cache holds now (for routing)."""
        return self.kv.cached_prefix_tokens(request)

    def refusal(self, request: Request) -> str | None:
        """Why ``add_request`` would reject ``request`` (None if it would queue it): the
        reason of ``rejection_reason``, for one child where n > 1 fans out."""
        if request.n > 1 and self.config.parallel_sampling == "fan_out":
            return self.rejection_reason(fan_out(request)[0])
        return self.rejection_reason(request)

    def rejection_reason(self, request: Request) -> str | None:
        """Why this replica could never serve ``request`` (None if it can)."""
        max_len = self.cache_config.resolved_max_model_len
        if request.max_total_tokens > max_len:
            return (
                f"prompt {request.num_prompt_tokens} + max output {request.max_output_tokens} "
                f"tokens exceeds the model's max length {max_len}"
            )
        return self.kv.rejection_reason(request) or self.policy.rejection_reason(request)

    # -- disaggregated serving: KV handed from a prefill replica to a decode replica ----------

    def release_kv(self, request_id: str) -> None:
        """Prefill side: the finished request's KV has been sent; its blocks are freed when
        the next step is scheduled (nothing looks at memory in between)."""
        if request_id not in self.kv_held:
            raise ValueError(f"request {request_id!r} holds no KV here")
        self._to_release.append(request_id)
        self._changed_since_schedule = True

    @property
    def changed_since_schedule(self) -> bool:
        """Whether something (an arrival at the head of the queue, a transfer, a release)
        happened since the last ``schedule`` that could change the next step."""
        return self._changed_since_schedule

    def add_transferred(self, request: Request, first_token_s: float, now_s: float) -> bool:
        """Decode side: a request whose prompt was computed (and first token sampled at
        ``first_token_s``) elsewhere. It waits in ``incoming`` until its KV fits; the step that
        reserves the blocks lists it in ``batch.transfers``, and it runs once ``kv_arrived``.
        Returns False if it could never fit here (``request.reject_reason``). Its n samples
        fork the KV that came once, whatever ``parallel_sampling`` says."""
        if not self._queue(request, now_s):
            return False
        self.waiting.remove(request)
        request.kv_ready = False
        request.num_output_tokens = 1
        request.first_token_s = first_token_s
        request.tokens.add_external_first(first_token_s)
        self.incoming.append(request)
        self._changed_since_schedule = True
        return True

    def kv_arrived(self, request_id: str) -> None:
        """Decode side: the request's KV is in its blocks; it may decode from the next step."""
        self._requests[request_id].kv_ready = True
        self._changed_since_schedule = True

    def _reserve_incoming(self, batch: ScheduledBatch) -> None:
        """Reserve blocks for transferred requests, FCFS, while they fit (with the watermark
        while something runs)."""
        while self.incoming:
            request = self.incoming[0]
            known = request.num_prompt_tokens  # KV arriving; the first token is computed here
            if not self.kv.can_admit(request, known + 1, (), watermark=bool(self.running)):
                return
            self.incoming.popleft()
            self.kv.admit(request, known, ())
            request.num_computed_tokens = known
            request.status = RequestStatus.RUNNING
            if request.n > 1:
                self.kv.fork(request)
                request.forked = True
            join_running(self.running, request, self.by_priority)
            batch.transfers.append(request)
            if self.record_block_tables:
                self._changed_tables.append(request)

    def mark_arrivals_done(self) -> None:
        """No more requests will arrive (static batching then runs a partial last batch)."""
        self.arrivals_done = True

    def abort(self, request_id: str, now_s: float) -> Request | None:
        """Stop a request wherever it is and free everything it holds (a fanned-out
        request: each of its children)."""
        group = self._parents.pop(request_id, None)
        if group is not None:
            for child in group.children:
                self._groups.pop(child.request_id, None)
                self.abort(child.request_id, now_s)
            group.abort(now_s)
            return group.parent
        request = self._requests.pop(request_id, None)
        if request is None:
            return None
        for queue in (self.waiting, self.swapped, self.incoming):
            if request in queue:
                queue.remove(request)
        if request in self.held:
            self.held.remove(request)
        if request in self.running:
            self.running.remove(request)
        if self.policy.holds_until_batch_end:
            self.num_held_samples -= len(request.seq_ids) - len(request.live_seq_ids)
        request.status = RequestStatus.ABORTED
        request.finish_s = now_s
        self._changed_since_schedule = True
        self.kv.free(request)
        return request

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- one step ----------------------------------------------------------------------------

    def schedule(self, now_s: float) -> ScheduledBatch:
        """Decide the next step. A batch comes back empty only if nothing can run now.

        Requests that end during scheduling (a static batch whose last runner was preempted
        releases its finished members) are listed in ``batch.finished``; ``update`` returns
        them, so drivers call ``update`` for every batch, empty ones included.
        """
        batch = ScheduledBatch(step_idx=self.step_idx, now_s=now_s)
        if self.record_block_tables:
            batch.block_tables = {}
        self._changed_since_schedule = False
        for request_id in self._to_release:
            self.kv.free(self.kv_held.pop(request_id))
        self._to_release.clear()
        if self.incoming:
            self._reserve_incoming(batch)
        while True:
            if not self.running and self.held:
                batch.finished.extend(self.release_held(now_s))
            num_preempted = len(batch.preempted_ids)
            self.policy.schedule(Step(self, now_s, batch))
            # Preempting the last runner of a static batch ends it: release and try again.
            retry = not self.running and self.held
            if batch.requests or not (retry or len(batch.preempted_ids) > num_preempted):
                break
        if self.incoming and batch.preempted_ids:
            self._reserve_incoming(batch)  # preemption freed the room they lacked above
        if self.finishing:
            # Scheduled without them; their blocks are free by the time this step runs. The
            # next step is the policy's to build if a queued request may take their room, or if
            # their room kept every running one out of this step (nothing else would wake it).
            for request in self.finishing:
                self.kv.free(request)
            self.finishing.clear()
            left_out = bool(self.running) and not batch.requests
            if self.waiting or self.swapped or self.incoming or left_out:
                self._changed_since_schedule = True
        batch.num_running = len(self.running)
        batch.num_waiting = len(self.waiting)
        batch.num_swapped = len(self.swapped)
        batch.memory = self.memory_snapshot()
        if self._changed_tables:
            self._take_changed_tables(batch)
        self.step_idx += 1
        return batch

    def _take_changed_tables(self, batch: ScheduledBatch) -> None:
        """Name the tables that changed since the last batch outside a step (forks, KV
        transfers) in ``batch.block_tables``; a request preempted since will send its tables
        again when it is scheduled."""
        tables = batch.block_tables
        assert tables is not None
        for request in self._changed_tables:
            if request.status is RequestStatus.RUNNING:
                for seq_id, table in zip(
                    request.active_seq_ids, self.kv.block_tables(request), strict=True
                ):
                    tables[seq_id] = tuple(table)
        self._changed_tables.clear()

    def update(self, batch: ScheduledBatch, result: StepResult, now_s: float) -> list[Request]:
        """Apply a finished step at ``now_s`` (its end); returns requests that finished."""
        finished: list[Request] = list(batch.finished)
        step_idx = len(self.step_end_s)
        if batch.requests:
            self.step_end_s.append(now_s)
        # Without sampled tokens or stops, ``end_step`` takes the cheaper path for decodes.
        sampled = result if result.sampled_token_ids or result.stopped_seq_ids else None
        running = RequestStatus.RUNNING
        for scheduled in batch.requests:
            request = scheduled.request
            if request.status is not running:
                continue  # aborted while the step ran
            self.end_step(request, scheduled.num_positions, sampled, step_idx, now_s, finished)
        if not self.running and self.held:
            finished.extend(self.release_held(now_s))
        return finished

    def end_step(
        self,
        request: Request,
        num_positions: int,
        result: StepResult | None,
        step_idx: int,
        now_s: float,
        finished: list[Request],
        num_steps: int = 1,
    ) -> None:
        """The rules that end a step for one scheduled ``request``, in this order: its
        ``num_positions`` positions are computed; a prompt just completed forks its samples;
        when every known token is computed, each live sample samples a token (a finished
        sample frees its blocks); a request with no live sample finishes (into ``finished``).
        The step ends at ``now_s`` and has index ``step_idx`` in ``step_end_s``. (Its full
        blocks entered the prefix cache when it was scheduled: ``step.commit_scheduled``.)

        A run of ``num_steps`` identical decode steps (indices ``step_idx`` onwards) is ended
        in one call, with ``num_positions`` the run's positions not yet counted (see
        ``sim.fastforward``): the outcome is the one of ending each step in turn. This
        is the only place these rules live.
        """
        computed = request.num_computed_tokens + num_positions
        request.num_computed_tokens = computed
        prompt = request.num_prompt_tokens
        if computed == prompt and request.n > 1 and not request.forked:
            self.kv.fork(request)
            request.forked = True
            if self.record_block_tables:
                self._changed_tables.append(request)
        outputs = request.num_output_tokens
        if computed + 1 == prompt + outputs + num_steps:
            tokens = request.tokens
            counts = tokens.run_counts
            if (
                result is None
                and outputs + num_steps < request.max_output_tokens
                and counts
                and tokens.run_starts[-1] + counts[-1] == step_idx
            ):
                # A decode continuing its run of steps, not its last: the common case.
                request.num_output_tokens = outputs + num_steps
                # (not ``+=``: on a list item the compiled build adds generically, 0.8% of its
                # instructions here; docs/compiled_core.md)
                counts[-1] = counts[-1] + num_steps
                tokens.num_emissions += num_steps
            else:
                self._sample(request, result, step_idx, num_steps)
        if not request.live_seq_ids:
            self._finish(request, now_s, finished)

    def _sample(
        self, request: Request, result: StepResult | None, step_idx: int, count: int = 1
    ) -> None:
        """Every live sample samples ``count`` tokens, at steps ``step_idx`` onwards."""
        request.num_output_tokens += count
        if request.first_token_s is None:
            request.first_token_s = self.step_end_s[step_idx]
        request.tokens.add(step_idx, count)
        stopped: frozenset[int] = frozenset()
        if result is not None:
            stopped = result.stopped_seq_ids
            if result.sampled_token_ids:
                ids = request.output_token_ids
                if not isinstance(ids, dict):  # (the shared empty map: a dict of its own)
                    ids = request.output_token_ids = {}
                for seq_id in request.live_seq_ids:
                    token_id = result.sampled_token_ids.get(seq_id)
                    if token_id is not None:
                        ids.setdefault(seq_id, []).append(token_id)
        done_all = request.num_output_tokens >= request.max_output_tokens
        if not (done_all or stopped):
            return
        hold = self.policy.holds_until_batch_end
        for seq_id in list(request.live_seq_ids):
            if done_all or seq_id in stopped:
                request.live_seq_ids.remove(seq_id)
                if hold:
                    self.num_held_samples += 1  # keeps its slot, computed for nothing
                elif request.live_seq_ids:
                    self.kv.free_sequence(request, seq_id)

    def _finish(self, request: Request, now_s: float, finished: list[Request]) -> None:
        self.running.remove(request)
        if self.policy.holds_until_batch_end:
            self.held.append(request)
            return
        request.status = RequestStatus.FINISHED
        request.finish_s = now_s
        del self._requests[request.request_id]
        if request.hold_kv_on_finish:
            self.kv_held[request.request_id] = request
        elif self.release_finished_late:
            self.finishing.append(request)
            self._changed_since_schedule = True  # the next step is the policy's to build
        else:
            self.kv.free(request)
        self._report(request, now_s, finished)

    def _report(self, request: Request, now_s: float, finished: list[Request]) -> None:
        """``request`` finished: it is what ``update`` returns, unless it is a fanned-out
        child, whose parent is returned once its last child has finished."""
        group = self._groups.pop(request.request_id, None) if self._groups else None
        if group is None:
            finished.append(request)
        elif group.child_done(now_s):
            del self._parents[group.parent.request_id]
            finished.append(group.parent)

    def release_held(self, now_s: float) -> list[Request]:
        """Finish the held members of a static batch whose runners have all finished."""
        released: list[Request] = []
        held = self.held
        self.held = []
        self.num_held_samples = 0
        for request in held:
            request.status = RequestStatus.FINISHED
            request.finish_s = now_s
            del self._requests[request.request_id]
            if request.hold_kv_on_finish:  # a disagg prefill: its KV is sent first
                self.kv_held[request.request_id] = request
            else:
                self.kv.free(request)
            self._report(request, now_s, released)
        return released

    def block_tables(self, request: Request) -> tuple[Sequence[int], ...]:
        """Block tables of the request's active sequences (paged memory), for an executor."""
        return self.kv.block_tables(request)

    def kv_state(self) -> KVState:
        """A read-only copy of the KV memory's whole state: free blocks, reference counts,
        block tables, prefix-cache entries and their eviction order, the swap pool."""
        return self.kv.state()

    def memory_snapshot(self) -> MemorySnapshot:
        return self.kv.snapshot(self.waiting[0] if self.waiting else None)

    # -- mechanism used by Step --------------------------------------------------------------

    def preempt(self, victim: Request, batch: ScheduledBatch) -> None:
        """Take ``victim`` off the running list: swap it out, or drop its KV to recompute."""
        self.running.remove(victim)
        victim.num_preemptions += 1
        batch.preempted_ids.append(victim.request_id)
        mode = self.config.preemption_mode
        if mode == "swap" and self.kv.can_swap_out(victim):
            pairs = self.kv.swap_out(victim)
            batch.swap_out.extend(pairs)
            victim.num_blocks_swapped_out += len(pairs)
            victim.status = RequestStatus.SWAPPED
            enqueue(self.swapped, victim, self.by_priority)
            return
        # Recompute: drop the KV; the request starts over from its known tokens.
        victim.num_recomputed_tokens += victim.num_computed_tokens
        self.kv.free(victim)
        victim.num_computed_tokens = 0
        victim.forked = False
        victim.status = RequestStatus.WAITING
        enqueue(self.waiting, victim, self.by_priority)
