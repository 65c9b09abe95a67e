"""The SimPy model of one replica: arrivals feed the shared core's scheduler, and a step loop
runs schedule → cost-model execute → update, sleeping when idle until an arrival or a policy
timer wakes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from engine.core.batch import ScheduledBatch, StepResult
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.executor import Executor
from engine.core.request import Request
from engine.core.scheduler import Scheduler
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


class Replica:
    """One serving instance: a scheduler over its own KV cache, and an executor."""

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: Scheduler,
        executor: Executor,
        recorder: StepRecorder,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.executor = executor
        self.recorder = recorder
        self.arrivals_done = False
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
            batch = scheduler.schedule(env.now)
            if batch.is_empty:
                scheduler.update(batch, StepResult(0.0), env.now)
                if self.arrivals_done and not scheduler.has_unfinished():
                    return
                yield from self._sleep(batch)
                continue
            result = self.executor.execute(batch)
            start_s = env.now
            yield env.timeout(result.duration_s)
            scheduler.update(batch, result, env.now)
            self.recorder.record(batch, start_s, result.duration_s)

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


def arrival_loop(
    env: simpy.Environment, trace: Trace, requests: list[Request], replica: Replica
) -> simpy.events.ProcessGenerator:
    for item in trace.requests:
        if item.arrival_s > env.now:
            yield env.timeout(item.arrival_s - env.now)
        request = to_request(item)
        requests.append(request)
        replica.add(request)
    replica.close()


def run_single_replica(
    trace: Trace,
    cache_config: CacheConfig,
    scheduler_config: SchedulerConfig,
    executor: Executor,
    on_step: Callable[[float], None] | None = None,
) -> RunOutput:
    """Replay ``trace`` through one replica and return what happened."""
    env = simpy.Environment()
    recorder = StepRecorder(on_step=on_step)
    replica = Replica(env, Scheduler(cache_config, scheduler_config), executor, recorder)
    requests: list[Request] = []
    env.process(arrival_loop(env, trace, requests, replica))
    done = env.process(replica.step_loop())
    env.run(until=done)
    return RunOutput(requests=requests, steps=recorder, end_s=env.now)
