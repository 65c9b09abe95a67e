"""The engine's loop between steps (``fidelity.loop_gap``): the gap after each step's update
until the next step starts, over back-to-back steps only (a wait for an arrival is no loop)."""

from __future__ import annotations

import io

import pytest

from fidelity.cli.validate import print_context
from fidelity.loop_gap import loop_gap
from records.step_shapes import StepShapeRecord


def _steps(
    starts_s: list[float], busy_s: float = 0.006, update_s: float = 0.0005
) -> list[StepShapeRecord]:
    return [
        StepShapeRecord(
            step_idx=i,
            start_s=start,
            duration_s=busy_s - update_s,
            prepare_s=0.0,
            update_s=update_s,
            request_ids=("r",),
            prefill_chunks=(),
            decode_context_tokens=(100,),
        )
        for i, start in enumerate(starts_s)
    ]


def test_the_gap_is_the_loops_time_after_each_update_and_waits_are_left_out() -> None:
    # Steps of 6 ms, each 60 us after the last one's end, and one wait of 0.5 s for an arrival.
    starts, t = [], 0.0
    for i in range(9):
        starts.append(t)
        t += 0.006 + (0.5 if i == 4 else 60e-6)
    gap = loop_gap(_steps(starts))
    assert gap["num_steps"] == 9 and gap["back_to_back"] == 7
    assert gap["gap_s"] == pytest.approx(60e-6)
    assert gap["share_pct"] == pytest.approx(1.0)
    assert gap["update_s"] == pytest.approx(0.0005)


def test_no_back_to_back_steps_give_no_gap_and_validate_prints_none() -> None:
    gap = loop_gap(_steps([0.0, 1.0, 2.0]))
    assert gap["back_to_back"] == 0 and gap["gap_s"] is None and gap["share_pct"] is None
    assert loop_gap([])["gap_s"] is None


def test_sim_validate_prints_the_gap_beside_its_errors() -> None:
    starts = [i * (0.006 + 60e-6) for i in range(5)]
    run = {"trace": "t", "num_requests": 1}
    out = io.StringIO()
    print_context({**run, "engine_loop_gap": loop_gap(_steps(starts))}, file=out)
    assert "loop between steps" in out.getvalue()
    assert "60 us a step, 1.00% of its median step" in out.getvalue()
    out = io.StringIO()
    print_context({**run, "engine_loop_gap": loop_gap(_steps([0.0, 1.0]))}, file=out)
    assert "loop between steps" not in out.getvalue()
