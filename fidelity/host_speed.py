"""How much slower one run's host was than another's, measured from the engine's input
preparation.

Every step the model runner prepares its inputs on the host (``prepare_s`` in a run's step
shapes: the persistent batch, the block tables, the attention metadata and their copies). That
work touches no kernel and waits for no GPU, so its time at a given step shape is a probe of
the host's speed alone. On the recorded H200 runs it follows the whole step where the host
set the pace: run 1 of example.csv, made on a freshly started machine, took 1.51x as long as
run 3 over decode steps of the same batch sizes, and its preparation 1.51x as long
(docs/validation.md).

``fit_prepare`` fits the preparation time of a reference run's steps as a linear function of
their shape (``prepare_features``); ``host_speed`` gives another run's steps' median ratio to
it (the slowdown: 1.5 means a host 1.5x slower), its spread and its drift over the run's
fifths. The slowdown is what ``CostModelConfig.host_slowdown`` takes to price a run on its own
host.

What it does not see: a core shared by time slices. A preparation takes a fraction of a
millisecond and mostly runs within one slice, so beside a busy loop on the same core it read
1.23-1.27x where the engine thread had half the core and its steps ran about twice as long
(``benchmarks/host_speed_cpu.py``).
Where the run records the engine thread's CPU time, ``core_share`` (its median share of each
step's wall time) shows such sharing apart.

It is a measurement of the run, beside the step times to be predicted and not one of them,
and ``sim validate`` reports it apart from, never instead of, the unadjusted errors.

The preparation is timed on the clock the steps are (``summary.json``'s and a profile's
``prepare_clock``): on a run on the thread-CPU clock, the engine thread's CPU time, which a
shared core does not stretch, as it does not stretch the steps. Runs and profiles from before
2026-11-28 timed it on the wall clock whatever the steps' clock; on the CPU clock they measure
no host (``clock_problem``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from records.step_shapes import StepShapeRecord
from sim.costmodel.profile import Profile

WALL = "wall"

MIN_STEPS = 16
"""Fewer steps with a preparation time than this measure no host speed."""


def shape_features(
    chunks: Sequence[tuple[int, int]], num_decodes: int
) -> tuple[float, float, float, float]:
    """(1, whether the step has a prompt chunk, its sequences, its token rows): a step with a
    chunk uploads its inputs apart (no decode graph), and the rest grows with the rows."""
    num_seqs = num_decodes + len(chunks)
    num_tokens = num_decodes + sum(n for n, _ in chunks)
    return (1.0, float(bool(chunks)), float(num_seqs), float(num_tokens))


def prepare_features(step: StepShapeRecord) -> tuple[float, float, float, float]:
    """``shape_features`` of a run's step."""
    return shape_features(step.prefill_chunks, len(step.decode_context_tokens))


def run_clocks(summary: Mapping[str, Any]) -> tuple[str, str]:
    """(the steps' clock, the input preparation's) of a run's ``summary.json``."""
    return str(summary.get("clock", WALL)), str(summary.get("prepare_clock", WALL))


def profile_clocks(profile: Profile) -> tuple[str, str]:
    """(the whole steps' clock, their input preparation's) of a calibration."""
    engine = profile.engine or {}
    return engine.get("clock", WALL), engine.get("prepare_clock", WALL)


def clock_problem(name: str, clocks: tuple[str, str]) -> str | None:
    """Why ``name``'s preparation measures no host speed for its steps (None: it does): it
    is timed on another clock than they are."""
    steps, prepare = clocks
    if steps == prepare:
        return None
    return (
        f"{name}: its steps are on the {steps} clock, its input preparation on the {prepare} "
        "clock (recorded before 2026-11-28), so the preparation does not measure the host the "
        "steps ran on; record it again"
    )


def clocks_problem(*sides: tuple[str, tuple[str, str]]) -> str | None:
    """Why the hosts of two runs (or of a run and a calibration: ``(name, clocks)`` each)
    cannot be compared: one's preparation is off its steps' clock. Two sides on different
    clocks compare, each measured on the clock its steps are priced on."""
    for name, clocks in sides:
        problem = clock_problem(name, clocks)
        if problem:
            return problem
    return None


def _timed(steps: Sequence[StepShapeRecord]) -> list[StepShapeRecord]:
    return [s for s in steps if s.prepare_s > 0 and (s.decode_context_tokens or s.prefill_chunks)]


@dataclass(frozen=True, slots=True)
class PrepareModel:
    """A reference run's preparation seconds as a linear function of ``prepare_features``."""

    coefficients: tuple[float, ...]
    num_steps: int

    def predict(self, step: StepShapeRecord) -> float:
        return float(np.dot(self.coefficients, prepare_features(step)))


def fit_prepare(steps: Sequence[StepShapeRecord], name: str = "the reference run") -> PrepareModel:
    """Least squares in relative terms (each step weighted by its own time, so that the many
    short steps and the few long ones count alike) over ``steps`` with a preparation time."""
    timed = _timed(steps)
    return _fit([prepare_features(s) for s in timed], [s.prepare_s for s in timed], name)


def profile_reference(profile: Profile) -> PrepareModel:
    """The preparation of a calibration's whole steps (``prepare_s``, which ``sim calibrate``
    stores since 2026-11-28), fitted as a run's are: the host a run is measured against."""
    timed = [s for s in profile.steps if s.prepare_s and s.measured_s > 0]
    rows = [shape_features(s.prefill_chunks, s.num_decode_seqs) for s in timed]
    return _fit(rows, [float(s.prepare_s or 0.0) for s in timed], f"{profile.path}: steps")


def _fit(
    rows: list[tuple[float, float, float, float]], times: list[float], name: str
) -> PrepareModel:
    if len(rows) < MIN_STEPS:
        raise ValueError(
            f"{name}: {len(rows)} steps with a preparation time; a host speed needs >= {MIN_STEPS}"
        )
    x, y = np.array(rows), np.array(times)
    # Columns that never vary beyond the intercept (no step with a chunk) are left out, and so
    # is any whose coefficient comes out negative (noise on few steps can make one so, and a
    # preparation time priced below zero measures nothing): refitted without it, until none is.
    keep = [0] + [j for j in range(1, x.shape[1]) if np.ptp(x[:, j]) > 0]
    while True:
        solution, *_ = np.linalg.lstsq(x[:, keep] / y[:, None], np.ones(len(y)), rcond=None)
        if solution.min() >= 0 or len(keep) == 1:
            break
        keep.pop(int(np.argmin(solution)))
    coefficients = np.zeros(x.shape[1])
    coefficients[keep] = np.maximum(solution, 0.0)
    # Scaled so that the reference's own steps' median ratio to it is 1: a run measured
    # against itself (or a copy of it) reads exactly 1, and k times its preparation exactly k.
    priced = x @ coefficients
    if (priced > 0).any():
        coefficients *= float(np.median(y[priced > 0] / priced[priced > 0]))
    return PrepareModel(tuple(float(c) for c in coefficients), len(rows))


@dataclass(frozen=True, slots=True)
class HostSpeed:
    """A run's host against a reference: ``slowdown`` the median over its steps of measured /
    the reference's predicted preparation time; ``spread`` half the interquartile range of
    those ratios; ``by_fifth`` their median in each fifth of the run, in order."""

    slowdown: float
    spread: float
    by_fifth: tuple[float, ...]
    num_steps: int
    # The median over the run's steps of the engine thread's CPU time / the step's wall time
    # (None where the run records no CPU time): below 1, the thread waited for a core.
    core_share: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "slowdown": self.slowdown,
            "spread": self.spread,
            "by_fifth": list(self.by_fifth),
            "num_steps": self.num_steps,
            "core_share": self.core_share,
        }


def host_speed(
    steps: Sequence[StepShapeRecord], reference: PrepareModel, name: str = "the run"
) -> HostSpeed:
    """``steps``' host against the reference's (``fit_prepare``), in step order."""
    ratios = []
    for step in _timed(steps):
        predicted = reference.predict(step)
        if predicted > 0:
            ratios.append(step.prepare_s / predicted)
    if len(ratios) < MIN_STEPS:
        raise ValueError(
            f"{name}: {len(ratios)} steps with a preparation time the reference prices; a host "
            f"speed needs >= {MIN_STEPS}"
        )
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    fifths = tuple(float(np.median(part)) for part in np.array_split(np.array(ratios), 5))
    shares = [s.cpu_s / s.wall_s for s in steps if s.cpu_s and s.wall_s]
    share = float(statistics.median(shares)) if shares else None
    return HostSpeed(float(statistics.median(ratios)), (q3 - q1) / 2, fifths, len(ratios), share)


HICCUP = 1.2
"""A step whose input preparation took this many times its run's own fit of it ran on a host
that stalled (``step_ratios``)."""


def step_ratios(steps: Sequence[StepShapeRecord]) -> list[float | None]:
    """Each step's preparation against the run's own fit of it (``fit_prepare`` on ``steps``),
    in step order; None for a step the fit does not price. A host that stalls for a moment
    (outside load, a pause) stretches a step's preparation with the rest of it: on the recorded
    H200 runs the two ratios correlate at 0.44-0.84 over the decode-only steps."""
    reference = fit_prepare(steps, "the run")
    out: list[float | None] = []
    for step in steps:
        predicted = reference.predict(step) if step.prepare_s > 0 else 0.0
        out.append(step.prepare_s / predicted if predicted > 0 else None)
    return out


def against(
    steps: Sequence[StepShapeRecord], reference: Sequence[StepShapeRecord], name: str = "the run"
) -> HostSpeed:
    """``steps``' host against ``reference``'s: the reference run's own preparation fitted,
    and ``steps`` priced by it."""
    return host_speed(steps, fit_prepare(reference, f"the reference of {name}"), name)


def group_slowdowns(runs: dict[str, Sequence[StepShapeRecord]]) -> dict[str, float]:
    """Runs of one configuration, each against the fastest host among them (a host's speed is
    lost to load, heat or a cold start; it is seldom gained): every run's steps priced by the
    preparation fitted on all of them pooled, and each median ratio divided by the least. One
    run alone is its own reference (1.0)."""
    if len(runs) == 1:
        return dict.fromkeys(runs, 1.0)
    pooled = fit_prepare([s for steps in runs.values() for s in steps], "the pooled runs")
    raw = {name: host_speed(steps, pooled, name).slowdown for name, steps in runs.items()}
    fastest = min(raw.values())
    return {name: value / fastest for name, value in raw.items()}
