"""How much slower one run's host was than another's, measured from the engine's input
preparation.

Every step the model runner prepares its inputs on the host (``prepare_s`` in a run's step
shapes: the persistent batch, the block tables, the attention metadata and their copies). That
work touches no kernel and waits for no GPU, so its time at a given step shape is a probe of
the host's speed alone. On the recorded H200 runs it follows the whole step where the host
set the pace: run 1 of example.csv, made on a freshly started machine, took 1.51x as long as
run 3 over decode steps of the same batch sizes, and its preparation 1.51x as long
(docs/validation.md).

``fit_prepare`` tables the preparation time of a reference run's decode-only steps by their
batch size (the median at each size it saw, linear between sizes); ``host_speed`` gives another
run's steps' median ratio to it (the slowdown: 1.5 means a host 1.5x slower), its spread and its
drift over the run's fifths. The slowdown is what ``CostModelConfig.host_slowdown`` takes to
price a run on its own host.

Why a table by batch size and not a line through the step's shape: the preparation is not
linear in the batch. On the CPU engine it jumps from 224 to 654 us between 8 and 9 decodes
(past ``kernels.torch_attention.ROW_PATH_MAX_SEQS`` the attention's gather plan is built in
the preparation), so a line fitted to a calibration's grid (batches of 1-64) read runs of 1-8
decodes on the same machine as 0.88-0.97x of it. The table, with the cold steps after a
prefill left out on a CPU (``SETTLE_STEPS``), reads them 0.95-1.01x (2026-11-28, sets 8 and 9
of ``benchmarks/results/cpu-calibrations-2026-11-28``). Steps with a prompt chunk are few and
vary with their tokens: they are left out.

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

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from records.step_shapes import StepShapeRecord
from sim.costmodel.profile import Profile
from sim.costmodel.step_fit import PREPARE_KNOT_STEPS, median_by_size

WALL = "wall"

MIN_STEPS = 16
"""Fewer steps with a preparation time than this measure no host speed."""
KNOT_STEPS = PREPARE_KNOT_STEPS
"""A reference's batch size with fewer decode-only steps than this is not one of its knots."""
SETTLE_STEPS = 6
"""On an engine that runs on a CPU, decode-only steps this close after a step with a prompt
chunk are no probes (``settle_steps``). There the prefill runs on the host's own caches, and
the next steps' preparation runs cold: the first decode step after one took 1.6x the settled
steps' preparation, the second 1.3x, the fifth 1.0-1.03x (2026-11-28, sets 8 and 9 of
``benchmarks/results/cpu-calibrations-2026-11-28``). A calibration's grid has short runs of
decodes and a replay long ones, so with those steps the grid read a run's host 2-5% fast. On
the H200 runs, whose prefill runs on the GPU, no such effect shows (0.98-1.02x), and leaving
the steps out there only loses probes: it read example's drifting run 1 at 1.60x instead of
1.33x."""


def settle_steps(device_name: str | None) -> int:
    """``SETTLE_STEPS`` for an engine on a CPU (``device_name`` a run's ``summary.json``
    ``device_name`` or a profile's ``device.name``), 0 for one on a GPU."""
    return SETTLE_STEPS if (device_name or "").lower().startswith("cpu") else 0


def run_settle(summary: Mapping[str, Any]) -> int:
    """``settle_steps`` of a run's ``summary.json``."""
    return settle_steps(summary.get("device_name"))


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


def _settled(has_chunk: Sequence[bool], settle: int) -> list[bool]:
    """For each step in order, whether more than ``settle`` steps without a prompt chunk have
    run since the last step with one."""
    out, since = [], settle + 1
    for chunk in has_chunk:
        since = 0 if chunk else since + 1
        out.append(since > settle)
    return out


def _timed(steps: Sequence[StepShapeRecord], settle: int) -> list[StepShapeRecord]:
    """The probe's steps: decode-only, more than ``settle`` steps after the last prompt chunk,
    with a preparation time."""
    settled = _settled([bool(s.prefill_chunks) for s in steps], settle)
    return [
        s for s, ok in zip(steps, settled, strict=True)
        if ok and s.prepare_s > 0 and s.decode_context_tokens and not s.prefill_chunks
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class PrepareModel:
    """A reference's preparation seconds of a decode-only step by its batch size: at each
    ``(batch size, seconds)`` of ``knots`` (ascending), linear in between. A step with a prompt
    chunk, or a batch outside the knots, is not priced (0.0)."""

    knots: tuple[tuple[int, float], ...]
    num_steps: int

    def predict(self, step: StepShapeRecord) -> float:
        if step.prefill_chunks:
            return 0.0
        return self.at(len(step.decode_context_tokens))

    def at(self, batch: int) -> float:
        """The reference's preparation of a ``batch``-sequence decode step (0.0 outside it)."""
        sizes = [size for size, _ in self.knots]
        if not self.knots or batch < sizes[0] or batch > sizes[-1]:
            return 0.0
        j = bisect.bisect_left(sizes, batch)
        if sizes[j] == batch:
            return self.knots[j][1]
        (x0, y0), (x1, y1) = self.knots[j - 1], self.knots[j]
        return y0 + (y1 - y0) * (batch - x0) / (x1 - x0)


def fit_prepare(
    steps: Sequence[StepShapeRecord], name: str = "the reference run", settle: int = 0
) -> PrepareModel:
    """The reference's decode-only steps with a preparation time (more than ``settle`` after
    the last prompt chunk: ``settle_steps``), as a table of their median by batch size
    (``KNOT_STEPS`` steps or more at a size)."""
    timed = _timed(steps, settle)
    return _fit([len(s.decode_context_tokens) for s in timed], [s.prepare_s for s in timed], name)


def profile_reference(profile: Profile) -> PrepareModel:
    """The preparation of a calibration's decode-only whole steps (``prepare_s``, which ``sim
    calibrate`` stores since 2026-11-28), tabled as a run's are: the host a run is measured
    against."""
    settle = settle_steps(profile.device.get("name"))
    settled = _settled([bool(s.prefill_chunks) for s in profile.steps], settle)
    timed = [
        s for s, ok in zip(profile.steps, settled, strict=True)
        if ok and s.prepare_s and s.measured_s > 0 and s.num_decode_seqs and not s.prefill_chunks
    ]  # fmt: skip
    sizes = [s.num_decode_seqs for s in timed]
    return _fit(sizes, [float(s.prepare_s or 0.0) for s in timed], f"{profile.path}: steps")


def _fit(sizes: list[int], times: list[float], name: str) -> PrepareModel:
    knots = median_by_size(sizes, times, KNOT_STEPS)
    tabled = {size for size, _ in knots}
    priced = sum(1 for size in sizes if size in tabled)
    if priced < MIN_STEPS:
        raise ValueError(
            f"{name}: {priced} decode-only steps with a preparation time at a batch size seen "
            f">= {KNOT_STEPS} times; a host speed needs >= {MIN_STEPS}"
        )
    # Scaled so that the reference's own steps' median ratio to it is 1: a run measured
    # against itself (or a copy of it) reads exactly 1, and k times its preparation exactly k.
    model = PrepareModel(knots, len(sizes))
    own = [t / model.at(n) for n, t in zip(sizes, times, strict=True) if model.at(n) > 0]
    scale = float(statistics.median(own))
    return PrepareModel(tuple((n, t * scale) for n, t in knots), len(sizes))


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
    steps: Sequence[StepShapeRecord],
    reference: PrepareModel,
    name: str = "the run",
    settle: int = 0,
) -> HostSpeed:
    """``steps``' host against the reference's (``fit_prepare``), in step order, over their
    decode-only steps more than ``settle`` after the last prompt chunk (``settle_steps``)."""
    ratios = []
    for step in _timed(steps, settle):
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
"""A step whose input preparation took this many times its run's own table of it ran on a host
that stalled (``step_ratios``)."""


def step_ratios(steps: Sequence[StepShapeRecord], settle: int = 0) -> list[float | None]:
    """Each step's preparation against the run's own table of it (``fit_prepare`` on
    ``steps``), in step order; None for a step the table does not price. A host that stalls
    for a moment (outside load, a pause) stretches a step's preparation with the rest of it:
    on the recorded H200 runs the two ratios correlate at 0.39-0.84 over the decode-only
    steps (calibration 1 pricing). ``settle`` as ``host_speed``."""
    reference = fit_prepare(steps, "the run", settle)
    probes = {id(step) for step in _timed(steps, settle)}
    out: list[float | None] = []
    for step in steps:
        predicted = reference.predict(step) if id(step) in probes else 0.0
        out.append(step.prepare_s / predicted if predicted > 0 else None)
    return out


def against(
    steps: Sequence[StepShapeRecord],
    reference: Sequence[StepShapeRecord],
    name: str = "the run",
    settle: int = 0,
) -> HostSpeed:
    """``steps``' host against ``reference``'s: the reference run's own preparation tabled,
    and ``steps`` priced by it (both runs of one engine: ``settle`` as ``host_speed``)."""
    table = fit_prepare(reference, f"the reference of {name}", settle)
    return host_speed(steps, table, name, settle)


def group_slowdowns(
    runs: dict[str, Sequence[StepShapeRecord]], settle: int = 0
) -> dict[str, float]:
    """Runs of one configuration, each against the fastest host among them (a host's speed is
    lost to load, heat or a cold start; it is seldom gained): the fastest is the run that the
    others' tables read slowest (its median over them), and every run is read against the
    fastest's own table. One run alone is its own reference (1.0). ``settle`` as
    ``host_speed``.

    Not against a table of all the runs pooled: a slower host batches more, so at a batch size
    where the slow run has most of the steps the pooled median is its own, and reads it as
    1.0 there. On the recorded H200 runs the pooled table read shared_prefix's run 1 1.10x its
    run 2; against run 2's table it reads 1.17x, as its decode steps' times do."""
    if len(runs) == 1:
        return dict.fromkeys(runs, 1.0)
    tables = {name: fit_prepare(steps, f"the run {name}", settle) for name, steps in runs.items()}

    def read(name: str, reference: str) -> float:
        return host_speed(runs[name], tables[reference], name, settle).slowdown

    fastest = min(
        runs,
        key=lambda name: statistics.median(read(name, other) for other in runs if other != name),
    )
    return {name: 1.0 if name == fastest else read(name, fastest) for name in runs}
