"""The overload check (``records.overload``): offered against served prompt tokens over the
arrival window, the backlog at the last arrival, and where a run shows it (its printed summary,
summary.json, the report) without any simulated number changing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from records.overload import find_overload, frame_overload
from reports.cli import main as report_main
from sim.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "traces" / "data" / "example.csv"
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "synthetic_trace.jsonl"


def test_a_deployment_that_keeps_up_is_not_overloaded() -> None:
    arrival = np.arange(100, dtype=float)  # one request a second, each served in 0.2 s
    assert find_overload(arrival, arrival + 0.2, np.full(100, 500.0), 100.0) is None


def test_a_growing_queue_is_overloaded_with_both_rates_and_the_backlog() -> None:
    arrival = np.arange(100, dtype=float)  # 500 tokens/s offered, first tokens every 2 s
    first = 2.0 * np.arange(100) + 0.5
    overload = find_overload(arrival, first, np.full(100, 500.0), 200.0)
    assert overload is not None
    # 99 requests arrive before the last one (at 99 s); 50 of them (first tokens at 0.5 s ..
    # 98.5 s) are served by then.
    assert overload.offered_prompt_tokens_per_s == pytest.approx(99 * 500 / 99)
    assert overload.served_prompt_tokens_per_s == pytest.approx(50 * 500 / 99)
    assert (overload.backlog_requests, overload.backlog_prompt_tokens) == (50, 50 * 500)
    assert overload.drain_s == pytest.approx(101.0)
    assert "500 prompt tokens/s offered, 253 served" in overload.warning


def test_no_rate_no_verdict() -> None:
    one = np.zeros(1)
    assert find_overload(one, np.full(1, np.nan), np.ones(1), 5.0) is None
    at_once = np.zeros(5)  # every request at one instant: no offered rate
    assert find_overload(at_once, np.full(5, np.nan), np.ones(5), 5.0) is None


def test_rejected_rows_are_not_offered_load() -> None:
    frame = pd.DataFrame(
        {
            "status": ["finished", "rejected", "finished"],
            "arrival_s": [0.0, 0.5, 1.0],
            "first_token_s": [0.1, None, 1.1],
            "prompt_tokens": [10, 10_000, 10],
        }
    )
    assert frame_overload(frame, 1.2) is None


def _run(tmp_path: Path, name: str, argv: list[str]) -> tuple[dict[str, Any], Path]:
    """Run with --out and --report (beside the folder, as NAME.html); summary.json and --out."""
    out = tmp_path / name
    assert main(["run", *argv, "--out", str(out), "--report", str(out) + ".html"]) == 0
    return json.loads((out / "summary.json").read_text()), out


def test_an_overloaded_run_warns_in_its_summary_files_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Static batches of 8 cannot keep up with the example's 3.6 requests a second.
    payload, out = _run(tmp_path, "static", [str(EXAMPLE), "--policy", "static"])
    printed = capsys.readouterr().out
    warning = next(line for line in printed.splitlines() if line.startswith("warning"))
    overload = payload["overload"]
    assert overload["warning"] in warning
    assert overload["served_prompt_tokens_per_s"] < 0.9 * overload["offered_prompt_tokens_per_s"]
    assert overload["backlog_requests"] > 0
    assert "warning: offered load exceeds" in (out.parent / "static.html").read_text()
    # A run that keeps up says nothing and its summary.json gains no key.
    payload, out = _run(tmp_path, "chunked", [str(EXAMPLE), "--policy", "chunked"])
    assert "warning" not in capsys.readouterr().out
    assert "overload" not in payload
    assert "offered load exceeds" not in (out.parent / "chunked.html").read_text()


def test_the_report_of_a_saved_run_recomputes_the_warning(tmp_path: Path) -> None:
    payload, out = _run(tmp_path, "static", [str(EXAMPLE), "--policy", "static", "--quiet"])
    del payload["overload"]  # as a run written before the check, or by another executor
    (out / "summary.json").write_text(json.dumps(payload))
    assert report_main([str(out), "-o", str(tmp_path / "again.html")]) == 0
    assert "warning: offered load exceeds" in (tmp_path / "again.html").read_text()


@pytest.mark.shared
def test_mooncake_on_one_gpu_says_it_is_overloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not MOONCAKE.is_file():
        pytest.skip(f"{MOONCAKE} not found")
    argv = [str(MOONCAKE), "--model", "Llama-3.1-8B", "--out", str(tmp_path / "mc")]
    assert main(["run", *argv]) == 0
    warning = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("warning"))
    overload = json.loads((tmp_path / "mc" / "summary.json").read_text())["overload"]
    # 3,983 admitted requests of 15k prompt tokens each on average, over 1,022 s.
    assert overload["offered_prompt_tokens_per_s"] > 3 * overload["served_prompt_tokens_per_s"]
    assert overload["backlog_requests"] > 1000 and overload["drain_s"] > 1000
    assert f"{overload['offered_prompt_tokens_per_s']:,.0f} prompt tokens/s offered" in warning
