"""The comparison maths of ``sim validate`` on handmade runs with known errors: per-request
error statistics and the join, per-step error by batch shape, aggregates, divergence."""

from __future__ import annotations

import pandas as pd
import pytest

from fidelity import validation
from records.step_shapes import StepShapeRecord
from sim.costmodel.step_shape import StepShape


def _step(idx: int, ids: tuple[str, ...], chunks=(), contexts=(), busy: float = 1.0):  # type: ignore[no-untyped-def]
    return StepShapeRecord(
        step_idx=idx,
        start_s=float(idx),
        duration_s=busy * 0.75,
        prepare_s=0.0,
        update_s=busy * 0.25,
        request_ids=ids,
        prefill_chunks=tuple(chunks),
        decode_context_tokens=tuple(contexts),
    )


def test_error_stats_of_known_errors() -> None:
    measured = [100.0, 100.0, 100.0, 100.0, 100.0]
    predicted = [110.0, 90.0, 120.0, 100.0, 70.0]  # +10, -10, +20, 0, -30 %
    stats = validation.error_stats(predicted, measured)
    assert stats["n"] == 5
    assert stats["median_abs_pct"] == pytest.approx(10.0)
    assert stats["bias_pct"] == pytest.approx(-2.0)
    # numpy's linear p90 of |err| = (0, 10, 10, 20, 30) is 26.
    assert stats["p90_abs_pct"] == pytest.approx(26.0)


def test_error_stats_skips_missing_and_zero_measurements() -> None:
    stats = validation.error_stats([1.0, 2.0, float("nan"), 5.0], [0.0, 1.0, 3.0, 5.0])
    assert stats["n"] == 2
    assert stats["median_abs_pct"] == pytest.approx(50.0)
    empty = validation.error_stats([], [])
    assert empty["n"] == 0 and empty["median_abs_pct"] is None
    with pytest.raises(ValueError, match="3 values"):
        validation.error_stats([1.0, 2.0, 3.0], [1.0])


def _requests(ids: list[str], scale: float) -> pd.DataFrame:
    base = [10.0 * (i + 1) for i in range(len(ids))]
    return pd.DataFrame(
        {
            "request_id": ids,
            "ttft_ms": [b * scale for b in base],
            "tpot_ms": [2.0 * scale] * len(ids),
            "itl_max_ms": [5.0] * len(ids),
            "e2el_ms": [100.0 * scale + b for b in base],
        }
    )


def test_request_errors_join_one_to_one_and_give_known_errors() -> None:
    measured = _requests(["a", "b", "c", "d"], 1.0)
    predicted = _requests(["d", "c", "b", "a"], 1.0)  # order does not matter
    predicted["ttft_ms"] = measured["ttft_ms"].to_numpy()[::-1] * 1.2
    predicted["tpot_ms"] = 2.0 * 0.9
    out = validation.request_errors(measured, predicted)
    assert out["num_joined"] == 4
    assert {r["request_id"] for r in out["rows"]} == {"a", "b", "c", "d"}
    assert out["metrics"]["ttft"]["median_abs_pct"] == pytest.approx(20.0)
    assert out["metrics"]["ttft"]["bias_pct"] == pytest.approx(20.0)
    assert out["metrics"]["tpot"]["bias_pct"] == pytest.approx(-10.0)
    assert out["metrics"]["itl"]["median_abs_pct"] == pytest.approx(0.0)
    row = next(r for r in out["rows"] if r["request_id"] == "b")
    assert row["ttft_meas"] == pytest.approx(20.0) and row["ttft_pred"] == pytest.approx(24.0)


def test_request_ids_must_be_unique() -> None:
    measured = _requests(["a", "a"], 1.0)
    with pytest.raises(ValueError, match="request_id 'a' repeats"):
        validation.request_errors(measured, _requests(["a", "b"], 1.0))


def test_step_errors_by_batch_shape() -> None:
    steps = [
        _step(0, ("a",), chunks=[(100, 0)], busy=2.0),  # prefill-heavy
        _step(1, ("a", "b"), chunks=[(2, 0)], contexts=[101, 50, 60], busy=1.0),  # mixed
        _step(2, ("a", "b"), contexts=[102, 51], busy=1.0),  # decode-only
        _step(3, ("a", "b"), contexts=[103, 52], busy=0.5),
    ]
    assert [s.kind for s in steps] == ["prefill-heavy", "mixed", "decode-only", "decode-only"]

    def price(shape: StepShape) -> float:
        # 10% slow on prefill tokens, exact on decodes, with a known per-step cost.
        return 0.02 * shape.num_prefill_tokens * 1.1 + 0.5 * bool(shape.decode_context_tokens)

    out = validation.step_errors(steps, price, None)
    assert out["by_kind"]["prefill-heavy"]["median_abs_pct"] == pytest.approx(10.0)
    assert out["by_kind"]["prefill-heavy"]["bias_pct"] == pytest.approx(10.0)
    # Decode-only steps: 0.5 predicted against 1.0 (-50%) and 0.5 (0%).
    assert out["by_kind"]["decode-only"]["n"] == 2
    assert out["by_kind"]["decode-only"]["bias_pct"] == pytest.approx(-25.0)
    assert out["by_kind"]["mixed"]["bias_pct"] == pytest.approx(100 * (0.544 - 1.0))
    assert [r["measured_s"] for r in out["rows"]] == [2.0, 1.0, 1.0, 0.5]


def test_step_errors_by_decode_skew() -> None:
    steps = [
        # Measured: a kernel padded to the longest context, 0.01 s per sequence x 100 tokens.
        _step(0, ("a", "b"), contexts=[100, 100], busy=2.0),  # uniform
        _step(1, ("a", "b"), contexts=[10, 190], busy=3.8),  # skewed: max 1.9x the mean
        _step(2, ("a",), contexts=[100], busy=1.0),  # one decode: neither
    ]
    assert [validation.decode_skew(s.decode_context_tokens) for s in steps] == [
        "uniform",
        "skewed",
        None,
    ]

    def at_mean_context(shape: StepShape) -> float:
        # Priced at the mean context: exact on uniform steps, fast on skewed ones.
        contexts = shape.decode_context_tokens
        return 0.01 * len(contexts) * sum(contexts) / len(contexts)

    out = validation.step_errors(steps, at_mean_context, None)
    assert out["by_decode_skew"]["uniform"]["median_abs_pct"] == pytest.approx(0.0)
    assert out["by_decode_skew"]["skewed"]["bias_pct"] == pytest.approx(100 * (2.0 - 3.8) / 3.8)
    assert out["by_decode_skew"]["skewed"]["n"] == 1
    assert [r["decode_skew"] for r in out["rows"]] == ["uniform", "skewed", None]


def test_first_divergence_names_the_step_and_both_batches() -> None:
    engine = [_step(0, ("a",), chunks=[(8, 0)]), _step(1, ("a", "b"), contexts=[9, 5])]
    same = [_step(0, ("a",), chunks=[(8, 0)], busy=9.0), _step(1, ("a", "b"), contexts=[9, 5])]
    assert validation.first_divergence(engine, same)["step_idx"] is None
    other = [_step(0, ("a",), chunks=[(8, 0)]), _step(1, ("a",), contexts=[9])]
    div = validation.first_divergence(engine, other)
    assert div["step_idx"] == 1
    assert div["measured"]["request_ids"] == ["a", "b"]
    assert div["predicted"]["request_ids"] == ["a"]
    shorter = validation.first_divergence(engine, engine[:1])
    assert shorter["step_idx"] == 1 and shorter["predicted"] is None


def test_aggregates_side_by_side() -> None:
    out = validation.aggregates(
        {"output_throughput": 100.0, "num_preemptions": 0, "completed": 4},
        {"output_throughput": 90.0, "num_preemptions": 2, "completed": 4},
    )
    assert out["output_throughput"]["error_pct"] == pytest.approx(-10.0)
    assert out["num_preemptions"] == {"measured": 0.0, "predicted": 2.0, "error_pct": None}
    assert out["completed"]["error_pct"] == pytest.approx(0.0)


def test_step_errors_by_decode_batch() -> None:
    """A fixed cost priced 0.1 s too high shows at one sequence and fades by 64: the groups
    hold only decode-only steps, labelled by their batch sizes."""
    steps = [
        _step(0, ("a",), contexts=[10], busy=1.0),
        _step(1, ("a",), contexts=[11], busy=1.0),
        _step(2, ("a", "b", "c"), contexts=[10, 10, 10], busy=3.0),
        _step(3, tuple("abcdefgh"), contexts=[10] * 70, busy=70.0),
        _step(4, ("a",), chunks=[(8, 0)], contexts=[12], busy=5.0),  # mixed: not a decode group
    ]

    def price(shape: StepShape) -> float:
        return 0.1 + 1.0 * len(shape.decode_context_tokens) + 0.1 * shape.num_prefill_tokens

    groups = validation.step_errors(steps, price, None)["by_decode_batch"]
    assert list(groups) == ["1", "3-4", "65+"]
    assert groups["1"]["n"] == 2 and groups["1"]["median_pct"] == pytest.approx(10.0)
    assert groups["1"]["median_residual_s"] == pytest.approx(-0.1)
    assert groups["3-4"]["median_pct"] == pytest.approx(100 * 0.1 / 3)
    assert groups["65+"]["median_residual_s"] == pytest.approx(-0.1)
    assert groups["65+"]["median_pct"] == pytest.approx(100 * 0.1 / 70)
