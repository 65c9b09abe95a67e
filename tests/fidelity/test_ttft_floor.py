"""The TTFT step-phase floor (``fidelity.ttft_floor``) on synthetic runs where it is known in
closed form, checked against a seeded Monte Carlo of two independent step phases; the split of
a TTFT error into the wait for the step under way and the rest; the TTFT distribution's error;
and the step error by run phase."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from fidelity.ttft_floor import (
    MEDIAN_GAP_SHARE,
    distribution_error,
    mixture_median,
    phase_floor,
    step_under_way,
    wait_split,
)
from fidelity.validation import step_errors
from records.step_shapes import StepShapeRecord

STEP_S = 0.012


def _steps(num: int, step_s: float = STEP_S, first_s: float = 0.0) -> list[StepShapeRecord]:
    """Back-to-back decode steps of ``step_s`` from ``first_s``: duration plus a 10% update."""
    return [
        StepShapeRecord(
            step_idx=i,
            start_s=first_s + i * step_s,
            duration_s=0.9 * step_s,
            prepare_s=0.0,
            update_s=0.1 * step_s,
            request_ids=("r",),
            prefill_chunks=(),
            decode_context_tokens=(100,),
        )
        for i in range(num)
    ]


def _requests(arrivals: list[float], ttft_s: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [str(i) for i in range(len(arrivals))],
            "arrival_s": arrivals,
            "ttft_ms": [1e3 * t for t in ttft_s],
        }
    )


def test_the_step_under_way_and_the_wait_for_it() -> None:
    starts, busy = [0.0, 0.010, 0.030], [0.010, 0.010, 0.005]
    # before the first step, in step 0, in step 1, idle between 1 and 2, in 2, after the last
    durations, waits = step_under_way([-1.0, 0.004, 0.019, 0.025, 0.031, 0.5], starts, busy)
    assert durations.tolist() == pytest.approx([0, 0.010, 0.010, 0, 0.005, 0])
    assert waits.tolist() == pytest.approx([0, 0.006, 0.001, 0, 0.004, 0])
    assert step_under_way([0.1], [], [])[0].tolist() == [0.0]


def test_a_run_always_mid_step_has_the_closed_form_floor() -> None:
    # Every request arrives during a 12 ms step and takes 40 ms to its first token: each one's
    # TTFT in two runs with independent step boundaries differs by 12 ms |U1 - U2|, whose mean
    # is 4 ms (10% of TTFT) and median 12 (1 - 1/sqrt 2) ms.
    arrivals = [0.1 + 0.0371 * i for i in range(50)]
    floor = phase_floor(_requests(arrivals, [0.040] * 50), _steps(200))
    assert floor["n"] == 50 and floor["num_idle"] == 0
    assert floor["median_step_ms"] == pytest.approx(12.0)
    assert floor["expected_pct"] == pytest.approx(10.0)
    assert floor["median_pct"] == pytest.approx(100 * 0.3 * MEDIAN_GAP_SHARE, rel=1e-9)


def test_idle_arrivals_add_no_phase_error() -> None:
    # Three requests mid-step at D/TTFT = 0.3, one arriving with the engine idle (after the last
    # step): the mixture's CDF 1/4 + 3/4 F(t / 0.3) is 1/2 where (1 - t / 0.3)^2 = 2/3.
    arrivals = [0.1, 0.2, 0.3, 5.0]
    floor = phase_floor(_requests(arrivals, [0.040] * 4), _steps(100))
    assert floor["num_idle"] == 1
    assert floor["median_pct"] == pytest.approx(100 * 0.3 * (1 - math.sqrt(2 / 3)), rel=1e-9)
    assert floor["expected_pct"] == pytest.approx(10.0)  # the median of 10, 10, 10, 0
    assert mixture_median([0.0, 0.0, 0.3]) == 0.0


def test_the_exact_median_matches_a_seeded_monte_carlo() -> None:
    rng = np.random.default_rng(7)
    ratios = rng.uniform(0.0, 0.8, 40)
    ratios[:5] = 0.0
    draws = 20_000
    gaps = np.abs(rng.uniform(size=(draws, 40)) - rng.uniform(size=(draws, 40)))
    sampled = float(np.median(gaps * ratios))
    assert mixture_median(ratios.tolist()) == pytest.approx(sampled, rel=0.01)


def test_two_runs_split_into_the_wait_and_the_rest() -> None:
    # Both runs step every 12 ms; the second's steps start 6 ms later. A request arriving at
    # 3 ms into a first-run step waits 9 ms there and 3 ms in the second run (6 ms apart);
    # after the wait both take 20 ms, except request 1, 4 ms longer in the second run.
    first, second = _steps(100), _steps(100, first_s=0.006)
    arrivals = [0.015, 0.111, 0.207]
    a = _requests(arrivals, [0.029, 0.029, 0.029])
    b = _requests(arrivals, [0.023, 0.027, 0.023])
    steps = ([s.start_s for s in first], [s.busy_s for s in first])
    shifted = ([s.start_s for s in second], [s.busy_s for s in second])
    split = wait_split(a, steps, b, shifted)
    assert split["n"] == 3
    assert split["wait_pct"] == pytest.approx(100 * 0.006 / 0.029)
    assert split["rest_pct"] == pytest.approx(0.0)  # two of three rests agree
    assert split["ttft_pct"] == pytest.approx(100 * 0.006 / 0.029)


def test_the_distribution_error_compares_quantiles_not_requests() -> None:
    # The same TTFTs given to other requests: every request is off, the distribution is not.
    rows = [
        {"ttft_meas": m, "ttft_pred": p}
        for m, p in zip([10.0, 20.0, 30.0, 40.0], [40.0, 30.0, 20.0, 10.0], strict=True)
    ]
    out = distribution_error(rows)
    assert out["n"] == 4
    assert out["median"]["error_pct"] == pytest.approx(0.0)
    assert out["p90"]["error_pct"] == pytest.approx(0.0)
    slower = distribution_error([{"ttft_meas": 10.0, "ttft_pred": 12.0}] * 3)
    assert slower["median"]["error_pct"] == pytest.approx(20.0)


def test_step_error_by_run_phase_shows_an_early_slowdown() -> None:
    # Ten decode steps, the first two (the first fifth) 25% slower than the model's price.
    steps = _steps(10)
    slow = [replace(s, duration_s=1.25 * s.busy_s - s.update_s) for s in steps[:2]]
    price = steps[5].busy_s
    out = step_errors([*slow, *steps[2:]], lambda shape: price, None)
    early, rest = out["by_phase"]["early"]["decode-only"], out["by_phase"]["rest"]["decode-only"]
    assert early["n"] == 2 and early["median_pct"] == pytest.approx(100 * (1 / 1.25 - 1))
    assert rest["n"] == 8 and rest["median_pct"] == pytest.approx(0.0)
    assert out["by_phase"]["early"]["prefill-heavy"]["n"] == 0
