"""The ITL percentiles of the run summary, found per count group by bisection (less memory),
equal ``weighted_percentiles`` (one sorted copy) to the last bit, and numpy's linear method
over the expanded samples to rounding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.settings import build
from records.metrics import PERCENTILES, _grouped_percentiles, summarize
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"


def weighted_percentiles(
    values: Sequence[float] | np.ndarray, counts: Sequence[int] | np.ndarray, qs: Sequence[float]
) -> list[float]:
    """The reference: the ``qs``-th percentiles (numpy's linear method) of ``values`` repeated
    ``counts`` times, read off one sorted copy and the running sum of its counts."""
    order = np.argsort(np.asarray(values, dtype=float), kind="stable")
    v = np.asarray(values, dtype=float)[order]
    c = np.cumsum(np.asarray(counts, dtype=np.int64)[order])
    out: list[float] = []
    for q in qs:
        h = (c[-1] - 1) * q / 100.0
        lo, hi = math.floor(h), math.ceil(h)
        v_lo = v[np.searchsorted(c, lo, side="right")]
        v_hi = v[np.searchsorted(c, hi, side="right")]
        out.append(float(v_lo + (v_hi - v_lo) * (h - lo)))
    return out


def _sorted_by_count(values: np.ndarray, counts: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The groups ``itl_groups`` gives: (count, its values sorted), for each positive count."""
    return [
        (int(count), np.sort(values[counts == count])) for count in np.unique(counts) if count > 0
    ]


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=True)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(finite, st.integers(0, 5)), min_size=1, max_size=60).filter(
        lambda pairs: sum(c for _, c in pairs) > 0
    ),
    st.lists(st.floats(0, 100), min_size=1, max_size=4),
)
def test_grouped_percentiles_equal_the_expanded_samples(
    pairs: list[tuple[float, int]], qs: list[float]
) -> None:
    values = np.array([v for v, _ in pairs], dtype=np.float64)
    counts = np.array([c for _, c in pairs], dtype=np.int32)
    total = int(counts.sum())
    grouped = _grouped_percentiles(_sorted_by_count(values, counts), total, qs)
    expanded = np.repeat(values, counts)
    assert grouped == weighted_percentiles(values, counts, qs)
    # numpy interpolates with another formula: its rounding error scales with the operands
    # (values up to 1e6 here), not with the result.
    scale = max(1.0, float(np.abs(values).max()))
    for got, q in zip(grouped, qs, strict=True):
        assert got == pytest.approx(float(np.percentile(expanded, q)), rel=1e-12, abs=1e-12 * scale)


def test_grouped_percentiles_with_ties_across_counts_and_zeros() -> None:
    values = np.array([3.0, 1.0, 3.0, 0.0, -0.0, 2.5, 1.0], dtype=np.float64)
    counts = np.array([1, 4, 2, 3, 1, 0, 5], dtype=np.int32)
    grouped = _grouped_percentiles(_sorted_by_count(values, counts), int(counts.sum()), PERCENTILES)
    expanded = np.repeat(values, counts)
    assert grouped == weighted_percentiles(values, counts, PERCENTILES)
    assert grouped == pytest.approx([float(np.percentile(expanded, q)) for q in PERCENTILES])
    assert grouped[0] == 1.0  # (2.5 is counted 0 times: never a sample)


def test_grouped_percentiles_of_one_sample() -> None:
    groups = _sorted_by_count(np.array([7.25]), np.array([3], dtype=np.int32))
    assert _grouped_percentiles(groups, 3, (0, 50, 100)) == pytest.approx([7.25] * 3, abs=0)


@pytest.mark.parametrize(
    ("trace_file", "options"),
    [
        ("example.csv", {"policy": "chunked"}),
        # Preemption by swap splits runs: gaps between runs count one by one.
        ("example.csv", {"policy": "continuous", "num_blocks": 300, "preemption_mode": "swap"}),
        # Two replicas: two clocks. Disaggregated: first tokens come from a prefill replica.
        ("example.csv", {"policy": "continuous", "num_replicas": 2}),
        ("example.csv", {"policy": "disagg", "num_prefill": 1, "num_decode": 1}),
    ],
)
def test_itl_summary_equals_every_expanded_gap(trace_file: str, options: dict[str, object]) -> None:
    config = build(RunConfig, model="Llama-2-7B", hardware="A100-80GB", **options)  # type: ignore[arg-type]
    result = simulate(load_trace(DATA / trace_file), config)
    gaps_ms = np.array([g for r in result.requests for g in r.tokens.gaps_s()]) * 1000.0
    assert gaps_ms.size > 100
    if options.get("preemption_mode") == "swap":
        assert any(len(r.tokens.run_starts) > 1 for r in result.requests)  # gaps between runs
    if options["policy"] == "disagg":
        assert any(r.tokens.external_first_s is not None for r in result.requests)
    summary = summarize(result.requests, 1.0)
    assert summary["mean_itl_ms"] == pytest.approx(float(gaps_ms.mean()), rel=1e-12)
    assert summary["std_itl_ms"] == pytest.approx(float(gaps_ms.std()), rel=1e-9)
    ones = np.ones(gaps_ms.size, dtype=np.int64)
    expected = weighted_percentiles(gaps_ms, ones, PERCENTILES)
    assert [summary[f"{n}_itl_ms"] for n in ("median", "p90", "p99")] == expected
