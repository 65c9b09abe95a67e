"""The GPU check's ``model-fits`` part on CPU, on the H200 check committed in
``benchmarks/results/gpu-h200-2026-11-27/call2``: its two commands (the decode walk's fit to the
graph replays, the GEMM efficiencies and servesim's own kernels from the calibrations' tables) run
as the check runs them, and its figures give back what the H200 preset states."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from engine.gpu_check import command, summary
from engine.gpu_check.parts import CheckSettings, plan
from engine.gpu_check.run import Check

ROOT = Path(__file__).resolve().parents[2]
CALL2 = ROOT / "benchmarks" / "results" / "gpu-h200-2026-11-27" / "call2"


def test_only_an_engine_with_graphs_gets_the_fits(tmp_path: Path) -> None:
    eager = {p.name for p in plan(CheckSettings(out=tmp_path))}
    graphs = {p.name: p for p in plan(CheckSettings(out=tmp_path, graphs=True))}
    assert "model-fits" not in eager
    assert graphs["model-fits"].after == ("calibrate", "engine-self")
    # Both scripts take the flags the part gives them (their --help, as the dry run checks).
    env, _ = command.child_env(tmp_path / "shim")
    assert command.check_parts([graphs["model-fits"]], sys.executable, env) == {"model-fits": []}


def test_the_fits_give_back_the_h200_preset(tmp_path: Path) -> None:
    out = tmp_path / "check"
    for part in ("calibrate", "engine-self"):
        shutil.copytree(CALL2 / part, out / part)
    settings = CheckSettings(out=out, hardware="H200", graphs=True)
    (part,) = [p for p in plan(settings) if p.name == "model-fits"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = Check(
        out, 600.0, sys.executable, env, on_result=lambda r: summary.write_summary(out, {}, r)
    )
    result = check.run_part(part)
    assert result.status == "passed", result.reason
    figures = result.figures
    assert figures["stated_tile_us"] == 2.1
    for run in ("run1", "run2"):
        assert figures[f"{run}_tile_us"] == pytest.approx(2.1, abs=0.1)
        assert figures[f"{run}_fit_median_abs_pct"] < 2.0
    fits = figures["H200_efficiencies"]
    assert set(fits) == {
        "memory_bandwidth_efficiency",
        "gemm_flops_efficiency",
        "gemm_overlap_efficiency",
    }
    # Fitted on two of the four calibrations the preset was derived from: within 0.02.
    for fitted, stated in fits.values():
        assert fitted == pytest.approx(stated, abs=0.02)
    # servesim's own kernels from the same two tables: (stated, how close the fit comes). The
    # LM head's tables spread most: 90-136 us table by table (these two: 98 and 136).
    own = {
        "H200_decode_latency_us": (4.7, 0.2),
        "H200_fused_row_latency_us": (3.3, 0.1),
        "H200_fused_row_bandwidth_efficiency": (0.91, 0.02),
        "H200_lm_head_latency_us": (98.2, 40),
    }
    for figure, (preset, within) in own.items():
        fitted, stated = figures[figure]
        assert stated == preset, figure
        assert fitted == pytest.approx(stated, abs=within), figure
