"""The validation report says what it compared (issue 30): the engine's kind, clock and decode
split, the profile's own spread, and the engine against itself, read from a real
``validation.json`` (the H200 check's, call 2)."""

from __future__ import annotations

import gzip
import json
from html import escape
from pathlib import Path

from reports.validation import compared_text, write_validation_report

CALL2 = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu-h200-2026-11-27/call2"


def _result() -> dict:
    path = CALL2 / "validate-example-chunked" / "validation.json.gz"
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_the_report_names_the_engine_the_profile_spread_and_the_floor(tmp_path: Path) -> None:
    result = _result()
    text = compared_text(result)
    # Call 2 ran before the decode split was recorded: it ran (and reads as) "fixed".
    assert "Engine servesim-graphs (clock wall, decode split fixed)." in text
    assert "Its table points spread 1.7% (median)." in text
    assert "median |difference| per request: TTFT 12.6%, TPOT 2.9%, E2E 2.9%." in text
    page = write_validation_report(result, tmp_path / "v.html").read_text(encoding="utf-8")
    assert escape(text) in page


def test_without_a_second_run_it_says_there_is_no_floor() -> None:
    result = {**_result(), "decode_split": "per_sequence"}
    del result["engine_floor"]
    text = compared_text(result)
    assert "decode split per_sequence" in text
    assert "no noise floor" in text


def test_the_report_says_how_fast_the_runs_host_was_and_what_was_priced() -> None:
    result = _result()
    assert "host was" not in compared_text(result)  # (call 2's profile stored no preparation)
    result["host_speed"] = {"slowdown": 1.234, "by_fifth": [1.2] * 5, "applied": 1.234}
    assert "host was 1.23x as slow as the calibration's" in compared_text(result)
    assert "priced it at 1.23x" in compared_text(result)
    result["host_speed"] = {"error": "no preparation times", "applied": 1.5}
    assert "priced the run's host at 1.50x" in compared_text(result)


def test_the_report_gives_the_gpu_time_scale_and_the_runs_slow_tail() -> None:
    result = _result()
    text = compared_text(result)
    assert "scaled by" not in text and "slow steps add" not in text  # (call 2: neither)
    result["profile_spread"] = {**result["profile_spread"], "device_scale": 1.274}
    tail = {"n": 900, "total_pct": 9.8, "median_step_pct": 2.9, "tail_pts": 6.9}
    result["models"]["calibrated"]["tail"] = {
        **tail, "hiccup": 1.2, "hiccup_share": 0.095, "tail_without_hiccups_pts": 2.7,
    }  # fmt: skip
    text = compared_text(result)
    assert "Its GPU time is scaled by 1.27, as its GPU-bound whole steps measured." in text
    assert "took +9.8% against the calibrated model in total and +2.9% by median step" in text
    assert "add +6.9 points to a TPOT, +2.7 without the 9.5% whose input preparation" in text
