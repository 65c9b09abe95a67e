"""How calibration times a point: warmed up, then a median over repeats; on CUDA with CUDA
events, on CPU with the engine's clock: ``time.perf_counter`` (``wall``) or the calling thread's
CPU time, ``time.thread_time`` (``cpu``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.profiling.grid import CalibrationGrid


class Timer:
    """Times the points of ``grid`` on ``device``; ``kind`` names the timer used."""

    def __init__(self, device: torch.device, grid: CalibrationGrid, clock: str = "wall") -> None:
        self.device, self.grid = device, grid
        self.kind = "cuda_events" if device.type == "cuda" else "wall"
        if device.type != "cuda" and clock == "cpu":
            self.kind = "thread_cpu"

    def median_s(self, fn: Callable[[], Any]) -> float:
        """Median seconds of ``fn`` after warm-up: CUDA events on a GPU, perf_counter on CPU.
        Slow points stop early: after ``min_repeats`` once ``max_point_s`` has been spent."""
        grid = self.grid
        with torch.inference_mode():
            spent = 0.0
            for _ in range(grid.warmup):
                t0 = time.perf_counter()
                fn()
                spent += time.perf_counter() - t0
                if spent > grid.max_point_s:
                    break
            times: list[float] = []
            budget_start = time.perf_counter()
            for _ in range(grid.repeats):
                times.append(self._once(fn))
                done = len(times) >= grid.min_repeats
                if done and time.perf_counter() - budget_start > grid.max_point_s:
                    break
            return statistics.median(times)

    def medians_round_robin(self, fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
        """Median seconds of each of ``fns``, timed in turn, one of each per round, so that
        they all see the same load."""
        grid = self.grid
        times: dict[str, list[float]] = {name: [] for name in fns}
        with torch.inference_mode():
            for _ in range(grid.warmup):
                for fn in fns.values():
                    fn()
            start = time.perf_counter()
            for _ in range(grid.repeats):
                for name, fn in fns.items():
                    times[name].append(self._once(fn))
                done = len(times[next(iter(fns))]) >= grid.min_repeats
                if done and time.perf_counter() - start > len(fns) * grid.max_point_s:
                    break
        return {name: statistics.median(values) for name, values in times.items()}

    def _once(self, fn: Callable[[], Any]) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0
        if self.kind == "thread_cpu":
            c0 = time.thread_time()
            fn()
            return time.thread_time() - c0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
