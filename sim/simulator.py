"""The SimPy model of one replica: a step loop running schedule → cost-model execute → update
on the shared core, sleeping when idle until something external (an arrival, a KV transfer, a
policy timer) wakes it, and skipping over runs of identical decode steps exactly."""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Generator

import simpy
from simpy.events import NORMAL

from core.batch import ScheduledBatch, StepResult
from core.memory import MemorySnapshot
from core.request import Request
from core.scheduler import Scheduler
from records.schema import StepRecorder
from sim.async_admission import HeldArrivals
from sim.errors import SimulationError as SimulationError
from sim.executor import CostModelExecutor, StepExecutor
from sim.fastforward import FastForward, RunPlan, StepTokens
from traces.schema import TraceRequest


def to_request(item: TraceRequest) -> Request:
    return Request(
        request_id=item.request_id,
        arrival_s=item.arrival_s,
        num_prompt_tokens=item.prompt_tokens,
        max_output_tokens=item.output_tokens,
        n=item.num_samples,
        prompt_token_ids=item.prompt_token_ids,
        prefix_hash_ids=item.prefix_hash_ids,
        hash_block_tokens=item.hash_block_tokens,
        priority=item.priority,
    )


def _ignore(requests: list[Request]) -> None:
    return None


def _delay_until(now_s: float, end_s: float) -> float:
    """The delay that brings SimPy's clock from ``now_s`` to exactly ``end_s``: ``now_s +
    (end_s - now_s)`` may miss it by a unit in the last place, and then everything that
    follows (a KV transfer, the run's end) would differ from stepping one step at a time."""
    delay = max(0.0, end_s - now_s)
    while now_s + delay < end_s:
        delay = math.nextafter(delay, math.inf)
    while delay > 0.0 and now_s + delay > end_s:
        delay = math.nextafter(delay, 0.0)
    return delay


def timeout_at(env: simpy.Environment, end_s: float) -> simpy.Event:
    """A timeout that ends at exactly ``end_s`` (>= ``env.now``). SimPy ends a timeout at
    ``now + delay``, and from some ``now`` no delay lands on ``end_s``: when ``now`` ends in
    half a unit of ``end_s``'s last place, rounding to even skips every other float. SimPy's
    clock then drifts a unit from the replica's (``Replica.clock_s``), and whatever reads it
    next (a KV transfer's start, a woken replica's clock) differs from a run stepped one
    step at a time. Such an event goes into SimPy's queue at ``end_s`` itself, as a
    ``Timeout`` with an exact delay would (`tests/sim/test_simulator.py` holds the case)."""
    delay = _delay_until(env.now, end_s)
    if env.now + delay == end_s:
        return env.timeout(delay)
    event = env.event()
    event._ok = True  # (what Timeout sets: a timeout succeeds with no value)
    event._value = None
    heapq.heappush(env._queue, (end_s, NORMAL, next(env._eid), event))
    return event


class Replica:
    """One serving instance: a scheduler over its own KV cache, and an executor.

    The replica keeps its own clock (``clock_s``, the exact sum of step durations) instead of
    reading SimPy's, so that skipping ahead over identical decode steps gives bit-identical
    times to stepping through them. While it skips, anything that could change its next step
    (``notify``) interrupts it: the steps already under way are kept, the rest dropped. After
    a run of repeats, a next step of running decodes (and one prompt chunk) that fast-forward
    can build itself (``FastForward.plan_continuation``) is repeated in turn, without a policy
    run. Fast-forward is reached through ``FastForward`` alone (plan, price, apply).

    With ``async_scheduling`` (vLLM's), a request that arrives while a step runs reaches the
    scheduler only after that step ends and the next is scheduled (``HeldArrivals``).
    """

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        pool: str,
        scheduler: Scheduler,
        executor: StepExecutor,
        recorder: StepRecorder,
        fast_forward: bool = True,
        async_scheduling: bool = False,
    ) -> None:
        self.env = env
        self.index = index
        self.pool = pool
        self.scheduler = scheduler
        self.executor = executor
        self.recorder = recorder
        self.fast_forward = fast_forward
        # A continuation's batch need not list its requests when the executor prices a run
        # from its shape (one object fewer a running request at each): rows count requests
        # from the plan's growth.
        # The executor typed as such when it is one: a compiled build calls it directly, not
        # through the interpreter's protocol (one call a step, one a run).
        self._costs = executor if isinstance(executor, CostModelExecutor) else None
        itemized = not (self._costs is not None and self._costs.prices_from_shape)
        self.skipper = FastForward(scheduler, itemized) if fast_forward else None
        self.arrivals_done = False
        self.clock_s = 0.0
        self.on_finished: Callable[[list[Request]], None] = _ignore
        self.on_transfers: Callable[[list[Request]], None] = _ignore
        self.process: simpy.Process | None = None
        self._wake: simpy.Event | None = None
        self._skipping = False
        # The end of the step under way (None: idle) or of each step of a run being skipped.
        self._busy_until: float | None = None
        self._skip_ends: list[float] | None = None
        self._held = HeldArrivals(env, self._take, self.close) if async_scheduling else None

    def start(self) -> None:
        self.process = self.env.process(self.step_loop())

    def add(self, request: Request) -> bool:
        if self._held is not None:
            end_s = self._step_end_s()
            if end_s is not None and self.scheduler.refusal(request) is None:
                self._held.hold(request, end_s)
                return True
        accepted = self.scheduler.add_request(request, self.env.now)
        self.notify()
        return accepted

    def _take(self, request: Request) -> None:
        if not self.scheduler.add_request(request, self.env.now):
            raise SimulationError(f"request {request.request_id!r} refused after it was held")
        self.notify()

    def _step_end_s(self) -> float | None:
        """When the step under way ends (None if none is)."""
        now = self.env.now
        ends = self._skip_ends
        if ends is not None:
            i = bisect.bisect_right(ends, now)
            return ends[i] if i < len(ends) else None
        busy = self._busy_until
        return busy if busy is not None and busy >= now else None

    def close(self) -> None:
        """No more requests will come to this replica (once those held have come)."""
        if self._held is not None and not self._held.close():
            return
        self.arrivals_done = True
        self.scheduler.mark_arrivals_done()
        self.notify()

    def notify(self) -> None:
        """Something outside the step loop changed the scheduler's state."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self._skipping and self.scheduler.changed_since_schedule and self.process:
            self.process.interrupt()

    def step_loop(self) -> simpy.events.ProcessGenerator:
        env, scheduler = self.env, self.scheduler
        while True:
            now_s = self.clock_s
            batch = scheduler.schedule(now_s)
            if batch.transfers:
                self.on_transfers(batch.transfers)
            if batch.is_empty:
                self.on_finished(scheduler.update(batch, StepResult(0.0), now_s))
                if self.arrivals_done and not scheduler.has_unfinished() and not scheduler.kv_held:
                    return
                if scheduler.changed_since_schedule:
                    continue  # it freed what finished requests held: schedule again at once
                yield from self._sleep(batch)
                continue
            costs = self._costs
            result = costs.execute(batch) if costs is not None else self.executor.execute(batch)
            end_s = now_s + result.duration_s
            self._busy_until = end_s
            yield timeout_at(env, end_s)
            self._busy_until = None
            self.clock_s = end_s
            self.recorder.record(batch, now_s, result.duration_s, self.index, self.pool)
            self.on_finished(scheduler.update(batch, result, end_s))
            if self.skipper is not None:
                yield from self._skip(self.skipper.plan_repeat(batch))
                # Steps of running decodes (and one prompt chunk) need no policy run: build
                # each such step and skip over its repeats until something else must happen.
                while (following := self.skipper.plan_continuation()) is not None:
                    if not (yield from self._skip(following)):
                        break

    def _skip(self, plan: RunPlan | None) -> Generator[simpy.Event, object, bool]:
        """Run the steps of ``plan`` in one go, until one ends after something external
        happened (then the scheduler must look again); False if there is no plan."""
        if plan is None:
            return False
        skipper = self.skipper
        assert skipper is not None
        batch = plan.batch
        start_s = self.clock_s
        shape = plan.shape
        costs = self._costs
        if costs is not None:
            ends = costs.repeat_end_times(batch, start_s, plan.max_steps, shape)
        else:
            ends = self.executor.repeat_end_times(batch, start_s, plan.max_steps, shape)
        last = len(ends) - 1
        self._skipping = True
        self._skip_ends = ends
        while True:
            try:
                yield timeout_at(self.env, ends[last])
                break
            except simpy.Interrupt:
                # The step under way finishes as planned; the next one is scheduled afresh.
                last = min(last, bisect.bisect_left(ends, self.env.now))
        self._skipping = False
        self._skip_ends = None
        del ends[last + 1 :]
        count = len(ends)
        memory = skipper.memory_sum(plan, count)
        tokens = skipper.tokens(plan, count)
        if shape.admit_step >= count:
            self.clock_s = ends[-1]
            self.on_finished(skipper.apply(plan, ends))
            self.recorder.record_repeat(
                batch, start_s, ends, memory, tokens, self.index, self.pool, len(plan.growth)
            )
            return True
        # The last step also admitted the waiting head: it gets a row of its own.
        rows: list[tuple[float, list[float], MemorySnapshot, StepTokens]] = []
        before = count - 1
        if before:
            memory_before = skipper.memory_sum(plan, before)
            tokens_before = skipper.tokens(plan, before)
            rows.append((start_s, ends[:before], memory_before, tokens_before))
            memory = memory - memory_before
            tokens = (tokens[0] - tokens_before[0], tokens[1] - tokens_before[1])
        admitted_s = ends[before - 1] if before else start_s
        self.clock_s = ends[-1]
        self.on_finished(skipper.apply(plan, ends))
        for row_start_s, row_ends, row_memory, row_tokens in rows:
            self.recorder.record_repeat(
                batch,
                row_start_s,
                row_ends,
                row_memory,
                row_tokens,
                self.index,
                self.pool,
                len(plan.growth),
            )
        self.recorder.record_admission(
            batch, admitted_s, ends[-1], memory, tokens, self.index, self.pool, len(plan.growth)
        )
        return True

    def _sleep(self, batch: ScheduledBatch) -> simpy.events.ProcessGenerator:
        env, s = self.env, self.scheduler
        self._wake = env.event()
        events: list[simpy.Event] = [self._wake]
        if batch.next_wakeup_s is not None:
            events.append(env.timeout(max(0.0, batch.next_wakeup_s - env.now)))
        elif self.arrivals_done and not s.kv_held and all(r.kv_ready for r in s.running):
            raise SimulationError(
                f"{self.pool} replica {self.index} stuck at t={env.now:.6f}s: "
                f"{len(s.running)} running, {len(s.waiting)} waiting, {len(s.swapped)} swapped, "
                f"{len(s.incoming)} incoming, nothing can be scheduled"
            )
        yield env.any_of(events)
        self._wake = None
        # Woken by an arrival, a transfer or a policy timer: the clock jumps to that moment.
        self.clock_s = max(self.clock_s, env.now)
