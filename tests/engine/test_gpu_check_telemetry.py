"""The GPU check's telemetry (engine.gpu_check.telemetry): the sampler's command, reading its
CSV (odd rows left out), per-part figures, and a sampler that is absent or fails, with a fake
``nvidia-smi`` standing in for the real one."""

from __future__ import annotations

import stat
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from engine.gpu_check.telemetry import (
    FIELDS,
    TELEMETRY_CSV,
    Telemetry,
    per_part,
    read_samples,
    sampler_argv,
)


def _stamp(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _row(unix_s: float, sm: str, power: str = "120.5", pstate: str = "P0") -> str:
    return f"{_stamp(unix_s)}, {sm}, 2619, {power}, 41, 37, {pstate}\n"


def test_the_sampler_queries_every_field_into_the_file(tmp_path: Path) -> None:
    argv = sampler_argv("nvidia-smi", tmp_path / "t.csv", 250)
    assert argv[0] == "nvidia-smi"
    assert f"--query-gpu={','.join(FIELDS)}" in argv
    assert "-lms=250" in argv and f"--filename={tmp_path / 't.csv'}" in argv
    with pytest.raises(ValueError, match="interval_ms"):
        sampler_argv("nvidia-smi", tmp_path / "t.csv", 0)


def test_samples_are_read_and_odd_rows_left_out(tmp_path: Path) -> None:
    path = tmp_path / TELEMETRY_CSV
    path.write_text(
        _row(1000.0, "1980")
        + "Failed to query clocks\n"
        + _row(1000.2, "[N/A]", power="[N/A]")
        + "2026/11/27 12:00:00.000, 1980, 2619\n"  # cut off
        + "not a date, 1, 2, 3, 4, 5, P0\n"
    )
    rows = read_samples(path)
    assert len(rows) == 2
    assert rows[0]["sm_mhz"] == 1980.0 and rows[0]["time_s"] == pytest.approx(1000.0, abs=1e-3)
    assert rows[1]["sm_mhz"] is None and rows[1]["power_w"] is None
    assert rows[1]["mem_mhz"] == 2619.0


def test_each_part_gets_the_samples_taken_while_it_ran() -> None:
    samples = [
        {"time_s": t, "sm_mhz": sm, "mem_mhz": 2619.0, "power_w": None, "temperature_c": 40.0,
         "utilization_pct": 10.0, "pstate": p}
        for t, sm, p in ((1.0, 345.0, "P8"), (2.0, 1200.0, "P2"), (3.0, 1980.0, "P0"),
                         (9.0, 1980.0, "P0"))
    ]  # fmt: skip
    parts = per_part(samples, [("cold", 0.5, 2.5), ("warm", 2.5, 3.5), ("gap", 4.0, 5.0)])
    assert parts["cold"]["samples"] == 2
    assert parts["cold"]["sm_mhz"] == [345.0, 772.5, 1200.0]
    assert parts["cold"]["pstates"] == ["P2", "P8"]
    assert "power_w" not in parts["cold"]  # the GPU reported none
    assert parts["warm"]["sm_mhz"] == [1980.0, 1980.0, 1980.0]
    assert parts["gap"] == {"samples": 0}


def _fake_smi(folder: Path, body: str) -> str:
    script = folder / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


FAKE_SAMPLER = """
import sys, time
from datetime import datetime
out = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--filename=")][0]
with open(out, "w") as f:
    while True:
        stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        f.write(f"{stamp}, 1980, 2619, 300.0, 45, 90, P0\\n")
        f.flush()
        time.sleep(0.02)
"""


def test_the_sampler_runs_during_the_block_and_stops_after(tmp_path: Path) -> None:
    telemetry = Telemetry(tmp_path, _fake_smi(tmp_path, FAKE_SAMPLER))
    with telemetry:
        start = time.time()
        time.sleep(0.5)
        end = time.time()
    assert telemetry._process is not None and telemetry._process.returncode is not None
    size = (tmp_path / TELEMETRY_CSV).stat().st_size
    time.sleep(0.1)
    assert (tmp_path / TELEMETRY_CSV).stat().st_size == size  # stopped writing
    summary = telemetry.summary([("part", start, end)])
    assert summary["sampled"] is True and summary["samples"] >= 3
    assert summary["parts"]["part"]["sm_mhz"] == [1980.0, 1980.0, 1980.0]


def test_a_missing_or_failing_sampler_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    absent = Telemetry(tmp_path / "a")
    with absent:
        pass
    assert absent.summary([]) == {"sampled": False, "reason": "nvidia-smi is not on the path"}
    failing = Telemetry(tmp_path, _fake_smi(tmp_path, "import sys\nsys.stderr.write('no GPU')\n"
                                            "sys.exit(9)\n"))  # fmt: skip
    with failing:
        time.sleep(0.5)
    summary = failing.summary([])
    assert summary["sampled"] is False
    assert "exited with 9" in summary["reason"] and "no GPU" in summary["reason"]
