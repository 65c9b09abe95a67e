"""The run summary reads whole columns at once (``records.metrics``); its per-request latency
statistics must equal, bit for bit, what the ``Request`` properties give one request at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.request import Request, RequestStatus
from core.settings import build
from records.metrics import PERCENTILES, summarize
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"


def _by_property(
    requests: list[Request], slo_ttft_s: float, slo_tpot_s: float
) -> dict[str, object]:
    finished = [r for r in requests if r.status is RequestStatus.FINISHED]
    out: dict[str, object] = {"completed": len(finished)}
    columns = {
        "ttft": [r.ttft_s for r in finished if r.ttft_s is not None],
        "tpot": [r.tpot_s for r in finished if r.tpot_s is not None],
        "e2el": [r.e2e_s for r in finished if r.e2e_s is not None],
        "queueing": [r.queueing_s for r in finished if r.queueing_s is not None],
    }
    for name, values in columns.items():
        arr = np.asarray(values, dtype=float) * 1000.0
        out[f"mean_{name}_ms"] = float(arr.mean())
        out[f"std_{name}_ms"] = float(arr.std())
        for p in PERCENTILES:
            key = "median" if p == 50 else f"p{p}"
            out[f"{key}_{name}_ms"] = float(np.percentile(arr, p))
    good = [
        r for r in finished if (r.ttft_s or 0.0) <= slo_ttft_s and (r.tpot_s or 0.0) <= slo_tpot_s
    ]
    out["num_good"] = len(good)
    out["rejected"] = sum(r.status is RequestStatus.REJECTED for r in requests)
    out["num_preemptions"] = sum(r.num_preemptions for r in requests)
    out["total_output_tokens"] = sum(r.num_output_tokens * r.n for r in finished)
    return out


@pytest.mark.parametrize(
    ("trace_file", "options"),
    [
        ("example.csv", {"policy": "chunked"}),
        # Recompute preemption: several runs a request, first tokens emitted again.
        ("bursty.csv", {"policy": "continuous", "num_blocks": 300}),
        ("bursty.csv", {"policy": "chunked", "num_blocks": 300, "preemption_mode": "swap"}),
        # Parallel sampling (n > 1) with prefix caching.
        (
            "parallel_sampling.csv",
            {"policy": "chunked", "enable_prefix_caching": True, "num_blocks": 200},
        ),
        # Two clocks; first tokens from a prefill replica.
        ("example.csv", {"policy": "continuous", "num_replicas": 2}),
        ("example.csv", {"policy": "disagg", "num_prefill": 1, "num_decode": 2}),
    ],
)
def test_summary_columns_equal_the_request_properties(
    trace_file: str, options: dict[str, object]
) -> None:
    config = build(RunConfig, model="Llama-2-7B", hardware="A100-80GB", **options)  # type: ignore[arg-type]
    requests = simulate(load_trace(DATA / trace_file), config).requests
    ttfts = sorted(r.ttft_s for r in requests if r.ttft_s is not None)
    tpots = sorted(r.tpot_s for r in requests if r.tpot_s is not None)
    # SLOs that some requests meet and some miss, so the goodput counts something.
    slo_ttft_s, slo_tpot_s = ttfts[len(ttfts) * 3 // 4], tpots[len(tpots) * 3 // 4]
    expected = _by_property(requests, slo_ttft_s, slo_tpot_s)
    assert 0 < expected["num_good"] < expected["completed"]  # type: ignore[operator]
    summary = summarize(requests, 10.0, slo_ttft_s, slo_tpot_s)
    for key, value in expected.items():
        if key == "num_good":
            assert summary["request_goodput"] == value / 10.0  # type: ignore[operator]
        else:
            assert summary[key] == value, key
    if trace_file == "bursty.csv":
        assert expected["num_preemptions"]
