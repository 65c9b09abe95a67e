"""The decode-only steps' slow tail beside the errors (``validation.tail_stats``), how much of
it the host's own stalls carry, and the line ``sim validate`` prints of it."""

from __future__ import annotations

import dataclasses

import pytest

from fidelity.cli.validate import _tail_text
from fidelity.host_speed import HICCUP, step_ratios
from fidelity.validation import tail_stats
from records.step_shapes import StepShapeRecord


def _rows(measured: list[float], kind: str = "decode-only") -> list[dict[str, object]]:
    return [{"kind": kind, "measured_s": m, "predicted_s": 0.01} for m in measured]


def test_the_slow_tail_is_what_the_total_adds_over_the_median_step() -> None:
    # Nine steps 3% over the model and one 73% over: the median step is 3% over, the total
    # 10% (a request's TPOT, a mean over its steps, carries the tail).
    rows = [*_rows([0.0103] * 9 + [0.0173]), *_rows([0.05], "prefill-heavy")]
    tail = tail_stats(rows, None, HICCUP)
    assert tail["n"] == 10
    assert tail["total_pct"] == pytest.approx(10.0)
    assert tail["median_step_pct"] == pytest.approx(3.0)
    assert tail["tail_pts"] == pytest.approx(7.0)
    assert "tail_without_hiccups_pts" not in tail
    # The slow step's input preparation ran slow too: without it no tail is left.
    ratios: list[float | None] = [1.0] * 9 + [1.5, None]
    tail = tail_stats(rows, ratios, HICCUP)
    assert tail["hiccup_share"] == pytest.approx(0.1)
    assert tail["tail_without_hiccups_pts"] == pytest.approx(0.0, abs=1e-9)
    text = _tail_text(tail)
    assert text is not None
    assert "in total +10.0% over the model's, the median step +3.0%" in text
    assert "add +7.0 points to a TPOT; +0.0 without the 10.0% whose input preparation" in text
    assert _tail_text({"n": 0}) is None


def test_each_steps_preparation_is_read_against_the_runs_own_fit() -> None:
    steps = []
    for i in range(40):
        decodes = tuple(range(100, 100 + 4 * (1 + i % 8), 4))
        prepare = 1e-4 + 1e-5 * len(decodes)
        steps.append(StepShapeRecord(i, 0.0, 0.01, prepare, 0.0, (), (), decodes))
    steps[7] = dataclasses.replace(steps[7], prepare_s=1.5 * steps[7].prepare_s)
    steps[9] = dataclasses.replace(steps[9], prepare_s=0.0)  # (not timed)
    ratios = step_ratios(steps)
    # (The slow step is in the fit too, which moves the rest by a hair.)
    assert ratios[7] == pytest.approx(1.5, rel=0.02)
    assert ratios[9] is None
    assert all(r == pytest.approx(1.0, rel=0.02) for i, r in enumerate(ratios) if i not in (7, 9))


def test_the_decode_batches_line_gives_each_groups_error_and_residual() -> None:
    from fidelity.cli.validate import _batch_text

    groups = {
        "1": {"n": 603, "median_pct": 4.04, "median_residual_s": -203.4e-6},
        "17-32": {"n": 1034, "median_pct": -0.51, "median_residual_s": 33e-6},
        "65+": {"n": 0, "median_pct": None, "median_residual_s": None},
    }
    text = _batch_text(groups)
    assert text == (
        "decode-only steps by batch, median signed error, measured - priced: "
        "1: +4.0% -203 us (603), 17-32: -0.5% +33 us (1034)"
    )
    assert _batch_text({}) == ""
