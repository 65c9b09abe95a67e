"""A run's host speed from its input preparation (``fidelity.host_speed``): a host k times slower
at the same shapes comes back as k, with its drift over the run; runs of one configuration
against the fastest; too few steps refused with the run's name; and, on the recorded H200 runs
(``../shared``), the slow runs found as the step times saw them."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from fidelity.host_speed import (
    MIN_STEPS,
    against,
    clock_problem,
    clocks_problem,
    fit_prepare,
    group_slowdowns,
    host_speed,
    prepare_features,
    run_clocks,
)
from records.step_shapes import StepShapeRecord

# A host's preparation: 200 us a step, 30 us more with a prompt chunk, 12 us a sequence,
# 0.3 us a token row (about the recorded H200 engine's).
COST = (2e-4, 3e-5, 1.2e-5, 3e-7)


def _steps(
    n: int, seed: int, slowdown: float | list[float] = 1.0, noise: float = 0.02
) -> list[StepShapeRecord]:
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        decodes = tuple(rng.randint(10, 900) for _ in range(rng.randint(1, 48)))
        chunks = ((rng.randint(16, 512), 0),) if rng.random() < 0.15 else ()
        shape = StepShapeRecord(i, 0.0, 0.01, 0.0, 0.0, (), chunks, decodes)
        factor = slowdown if isinstance(slowdown, float) else slowdown[i * len(slowdown) // n]
        prepare = sum(c * f for c, f in zip(COST, prepare_features(shape), strict=True))
        prepare *= factor * (1 + rng.uniform(-noise, noise))
        steps.append(dataclasses.replace(shape, prepare_s=prepare))
    return steps


def test_the_reference_fit_recovers_the_preparation_cost() -> None:
    model = fit_prepare(_steps(400, seed=1, noise=0.0))
    assert model.coefficients == pytest.approx(COST, rel=1e-6)


@pytest.mark.parametrize("slowdown", [0.8, 1.0, 1.5])
def test_a_host_k_times_slower_is_measured_as_k(slowdown: float) -> None:
    speed = against(_steps(300, seed=2, slowdown=slowdown), _steps(400, seed=1))
    assert speed.slowdown == pytest.approx(slowdown, rel=0.01)
    assert speed.spread < 0.02 * slowdown
    assert speed.num_steps == 300


def test_drift_over_the_run_shows_in_its_fifths() -> None:
    speed = against(_steps(500, seed=3, slowdown=[1.0, 1.0, 1.0, 2.0, 2.0]), _steps(400, seed=1))
    assert speed.by_fifth == pytest.approx((1.0, 1.0, 1.0, 2.0, 2.0), rel=0.02)
    assert speed.slowdown == pytest.approx(1.0, rel=0.02)  # (the median: 3 fifths of 5)


def test_runs_of_one_configuration_are_measured_against_the_fastest() -> None:
    runs = {
        "run1": _steps(300, seed=4, slowdown=1.4),
        "run2": _steps(300, seed=5, slowdown=1.0),
        "run3": _steps(300, seed=6, slowdown=1.05),
    }
    slowdowns = group_slowdowns(runs)
    assert slowdowns["run2"] == 1.0
    assert slowdowns["run1"] == pytest.approx(1.4, rel=0.02)
    assert slowdowns["run3"] == pytest.approx(1.05, rel=0.02)
    assert group_slowdowns({"alone": runs["run1"]}) == {"alone": 1.0}


def test_too_few_timed_steps_are_refused_naming_the_run() -> None:
    few = _steps(MIN_STEPS - 1, seed=7)
    untimed = [dataclasses.replace(s, prepare_s=0.0) for s in _steps(40, seed=8)]
    with pytest.raises(ValueError, match=r"the reference of run9: 15 steps .* needs >= 16"):
        against(_steps(100, seed=9), few, "run9")
    with pytest.raises(ValueError, match=r"run10: 0 steps"):
        host_speed(untimed, fit_prepare(_steps(100, seed=9)), "run10")


SHARED = Path(__file__).resolve().parents[3] / "shared" / "gpu-runs" / "h200-2026-11-27"


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.exists(), reason="needs ../shared/gpu-runs/h200-2026-11-27")
def test_the_recorded_slow_runs_are_found_from_their_preparation_alone() -> None:
    from fidelity.recorded import recorded_slowdowns

    slowdowns = recorded_slowdowns(SHARED)
    # example.csv's run 1, on a freshly started machine, ran its decode steps 1.5x as long as
    # runs 2-4; shared_prefix's run 1 1.17x as long as its run 2 (docs/validation.md).
    assert slowdowns["example-chunked-run1"] > 1.2
    assert slowdowns["shared_prefix-chunked-prefixcache-run1"] > 1.1
    for run in ("example-chunked-run2", "example-chunked-run3", "example-chunked-run4"):
        assert slowdowns[run] < 1.05
    assert slowdowns["shared_prefix-chunked-prefixcache-run2"] == 1.0


def test_core_share_shows_a_shared_core_the_preparation_does_not() -> None:
    reference = _steps(300, seed=10)
    alone = [dataclasses.replace(s, wall_s=0.01, cpu_s=0.01) for s in _steps(100, seed=11)]
    shared = [dataclasses.replace(s, wall_s=0.02, cpu_s=0.01) for s in _steps(100, seed=12)]
    assert against(alone, reference).core_share == pytest.approx(1.0)
    assert against(shared, reference).core_share == pytest.approx(0.5)
    assert against(_steps(100, seed=13), reference).core_share is None  # (no CPU time recorded)


def test_a_coefficient_that_fits_below_zero_is_left_out() -> None:
    # Preparation that falls as the rows grow (noise on a short run can look like it): the
    # unconstrained fit prices long steps below zero; the fit leaves the rows out instead.
    def prepare(features: tuple[float, ...]) -> float:
        return 3e-4 + 1e-5 * features[2] - 3e-7 * features[3]

    steps = [
        dataclasses.replace(s, prepare_s=prepare(prepare_features(s))) for s in _steps(200, seed=14)
    ]
    model = fit_prepare(steps)
    assert min(model.coefficients) >= 0 and model.coefficients[3] == 0
    speed = against(steps, steps)
    assert speed.num_steps == 200 and speed.slowdown == pytest.approx(1.0, abs=0.05)


def test_a_preparation_off_its_steps_clock_measures_no_host() -> None:
    # Each side's preparation on its own steps' clock: comparable, even across clocks.
    assert clock_problem("run", run_clocks({"clock": "cpu", "prepare_clock": "cpu"})) is None
    assert clock_problem("run", run_clocks({})) is None  # a wall-clock run from before
    assert clocks_problem(("a", ("cpu", "cpu")), ("b", ("wall", "wall"))) is None
    # A run on the CPU clock from before 2026-11-28 timed its preparation on the wall clock.
    problem = clocks_problem(("a", ("wall", "wall")), ("b", run_clocks({"clock": "cpu"})))
    assert problem is not None and problem.startswith("b: its steps are on the cpu clock")
    assert "input preparation on the wall clock" in problem
