"""A run under ``--scheduling-policy priority``: an overloaded replica serves the trace's
lower priorities first (colocated and disaggregated alike); a trace with several priorities
gets a summary per class in summary.json and on the screen, and a ``priority`` column in
requests.csv; a trace without them writes what it always wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from core.settings import build
from sim.cli.main import main
from sim.run import RunConfig, simulate
from traces.schema import Trace, TraceRequest

# 60 requests at 40 per second, priorities 2, 0, 1, 2, 0, 1, ...: more than one replica of
# Llama-2-7B on an A100 with 400 blocks serves, so a queue forms.
TRACE = Trace(
    "classes",
    tuple(TraceRequest(f"r{i}", 0.025 * i, 400, 120, priority=(2, 0, 1)[i % 3]) for i in range(60)),
)
BASE = {"model": "Llama-2-7B", "hardware": "A100-80GB", "num_blocks": 400, "max_num_seqs": 8}


def _median_ttft_by_priority(**settings: object) -> dict[int, float]:
    result = simulate(TRACE, build(RunConfig, **{**BASE, **settings}))
    frame = result.requests_frame()
    return frame.groupby("priority")["ttft_ms"].median().to_dict()


@pytest.mark.parametrize("policy", ["continuous", "chunked", "disagg"])
def test_lower_priorities_are_served_first_only_under_priority(policy: str) -> None:
    fcfs = _median_ttft_by_priority(policy=policy)
    ranked = _median_ttft_by_priority(policy=policy, scheduling_policy="priority")
    assert ranked[0] < ranked[1] < ranked[2]
    assert ranked[0] < 0.6 * fcfs[0]
    # FCFS does not look at them: the classes interleave, so their waits are alike.
    assert max(fcfs.values()) < 1.5 * min(fcfs.values())


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("request_id,arrival_s,prompt_tokens,output_tokens,priority\n" + "\n".join(rows))
    return path


def test_a_run_reports_each_priority_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [f"r{i},{0.02 * i},300,50,{i % 2}" for i in range(30)]
    trace = _write(tmp_path / "t.csv", rows)
    argv = ["run", str(trace), "--scheduling-policy", "priority", "--out", str(tmp_path / "o")]
    assert main([*argv, "--model", "Llama-2-7B", "--hardware", "A100-80GB"]) == 0
    out = capsys.readouterr().out
    assert "priority 0   15 of 15 finished" in out and "priority 1   15 of 15 finished" in out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["config"]["scheduling_policy"] == "priority"
    assert sorted(summary["by_priority"]) == ["0", "1"]
    assert summary["by_priority"]["0"]["num_requests"] == 15
    frame = pd.read_csv(tmp_path / "o" / "requests.csv")
    assert frame["priority"].tolist() == [i % 2 for i in range(30)]


def test_a_trace_of_one_priority_writes_no_class_summary(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.csv", [f"r{i},{0.1 * i},50,5,0" for i in range(4)])
    assert main(["run", str(trace), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert "by_priority" not in json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "priority" not in pd.read_csv(tmp_path / "o" / "requests.csv").columns
