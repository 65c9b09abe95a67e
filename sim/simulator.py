"""The SimPy model of one replica: arrivals feed the shared core's scheduler, and a step loop
runs schedule → cost-model execute → update, sleeping when idle until an arrival or a policy
timer wakes it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from engine.core.batch import ScheduledBatch, StepResult
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from sim.executor import CostModelExecutor
from sim.records import StepRecorder
from traces.schema import Trace, TraceRequest


class SimulationError(RuntimeError):
    """The simulated system cannot make progress (a bug, never an expected outcome)."""


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
    )


@dataclass
class RunOutput:
    """Everything a run produced: every request (finished, rejected) and the step records."""

    requests: list[Request]
    steps: StepRecorder
    end_s: float
    notes: list[str] = field(default_factory=list)


class ArrivalCursor:
    """Where the arrival process is in the trace: when the next request comes."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.next_idx = 0

    @property
    def next_arrival_s(self) -> float:
        requests = self.trace.requests
        return requests[self.next_idx].arrival_s if self.next_idx < len(requests) else math.inf


class Replica:
    """One serving instance: a scheduler over its own KV cache, and an executor.

    The replica keeps its own clock (``clock_s``, the exact sum of step durations) rather than
    reading SimPy's, so that skipping ahead over identical decode steps (``fast_forward``)
    gives bit-identical times to stepping through them.
    """

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: Scheduler,
        executor: CostModelExecutor,
        recorder: StepRecorder,
        cursor: ArrivalCursor,
        fast_forward: bool = True,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.executor = executor
        self.recorder = recorder
        self.cursor = cursor
        self.fast_forward = fast_forward
        self.arrivals_done = False
        self.clock_s = 0.0
        self._wake: simpy.Event | None = None

    def add(self, request: Request) -> bool:
        accepted = self.scheduler.add_request(request, self.env.now)
        self.wake()
        return accepted

    def close(self) -> None:
        self.arrivals_done = True
        self.scheduler.mark_arrivals_done()
        self.wake()

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def step_loop(self) -> simpy.events.ProcessGenerator:
        env, scheduler = self.env, self.scheduler
        while True:
            now_s = self.clock_s
            batch = scheduler.schedule(now_s)
            if batch.is_empty:
                scheduler.update(batch, StepResult(0.0), now_s)
                if self.arrivals_done and not scheduler.has_unfinished():
                    return
                yield from self._sleep(batch)
                continue
            result = self.executor.execute(batch)
            end_s = now_s + result.duration_s
            yield env.timeout(result.duration_s)
            self.clock_s = end_s
            scheduler.update(batch, result, end_s)
            self.recorder.record(batch, now_s, result.duration_s)
            if self.fast_forward:
                yield from self._repeat(batch)

    def _repeat(self, batch: ScheduledBatch) -> simpy.events.ProcessGenerator:
        """Skip over the steps that repeat ``batch`` exactly, up to the next arrival."""
        limit = self.scheduler.repeat_limit(batch)
        if limit <= 0:
            return
        start_s = self.clock_s
        # Stop at the next arrival only if it could join: behind a waiting request it cannot.
        stop_at_s = self.cursor.next_arrival_s if self.scheduler.arrivals_matter else math.inf
        ends = self.executor.repeat_end_times(batch, start_s, limit, stop_at_s)
        memory = self.scheduler.repeat_memory_sum(batch, len(ends))
        yield self.env.timeout(max(0.0, ends[-1] - self.env.now))
        self.clock_s = ends[-1]
        self.scheduler.repeat(batch, ends)
        self.recorder.record_repeat(batch, start_s, ends, memory)

    def _sleep(self, batch: ScheduledBatch) -> simpy.events.ProcessGenerator:
        env = self.env
        self._wake = env.event()
        events: list[simpy.Event] = [self._wake]
        if batch.next_wakeup_s is not None:
            events.append(env.timeout(max(0.0, batch.next_wakeup_s - env.now)))
        elif self.arrivals_done:
            s = self.scheduler
            raise SimulationError(
                f"replica stuck at t={env.now:.6f}s: {len(s.running)} running, "
                f"{len(s.waiting)} waiting, {len(s.swapped)} swapped, nothing can be scheduled"
            )
        yield env.any_of(events)
        self._wake = None
        # Woken by an arrival or a policy timer: the replica's clock jumps to that moment.
        self.clock_s = max(self.clock_s, env.now)


def arrival_loop(
    env: simpy.Environment, cursor: ArrivalCursor, requests: list[Request], replica: Replica
) -> simpy.events.ProcessGenerator:
    for item in cursor.trace.requests:
        if item.arrival_s > env.now:
            yield env.timeout(item.arrival_s - env.now)
        cursor.next_idx += 1
        request = to_request(item)
        requests.append(request)
        replica.add(request)
    replica.close()


def run_single_replica(
    trace: Trace,
    cache_config: CacheConfig,
    scheduler_config: SchedulerConfig,
    executor: CostModelExecutor,
    on_step: Callable[[float], None] | None = None,
    fast_forward: bool = True,
) -> RunOutput:
    """Replay ``trace`` through one replica and return what happened."""
    env = simpy.Environment()
    recorder = StepRecorder(on_step=on_step)
    cursor = ArrivalCursor(trace)
    scheduler = Scheduler(cache_config, scheduler_config)
    replica = Replica(env, scheduler, executor, recorder, cursor, fast_forward)
    requests: list[Request] = []
    env.process(arrival_loop(env, cursor, requests, replica))
    done = env.process(replica.step_loop())
    env.run(until=done)
    return RunOutput(requests=requests, steps=recorder, end_s=env.now)
