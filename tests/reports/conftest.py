"""Shared fixtures for report tests: the bundled example simulated with chunked prefill (saved
as a run directory) and with static batching, plus fabricated runs of any size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.settings import build
from records.run_dir import RunRecords, load_run, records_from_result
from records.schema import STEP_COLUMNS
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "data" / "example.csv"


@pytest.fixture(scope="session")
def example_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("example-run")
    simulate(load_trace(str(EXAMPLE)), build(RunConfig, policy="chunked")).write(out)
    return out


@pytest.fixture(scope="session")
def example_run(example_dir: Path) -> RunRecords:
    return load_run(example_dir)


@pytest.fixture(scope="session")
def static_run() -> RunRecords:
    result = simulate(load_trace(str(EXAMPLE)), build(RunConfig, policy="static"))
    return records_from_result(result, command="python -m sim run example.csv --policy static")


def fabricate_run(
    num_requests: int, num_steps: int, label: str = "fabricated", disagg: bool = False
) -> RunRecords:
    """A run with plausible columns (not a simulation): for size, edge and layout tests."""
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, num_requests / 10, num_requests))
    ttft = rng.gamma(2.0, 20.0, num_requests)
    requests = pd.DataFrame(
        {
            "request_id": np.arange(num_requests),
            "status": "finished",
            "arrival_s": arrival,
            "first_token_s": arrival + ttft / 1000,
            "prompt_tokens": rng.integers(10, 2000, num_requests),
            "output_tokens": rng.integers(1, 500, num_requests),
            "queueing_ms": ttft / 2,
            "ttft_ms": ttft,
            "tpot_ms": rng.normal(8, 1, num_requests),
            "e2el_ms": ttft + rng.gamma(2.0, 500.0, num_requests),
        }
    )
    total = 100_000
    steps = {name: np.zeros(num_steps, dtype=np.int64) for name in STEP_COLUMNS}
    frame = pd.DataFrame(steps)
    frame["start_s"] = np.linspace(0, num_requests / 10, num_steps)
    frame["duration_s"] = rng.uniform(0.005, 0.05, num_steps)
    frame["num_running"] = rng.integers(0, 200, num_steps)
    frame["num_decode_tokens"] = frame["num_running"]
    frame["real_token_slots"] = rng.integers(0, total // 2, num_steps)
    frame["internal_fragmentation_slots"] = frame["num_running"] * 8
    frame["free_slots"] = total - frame["real_token_slots"] - frame["internal_fragmentation_slots"]
    frame["pool"] = "colocated"
    if disagg:
        requests["kv_transfer_start_s"] = requests["first_token_s"]
        requests["kv_transfer_bytes"] = requests["prompt_tokens"] * 131072.0
        requests["kv_transfer_queue_ms"] = rng.exponential(3.0, num_requests)
        frame["pool"] = np.where(np.arange(num_steps) % 2 == 0, "prefill", "decode")
    summary = {"num_requests": num_requests, "completed": num_requests, "mean_ttft_ms": 1.5}
    return RunRecords(label=label, config={}, summary=summary, requests=requests, steps=frame)


@pytest.fixture
def fabricated() -> Callable[..., RunRecords]:
    return fabricate_run
