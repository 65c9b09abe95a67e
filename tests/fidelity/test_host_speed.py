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
    SETTLE_STEPS,
    against,
    clock_problem,
    clocks_problem,
    fit_prepare,
    group_slowdowns,
    host_speed,
    run_clocks,
    run_settle,
    settle_steps,
    step_ratios,
)
from records.step_shapes import StepShapeRecord


# A host's preparation of a decode step: 200 us, 12 us a sequence, and 250 us more past 8
# sequences (the CPU engine's jump, where its attention's gather plan joins the preparation).
def _cost(num_seqs: int) -> float:
    return 2e-4 + 1.2e-5 * num_seqs + (2.5e-4 if num_seqs > 8 else 0.0)


CHUNK_EVERY = 40  # a step with a prompt chunk every 40 steps
COLD = (1.6, 1.34, 1.16, 1.06)  # the CPU engine's first decode steps after a prefill


def _probes(n: int) -> int:
    """How many of ``_steps(n, ...)`` are probes on a GPU's engine: the decode-only ones."""
    return sum(1 for i in range(n) if i % CHUNK_EVERY)


def _steps(
    n: int,
    seed: int,
    slowdown: float | list[float] = 1.0,
    noise: float = 0.02,
    batches: tuple[int, int] = (1, 48),
    cold: bool = False,
    chunk_every: int = CHUNK_EVERY,
) -> list[StepShapeRecord]:
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        decodes = tuple(rng.randint(10, 900) for _ in range(rng.randint(*batches)))
        chunks = ((rng.randint(16, 512), 0),) if i % chunk_every == 0 else ()
        shape = StepShapeRecord(i, 0.0, 0.01, 0.0, 0.0, (), chunks, decodes)
        factor = slowdown if isinstance(slowdown, float) else slowdown[i * len(slowdown) // n]
        # (A step with a chunk prepares more, by its tokens: the probe leaves it out.)
        prepare = _cost(len(decodes)) + (3e-7 * chunks[0][0] if chunks else 0.0)
        if cold and 0 < i % chunk_every <= len(COLD):  # (after a prefill, on a CPU)
            prepare *= COLD[i % chunk_every - 1]
        prepare *= factor * (1 + rng.uniform(-noise, noise))
        steps.append(dataclasses.replace(shape, prepare_s=prepare))
    return steps


def test_the_reference_tables_the_preparation_by_batch_size() -> None:
    model = fit_prepare(_steps(600, seed=1, noise=0.0))
    for batch in (1, 8, 9, 30, 48):
        assert model.at(batch) == pytest.approx(_cost(batch), rel=1e-6)
    assert model.at(49) == 0.0  # (past the reference's largest batch: not priced)
    with_chunk = StepShapeRecord(0, 0.0, 0.01, 1e-3, 0.0, (), ((64, 0),), (100,))
    assert model.predict(with_chunk) == 0.0


def test_a_reference_of_other_batch_sizes_reads_the_same_host_as_1() -> None:
    # A calibration's grid runs batches of 1-48; a run, of 1-8. Both on one host: 1.0, across
    # the jump at 9 sequences that a line through the batch size would bend over.
    speed = against(_steps(300, seed=2, batches=(1, 8)), _steps(600, seed=1))
    assert speed.slowdown == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("slowdown", [0.8, 1.0, 1.5])
def test_a_host_k_times_slower_is_measured_as_k(slowdown: float) -> None:
    run = _steps(300, seed=2, slowdown=slowdown)
    speed = against(run, _steps(400, seed=1))
    assert speed.slowdown == pytest.approx(slowdown, rel=0.01)
    assert speed.spread < 0.02 * slowdown
    assert speed.num_steps == _probes(300)


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


def test_on_a_cpu_the_cold_steps_after_a_prefill_are_no_probes() -> None:
    # On a CPU the first steps after each prefill prepare 1.6x slower. A calibration's grid
    # prefills every few steps, a run seldom: with those steps, the grid's table would read the
    # run's host fast (0.97 here). On a CPU's engine they are left out on both sides.
    settle = settle_steps("cpu (x86_64)")
    assert settle == SETTLE_STEPS and settle_steps("NVIDIA H200") == 0
    assert run_settle({"device_name": "cpu"}) == SETTLE_STEPS and run_settle({}) == 0
    grid = _steps(2000, seed=1, noise=0.1, cold=True, chunk_every=12)
    run = _steps(1000, seed=17, noise=0.1, cold=True)
    assert against(run, grid, settle=settle).slowdown == pytest.approx(1.0, abs=0.012)
    assert against(run, grid).slowdown < 0.98  # (with them)
    ratios = step_ratios(run, settle)
    assert ratios[1] is None and ratios[SETTLE_STEPS + 1] is not None


def test_a_slow_run_that_batched_more_is_read_against_the_fastest_runs_table() -> None:
    # The slow host's run formed batches of 1-48, the fast one's of 1-16: at 17-48 only the slow
    # run has steps, where a table of both pooled would read it as 1.0.
    runs = {
        "slow": _steps(400, seed=15, slowdown=1.2, batches=(1, 48)),
        "fast": _steps(400, seed=16, batches=(1, 16)),
    }
    slowdowns = group_slowdowns(runs)
    assert slowdowns["fast"] == 1.0
    assert slowdowns["slow"] == pytest.approx(1.2, rel=0.02)


def test_too_few_timed_steps_are_refused_naming_the_run() -> None:
    few = _steps(1 + MIN_STEPS - 1, seed=7, batches=(1, 1))  # (step 0 has a prompt chunk)
    untimed = [dataclasses.replace(s, prepare_s=0.0) for s in _steps(40, seed=8)]
    with pytest.raises(
        ValueError, match=r"the reference of run9: 15 decode-only steps .* needs >= 16"
    ):
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
    assert slowdowns["shared_prefix-chunked-prefixcache-run1"] > 1.15
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


def test_a_batch_size_seen_too_seldom_is_no_knot() -> None:
    steps = _steps(300, seed=14, batches=(1, 4))
    once = StepShapeRecord(999, 0.0, 0.01, 9e-4, 0.0, (), (), (100,) * 20)
    model = fit_prepare([*steps, once, dataclasses.replace(once, step_idx=1000)])
    assert [size for size, _ in model.knots] == [1, 2, 3, 4]
    assert model.num_steps == _probes(300) + 2


def test_a_preparation_off_its_steps_clock_measures_no_host() -> None:
    # Each side's preparation on its own steps' clock: comparable, even across clocks.
    assert clock_problem("run", run_clocks({"clock": "cpu", "prepare_clock": "cpu"})) is None
    assert clock_problem("run", run_clocks({})) is None  # a wall-clock run from before
    assert clocks_problem(("a", ("cpu", "cpu")), ("b", ("wall", "wall"))) is None
    # A run on the CPU clock from before 2026-11-28 timed its preparation on the wall clock.
    problem = clocks_problem(("a", ("wall", "wall")), ("b", run_clocks({"clock": "cpu"})))
    assert problem is not None and problem.startswith("b: its steps are on the cpu clock")
    assert "input preparation on the wall clock" in problem
