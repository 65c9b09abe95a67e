"""How calibration times its points: every point warmed up, then timed once per round, round
after round across the whole grid (``Timer.rounds``), so that drift over the calibration hits
every point alike, each round starting one point later; each point keeps its median and its
spread. On CUDA with CUDA events, the
call's launches issued while the GPU is held busy, so that the events time the kernels alone
(``device``); on CPU with the engine's clock: ``time.perf_counter`` (``wall``) or the calling
thread's CPU time, ``time.thread_time`` (``cpu``).

On CUDA every timed call checks its own hold: an event before the hold times how long the GPU
was held, and the host's time from the hold's launch to the last event's must fit inside it.
A call whose launches outran the hold is timed again with a longer one (``HeldCall``). The
hold's length is in the spin's cycles, and its rate is read again from every hold: on the H200
(2026-11-28) one calibration's single reading of that rate came out about five times slow,
its holds about a fifth of what they should have been, and its op tables timed the host's
launches (elementwise at one token 339 us against 13 us) while its whole steps were right."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from engine.profiling.grid import CalibrationGrid

# The GPU is held busy this many times the call's host launch time before the first event,
# so that every launch is queued before its kernel may start.
_HOLD_FACTOR = 2.0
_HOLD_MIN_S = 2e-4
# A call whose launches outran its hold is timed again, up to this many times in all.
_MAX_HOLDS = 4


@dataclass(frozen=True, slots=True)
class HeldCall:
    """One call timed behind a hold: ``issued_s``, the host's time from the hold's launch to
    the call's last event; ``held_s``, how long the GPU was held (by events); ``kernels_s``,
    the call's kernels' time (by events); ``cycles``, the hold's length in the spin's cycles."""

    issued_s: float
    held_s: float
    kernels_s: float
    cycles: int

    @property
    def in_time(self) -> bool:
        """Every launch was queued before the hold ended: the GPU reached the hold no sooner
        than the host issued it, so the host's time from there is an upper bound on how far
        into the hold the last launch came."""
        return self.issued_s <= self.held_s


@dataclass(frozen=True, slots=True)
class PointTime:
    """One point's times over the rounds: the median, the spread (half the interquartile
    range: robust to the odd slow round) and how many rounds timed it."""

    median_s: float
    spread_s: float
    repeats: int


def point_time(times: list[float]) -> PointTime:
    """``PointTime`` of one point's times."""
    if not times:
        raise ValueError("a point needs at least one time")
    if len(times) < 4:
        spread = (max(times) - min(times)) / 2
    else:
        quartiles = statistics.quantiles(times, n=4)
        spread = (quartiles[2] - quartiles[0]) / 2
    return PointTime(statistics.median(times), spread, len(times))


class Timer:
    """Times the points of ``grid`` on ``device``; ``kind`` names the timer used."""

    def __init__(self, device: torch.device, grid: CalibrationGrid, clock: str = "wall") -> None:
        self.device, self.grid = device, grid
        self.kind = "cuda_events" if device.type == "cuda" else "wall"
        if device.type != "cuda" and clock == "cpu":
            self.kind = "thread_cpu"
        self._launch_s: dict[int, float] = {}
        self._cycles_per_s: float | None = None
        # Calls timed on CUDA; of them, timed again after a hold too short; and still too
        # short after ``_MAX_HOLDS`` holds (their time kept, the host's launches in it).
        self.calls = self.retimed = self.late = 0

    def rounds(
        self,
        points: dict[Hashable, Callable[[], Any]],
        on_round: Callable[[int], None] | None = None,
    ) -> dict[Hashable, PointTime]:
        """Each point's ``PointTime``: all warmed up, then ``grid.repeats`` rounds that each
        time every point once, in turn. Past ``grid.min_repeats`` rounds the rounds stop once
        they have spent ``max_point_s`` per point."""
        grid = self.grid
        times: dict[Hashable, list[float]] = {key: [] for key in points}
        with torch.inference_mode():
            for fn in points.values():
                for _ in range(grid.warmup):
                    self._launch_s[id(fn)] = _host_launch_s(fn, self.device)
            start = time.perf_counter()
            keys = list(points)
            for done in range(1, grid.repeats + 1):
                # Each round starts one point later, after one untimed call of its first: on
                # the H200 (2026-11-27) the first two points of every round (linear and
                # elementwise at one token) came out 1.5-9x slow in some calibrations, the
                # host's launches reaching into their events after the round before ended
                # on the swaps' long copies. Rotated, such a slow call hits each point in at
                # most one round, which its median leaves out.
                shift = (done - 1) % len(keys)
                order = keys[shift:] + keys[:shift]
                self._settle(points[order[0]])
                for key in order:
                    times[key].append(self._once(points[key]))
                if on_round is not None:
                    on_round(done)
                spent = time.perf_counter() - start
                if done >= grid.min_repeats and spent > len(points) * grid.max_point_s:
                    break
        return {key: point_time(values) for key, values in times.items()}

    def median_s(self, fn: Callable[[], Any]) -> float:
        """One point alone, timed over the rounds (``rounds`` of this point only)."""
        return self.rounds({0: fn})[0].median_s

    def _settle(self, fn: Callable[[], Any]) -> None:
        """One untimed call of ``fn`` (and, on CUDA, the wait for its kernels)."""
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _once(self, fn: Callable[[], Any]) -> float:
        if self.device.type == "cuda":
            return self._device_s(fn)
        if self.kind == "thread_cpu":
            c0 = time.thread_time()
            fn()
            return time.thread_time() - c0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def _device_s(self, fn: Callable[[], Any]) -> float:
        """The call's kernels alone: the GPU is held busy until every launch of the call is
        queued, so the first event's time is the first kernel's start. A hold the launches
        outran is lengthened to the host's time and the call timed again."""
        if self._cycles_per_s is None:
            self._cycles_per_s = _sleep_cycles_per_s(self.device)
        self.calls += 1
        key = id(fn)
        for attempt in range(_MAX_HOLDS):
            hold_s = max(_HOLD_MIN_S, _HOLD_FACTOR * self._launch_s.get(key, 0.0))
            call = self._held(fn, max(1, int(hold_s * self._cycles_per_s)))
            if call.held_s > 0:  # a spin runs no faster than the clock: a faster hold
                # means the rate was read low, and the holds were short
                self._cycles_per_s = max(self._cycles_per_s, call.cycles / call.held_s)
            if call.in_time:
                return call.kernels_s
            if attempt == 0:
                self.retimed += 1
            self._launch_s[key] = max(self._launch_s.get(key, 0.0), call.issued_s)
        self.late += 1
        return call.kernels_s

    def _held(self, fn: Callable[[], Any], cycles: int) -> HeldCall:
        """``fn`` timed by CUDA events behind a hold of ``cycles`` of the GPU's spin."""
        torch.cuda.synchronize(self.device)
        held = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        t0 = time.perf_counter()
        held.record()
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        issued_s = time.perf_counter() - t0
        end.synchronize()
        return HeldCall(
            issued_s=issued_s,
            held_s=float(held.elapsed_time(start)) / 1000.0,
            kernels_s=float(start.elapsed_time(end)) / 1000.0,
            cycles=cycles,
        )


def _sleep_cycles_per_s(device: torch.device) -> float:
    """How many of ``torch.cuda._sleep``'s cycles the GPU spins per second: the fastest of
    three spins, after an untimed one (its first launch may load its module while the first
    event waits; an idle GPU's clock rises while it spins). Every timed call reads it again
    from its own hold (``Timer._device_s``)."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
    rates = []
    for _ in range(3):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize(device)
        start.record()
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
        end.record()
        end.synchronize()
        rates.append(cycles / max(1e-6, float(start.elapsed_time(end)) / 1000.0))
    return max(rates)


def _host_launch_s(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds the host spends issuing ``fn`` (on CUDA its kernels run on after it returns)."""
    t0 = time.perf_counter()
    fn()
    launch = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return launch
