"""Data parallelism as vLLM v1 runs it: ranks each with their own scheduler and KV cache behind
its load balancer (``DataParallelRouter``); for a mixture of experts the ranks step in lockstep
(``LockstepGroup``), since every MoE layer exchanges their tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from core.batch import ScheduledBatch, StepResult
from core.request import Request
from core.scheduler import Scheduler
from records.schema import StepRecorder
from sim.async_admission import HeldArrivals
from sim.costmodel.expert_parallel import ExpertParallelCost
from sim.errors import SimulationError
from sim.executor import step_shape
from sim.simulator import to_request
from traces.schema import Trace

STATS_INTERVAL_S = 0.1
"""How often vLLM's DP coordinator publishes each rank's (waiting, running) counts to the front
end (its ``stats_update_interval_ms`` default, 100 ms)."""
WAITING_WEIGHT = 4
"""vLLM's load-balancing score of a rank: ``waiting * 4 + running`` (``DPLBAsyncMPClient``)."""


class DataParallelRouter:
    """vLLM v1's front-end balancer over data-parallel ranks: each request goes to the rank of
    least ``4 * waiting + running`` (the first such rank from index 0), on counts the
    coordinator last published, at most ``interval_s`` old; between publications the front end
    counts each request it sends as one more waiting on that rank."""

    def __init__(
        self, schedulers: Sequence[Scheduler], interval_s: float = STATS_INTERVAL_S
    ) -> None:
        if not schedulers:
            raise ValueError("DataParallelRouter needs at least one rank")
        self.schedulers = list(schedulers)
        self.interval_s = interval_s
        self._published_s: float | None = None
        self._counts: list[list[int]] = []

    def _refresh(self, now_s: float) -> None:
        if self._published_s is None or now_s - self._published_s >= self.interval_s:
            self._published_s = now_s
            self._counts = [[len(s.waiting), len(s.running)] for s in self.schedulers]

    def pick(self, now_s: float) -> int:
        """The rank the next request goes to."""
        self._refresh(now_s)
        scores = [WAITING_WEIGHT * waiting + running for waiting, running in self._counts]
        rank = scores.index(min(scores))
        self._counts[rank][0] += 1
        return rank


class LockstepGroup:
    """Data-parallel ranks of a mixture of experts stepping together: every step each rank
    schedules its own batch, all run for the slowest rank's time (a rank with nothing to do runs
    a padded dummy batch, as vLLM's does), then each updates its own requests. The group
    sleeps only when no rank has work."""

    def __init__(
        self,
        env: simpy.Environment,
        schedulers: Sequence[Scheduler],
        cost: ExpertParallelCost,
        recorder: StepRecorder,
        block_size: int,
        on_finished: Callable[[int], None] | None = None,
        async_scheduling: bool = False,
    ) -> None:
        if len(schedulers) != cost.dp:
            raise ValueError(f"{len(schedulers)} schedulers for data_parallel_size {cost.dp}")
        self.env = env
        self.schedulers = list(schedulers)
        self.cost = cost
        self.recorder = recorder
        self.block_size = block_size
        self.router = DataParallelRouter(self.schedulers)
        self.on_finished = on_finished or (lambda count: None)
        self.clock_s = 0.0
        self.arrivals_done = False
        self.process: simpy.Process | None = None
        self._wake: simpy.Event | None = None
        # The end of the step under way (None: idle), and with async scheduling the arrivals
        # held until the next step is scheduled (each rank's engine core holds its own).
        self._busy_until: float | None = None
        self._held = HeldArrivals(env, self._take, self.close) if async_scheduling else None
        self._ranks: dict[str, int] = {}

    def add(self, request: Request) -> int:
        """Route an arriving request to a rank; returns the rank (-1 if it was rejected)."""
        rank = self.router.pick(self.env.now)
        scheduler = self.schedulers[rank]
        busy = self._busy_until
        if self._held is not None and busy is not None and scheduler.refusal(request) is None:
            self._ranks[request.request_id] = rank
            self._held.hold(request, busy)
            return rank
        accepted = scheduler.add_request(request, self.env.now)
        self._notify()
        return rank if accepted else -1

    def _take(self, request: Request) -> None:
        rank = self._ranks.pop(request.request_id)
        if not self.schedulers[rank].add_request(request, self.env.now):
            raise SimulationError(f"request {request.request_id!r} refused after it was held")
        self._notify()

    def close(self) -> None:
        if self._held is not None and not self._held.close():
            return
        self.arrivals_done = True
        for scheduler in self.schedulers:
            scheduler.mark_arrivals_done()
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def step_loop(self) -> simpy.events.ProcessGenerator:
        while True:
            now_s = self.clock_s
            batches = [s.schedule(now_s) for s in self.schedulers]
            if all(b.is_empty for b in batches):
                for scheduler, batch in zip(self.schedulers, batches, strict=True):
                    self.on_finished(len(scheduler.update(batch, StepResult(0.0), now_s)))
                if self.arrivals_done and not any(s.has_unfinished() for s in self.schedulers):
                    return
                if any(s.changed_since_schedule for s in self.schedulers):
                    continue  # finished requests' blocks were freed: schedule again at once
                yield from self._sleep(batches)
                continue
            duration = self.step_s(batches)
            self._busy_until = now_s + duration
            yield self.env.timeout(duration)
            self._busy_until = None
            self.clock_s = end_s = now_s + duration
            for rank, (scheduler, batch) in enumerate(zip(self.schedulers, batches, strict=True)):
                if not batch.is_empty:
                    self.recorder.record(batch, now_s, duration, rank, "colocated")
                result = StepResult(duration if not batch.is_empty else 0.0)
                self.on_finished(len(scheduler.update(batch, result, end_s)))

    def step_s(self, batches: Sequence[ScheduledBatch]) -> float:
        """The group's step: the slowest rank's time, every rank padded to the largest batch."""
        shapes = [step_shape(b, self.block_size) for b in batches]
        return self.cost.group_step(shapes).duration_s

    def _sleep(self, batches: Sequence[ScheduledBatch]) -> simpy.events.ProcessGenerator:
        self._wake = self.env.event()
        events: list[simpy.Event] = [self._wake]
        wakeups = [b.next_wakeup_s for b in batches if b.next_wakeup_s is not None]
        if wakeups:
            events.append(self.env.timeout(max(0.0, min(wakeups) - self.env.now)))
        elif self.arrivals_done:
            counts = [(len(s.running), len(s.waiting)) for s in self.schedulers]
            raise SimulationError(
                f"data-parallel group stuck at t={self.env.now:.6f}s: (running, waiting) per "
                f"rank {counts}, nothing can be scheduled"
            )
        yield self.env.any_of(events)
        self._wake = None
        self.clock_s = max(self.clock_s, self.env.now)


def run_lockstep(
    trace: Trace,
    group: LockstepGroup,
    on_rejected: Callable[[int], None] | None = None,
) -> tuple[list[Request], float]:
    """Replay ``trace`` through ``group``: its requests and when the last step ended."""
    env = group.env
    requests: list[Request] = []

    def arrivals() -> simpy.events.ProcessGenerator:
        for item in trace.requests:
            if item.arrival_s > env.now:
                yield env.timeout(item.arrival_s - env.now)
            request = to_request(item)
            requests.append(request)
            if group.add(request) < 0 and on_rejected is not None:
                on_rejected(1)
        group.close()

    group.process = env.process(group.step_loop())
    env.process(arrivals())
    env.run(until=group.process)
    return requests, group.clock_s
