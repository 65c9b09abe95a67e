"""Calibration's timer: every point is timed once per round, round after round across the grid
(so drift hits all alike), each keeping its median and spread; on a GPU the kernels alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from engine.profiling.grid import SMALL_GRID, CalibrationGrid, for_backend  # noqa: E402
from engine.profiling.timer import HeldCall, Timer, point_time  # noqa: E402


def test_rounds_interleave_the_points() -> None:
    calls: list[str] = []
    grid = replace(SMALL_GRID, warmup=1, repeats=3, min_repeats=3)
    timer = Timer(torch.device("cpu"), grid)
    points = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    timed = timer.rounds(points)
    # Warm-up of each, then every point once per round (never one point's repeats back to
    # back), each round one point later and after an untimed call of its first.
    rounds = ["a", "a", "b", "c"], ["b", "b", "c", "a"], ["c", "c", "a", "b"]
    assert calls == ["a", "b", "c", *rounds[0], *rounds[1], *rounds[2]]
    assert {t.repeats for t in timed.values()} == {3}


def test_a_slow_first_call_of_each_round_is_left_out_of_every_median() -> None:
    # The first timed call of each round is slow (as on the H200: launches reaching into its
    # events): rotated, it hits each point once in four rounds, and every median leaves it out.
    grid = replace(SMALL_GRID, warmup=1, repeats=4, min_repeats=4)
    timer = Timer(torch.device("cpu"), grid)
    order: list[str] = []
    points = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c", "d")}
    fresh = {"round": True}

    def once(fn: object) -> float:
        slow = fresh["round"]
        fresh["round"] = False
        return 9.0 if slow else 1.0

    def settle(fn: object) -> None:
        fresh["round"] = True

    timer._once = once  # type: ignore[method-assign,assignment]
    timer._settle = settle  # type: ignore[method-assign,assignment]
    timed = timer.rounds(points)
    assert {key: t.median_s for key, t in timed.items()} == dict.fromkeys("abcd", 1.0)


def test_point_time_is_the_median_and_half_the_interquartile_range() -> None:
    timed = point_time([1.0, 2.0, 3.0, 4.0, 100.0])
    assert timed.median_s == 3.0
    assert timed.spread_s == pytest.approx((52.0 - 1.5) / 2)
    assert point_time([2.0, 4.0]).spread_s == 1.0
    with pytest.raises(ValueError, match="at least one"):
        point_time([])


class _Spin:
    """A GPU behind ``Timer._held``: its spin runs ``rate`` cycles a second, the call's
    launches take the host ``launch_s`` and its kernels ``kernels_s``; events that start
    before the last launch is queued time the host's wait too."""

    def __init__(self, rate: float, launch_s: float, kernels_s: float) -> None:
        self.rate, self.launch_s, self.kernels_s = rate, launch_s, kernels_s
        self.holds: list[float] = []

    def __call__(self, fn: object, cycles: int) -> HeldCall:
        held = cycles / self.rate
        self.holds.append(held)
        waited = max(0.0, self.launch_s - held)
        return HeldCall(self.launch_s, held, self.kernels_s + waited, cycles)


def _timer_behind(spin: _Spin, rate_read: float, launch_read: float) -> tuple[Timer, object]:
    timer = Timer(torch.device("cpu"), SMALL_GRID)
    timer._held = spin  # type: ignore[method-assign]
    timer._cycles_per_s = rate_read

    def fn() -> None:
        pass

    timer._launch_s[id(fn)] = launch_read
    return timer, fn


def test_a_hold_the_launches_outran_is_timed_again_longer() -> None:
    # As on the H200 (2026-11-28): the spin's rate was read five times slow, so every hold
    # lasted a fifth of what it should have, and the events timed the host's launches.
    spin = _Spin(rate=5e9, launch_s=1e-3, kernels_s=10e-6)
    timer, fn = _timer_behind(spin, rate_read=1e9, launch_read=1e-3)
    assert timer._device_s(fn) == 10e-6  # (the first hold, 0.4 ms, came back with 1 ms)
    assert len(spin.holds) == 2 and spin.holds[1] >= 1e-3
    assert (timer.calls, timer.retimed, timer.late) == (1, 1, 0)
    assert timer._cycles_per_s == 5e9  # read again from the hold
    # The next call of it is held long enough at once.
    assert timer._device_s(fn) == 10e-6 and len(spin.holds) == 3
    assert (timer.calls, timer.retimed, timer.late) == (2, 1, 0)


def test_a_hold_long_enough_is_timed_once_and_its_rate_never_lowered() -> None:
    spin = _Spin(rate=1e9, launch_s=1e-4, kernels_s=10e-6)
    timer, fn = _timer_behind(spin, rate_read=2e9, launch_read=1e-4)
    assert timer._device_s(fn) == 10e-6 and len(spin.holds) == 1
    assert timer._cycles_per_s == 2e9  # a slower spin only made the hold longer
    assert (timer.calls, timer.retimed, timer.late) == (1, 0, 0)


def test_a_call_still_late_after_every_hold_is_counted() -> None:
    class Busy(_Spin):  # a host whose launches slow down as the holds grow
        def __call__(self, fn: object, cycles: int) -> HeldCall:
            self.launch_s = 3 * cycles / self.rate
            return super().__call__(fn, cycles)

    spin = Busy(rate=1e9, launch_s=1e-3, kernels_s=10e-6)
    timer, fn = _timer_behind(spin, rate_read=1e9, launch_read=1e-3)
    assert timer._device_s(fn) > 10e-6  # the host's time stays in it
    assert (timer.calls, timer.retimed, timer.late) == (1, 1, 1)
    assert len(spin.holds) == 4 and spin.holds == sorted(spin.holds)


def _many_small_kernels() -> tuple[torch.device, Callable[[], None], CalibrationGrid]:
    """On CUDA: a call of 200 tiny kernels (its launches take longer than its kernels) and a
    grid that times it five times; skipped without CUDA."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    x = torch.ones(16, device=device)

    def many_small_kernels() -> None:
        for _ in range(200):
            x.add_(1)

    return device, many_small_kernels, replace(SMALL_GRID, warmup=2, repeats=5, min_repeats=5)


@pytest.mark.gpu
def test_a_rate_read_low_still_times_the_kernels_alone() -> None:
    device, many_small_kernels, grid = _many_small_kernels()
    honest = Timer(device, grid).rounds({0: many_small_kernels})[0].median_s
    misread = Timer(device, grid)
    misread._cycles_per_s = 1e6  # (an H200 spins about 2e9 a second)
    timed = misread.rounds({0: many_small_kernels})[0].median_s
    assert misread.retimed >= 1 and misread.late <= 1  # (the rate is read again by the 3rd hold)
    assert timed < 1.5 * honest


@pytest.mark.gpu
def test_device_timing_leaves_the_launches_out() -> None:
    device, many_small_kernels, grid = _many_small_kernels()
    device_s = Timer(device, grid).rounds({0: many_small_kernels})[0].median_s
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0.record()
    many_small_kernels()
    t1.record()
    t1.synchronize()
    span_s = t0.elapsed_time(t1) / 1000
    assert device_s < span_s  # 200 launches take longer than 200 tiny kernels


def test_the_torch_backends_path_switch_is_a_decode_knot() -> None:
    grid = CalibrationGrid()
    torch_grid = for_backend(grid, "torch", 8)
    assert torch_grid.decode_seqs == (1, 2, 4, 8, 9, 16, 32, 64)
    assert for_backend(grid, "triton", 8) == grid  # (no such switch)
    assert for_backend(SMALL_GRID, "torch", 8) == SMALL_GRID  # (its batches stop at 4)
