"""The simulator against servesim's engine on the recorded H200 runs (``../shared/gpu-runs``),
offline: ``sim validate --replay RUN --profile P`` reads the compressed run as it is, and a
budget holds on three of the runs with both recorded profiles. The targets of issue 30 (TPOT and
E2E <= 5%, TTFT <= 10%, steps <= 5%, the profiles within 5%) and what is reached on all nine
runs are in ``benchmarks/results/validate_recorded.txt``; the budget here only keeps what is
reached from sliding back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from fidelity.recorded import RECORDED, profile_path, recorded_runs
from sim.cli.main import main as sim_main

ROOT = Path(__file__).resolve().parents[2].parent / "shared" / RECORDED
RUNS = ["example-chunked-run3", "bursty-chunked-run1", "shared_prefix-chunked-prefixcache-run2"]
BUDGET = {"ttft": 30.0, "tpot": 10.0, "e2e": 10.0, "steps": 10.0}
PROFILES_AGREE = 12.0

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(not ROOT.exists(), reason=f"{ROOT} is not there"),
]


def test_validate_replays_a_recorded_run_from_its_folder(tmp_path: Path) -> None:
    run = ROOT / "engine-runs" / "example-chunked-run3"
    argv = ["validate", "--replay", str(run), "--profile", str(profile_path(ROOT, "cal1"))]
    assert sim_main([*argv, "--out", str(tmp_path), "--quiet"]) == 0
    result = json.loads((tmp_path / "validation.json").read_text())
    assert result["trace"] == "example" and result["num_requests"] == 200
    assert result["roofline_hardware"] == "H200" and result["engine_kind"] == "servesim-eager"
    assert result["profile_spread"]["gpu_clock"] == "roofline"


def test_a_budget_holds_on_the_recorded_runs(tmp_path: Path) -> None:
    figures = recorded_runs(ROOT, tmp_path, RUNS)
    for run, models in figures["runs"].items():
        for profile in ("cal1", "cal2"):
            row = models[profile]
            over = {k: round(row[k], 1) for k, limit in BUDGET.items() if row[k] > limit}
            assert not over, f"{run} with {profile}: over budget {over}"
        assert figures["profiles_agree"][run] <= PROFILES_AGREE
        # Step phase alone keeps per-request TTFT from any model's reach below ~12%.
        floor = figures["ttft_phase_floor"][run]
        assert 10 < floor["median_pct"] < floor["expected_pct"] < 25
    assert figures["profiles_differ"]["verdict"] == "host"


def test_on_their_own_hosts_the_slow_runs_come_close(tmp_path: Path) -> None:
    # Two runs were made on a slower host than their configuration's others (found from
    # their input preparation alone, fidelity/host_speed.py: 1.173x and 1.325x). Priced on it,
    # shared_prefix's run 1 meets issue 30's TPOT and E2E target with calibration 2 and the
    # roofline (3.9-4.2%; calibration 1 8.1-8.4%); example's run 1, whose host slowed further
    # as it ran, comes to 6.4-12.3% from 19.1-25.8%.
    runs = ["example-chunked-run1", "shared_prefix-chunked-prefixcache-run1"]
    figures = recorded_runs(ROOT, tmp_path, runs)
    budget = {runs[0]: 13.0, runs[1]: 9.0}
    for run in runs:
        assert figures["host_slowdown"][run] > 1.1
        for name, row in figures["on_own_host"][run].items():
            before = figures["runs"][run][name]
            for metric in ("tpot", "e2e"):
                assert row[metric] <= budget[run], f"{run} {name} {metric}: {row[metric]:.1f}"
                assert row[metric] < before[metric] - 3, f"{run} {name} {metric}"
