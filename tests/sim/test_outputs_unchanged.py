"""The simulator's outputs are those of main at 8d1f2ca, before issue 32 restructured the tree:
``requests.csv``, ``steps.csv`` and ``summary.json`` (less its ``command`` and version) of a few
configurations over the bundled traces, every policy, fast-forward on and off, old flag
spellings included, compared by hash with what that commit wrote."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sim.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests" / "sim" / "golden" / "outputs_8d1f2ca.json").read_text())


def _summary_hash(path: Path) -> str:
    summary = json.loads(path.read_text())
    summary.pop("command")
    summary.pop("servesim_version")
    # Issue 33: an overloaded run's summary.json gains the overload warning (records.overload),
    # a judgement of the simulated numbers, none of which it changes.
    summary.pop("overload", None)
    # Issue 31: arrivals join a step as vLLM's async scheduling takes them in, unless
    # ``--no-scheduling-lag`` (which every case below gives, so that the rest is compared).
    assert summary["config"].pop("scheduling_lag") is False
    # 2026-11-28: the host's speed against the host set's (1.0 unless --host-slowdown).
    assert summary["config"].pop("host_slowdown") == 1.0
    # 2026-11-29: vLLM's --scheduling-policy (fcfs unless priority is asked for).
    assert summary["config"].pop("scheduling_policy") == "fcfs"
    return hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_outputs_are_those_of_8d1f2ca(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = GOLDEN["cases"][name]
    monkeypatch.chdir(ROOT)  # the recorded argv names the bundled traces relative to the root
    argv = ["run", *case["argv"], "--no-scheduling-lag", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    actual = {
        "requests.csv": hashlib.sha256((tmp_path / "requests.csv").read_bytes()).hexdigest(),
        "steps.csv": hashlib.sha256((tmp_path / "steps.csv").read_bytes()).hexdigest(),
        "summary.json": _summary_hash(tmp_path / "summary.json"),
    }
    assert actual == case["sha256"]
