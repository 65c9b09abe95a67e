"""What ``sim validate`` prints beside the errors: the decode-only steps' slow tail."""

from __future__ import annotations

from fidelity.cli.validate import _tail_text
from fidelity.validation import error_stats


def test_the_slow_tail_is_what_the_total_adds_over_the_median_step() -> None:
    # Nine steps 3% over the model and one 73% over: the median step is 3% over, the total
    # 10% (TPOT, a mean over a request's steps, carries the tail).
    predicted = [0.01] * 10
    measured = [0.0103] * 9 + [0.0173]
    stats = error_stats(predicted, measured)
    stats["measured_mean_s"] = sum(measured) / 10
    stats["predicted_mean_s"] = sum(predicted) / 10
    text = _tail_text(stats)
    assert text is not None
    assert "in total +10.0% over the model's, the median step +3.0%" in text
    assert "add +7.0 points" in text
    assert _tail_text({"median_pct": None}) is None
