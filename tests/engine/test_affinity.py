"""``python -m engine run --cpu-cores``: the core list's grammar, the pinning (in a process of
its own: the test process keeps its cores), its refusal of cores the process may not use, and
the run's summary naming the cores it ran on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.affinity import _ranges, parse_cores

ROOT = Path(__file__).resolve().parents[2]
LINUX_ONLY = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform"
)


def test_the_core_list_takes_numbers_ranges_and_commas() -> None:
    assert parse_cores("2") == {2}
    assert parse_cores("2,3") == {2, 3}
    assert parse_cores("0-2, 5") == {0, 1, 2, 5}
    for bad in ("", "a", "3-1", "-1", "1-", "2,,3"):
        with pytest.raises(ValueError, match="--cpu-cores"):
            parse_cores(bad)
    assert _ranges({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


@LINUX_ONLY
def test_pinning_holds_the_process_to_its_cores_and_refuses_others() -> None:
    code = (
        "import os; from engine.affinity import pin_to_cores\n"
        "first = min(os.sched_getaffinity(0))\n"
        "print(pin_to_cores(frozenset({first})) == (first,), os.sched_getaffinity(0) == {first})\n"
        "try:\n    pin_to_cores(frozenset({100000}))\n"
        "except ValueError as error:\n    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    first, refusal = done.stdout.strip().splitlines()
    assert first == "True True"
    assert refusal.startswith("--cpu-cores: core(s) 100000 not available to this process")


@LINUX_ONLY
def test_a_pinned_run_says_its_cores(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = ["request_id,arrival_s,prompt_tokens,output_tokens"]
    rows += [f"r{i},{0.01 * i:.2f},{12 + i},3" for i in range(3)]
    trace.write_text("\n".join(rows) + "\n")
    core = min(os.sched_getaffinity(0))
    out = tmp_path / "run"
    argv = ["run", str(trace), "--model", "tiny-llama", "--weights", "random"]
    argv += ["--cpu-cores", str(core), "--out", str(out), "--quiet"]
    done = subprocess.run(
        [sys.executable, "-m", "engine", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cpu_cores"] == [core]
    assert "--cpu-cores" in summary["command"]
    bad = subprocess.run(
        [sys.executable, "-m", "engine", *argv[:-3], "--cpu-cores", "x"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: --cpu-cores: 'x' is not a core number")
