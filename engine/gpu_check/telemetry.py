"""The GPU's clocks, power, temperature and load while the GPU check runs, sampled by
``nvidia-smi`` in the background (``Telemetry``) and summarised per part (``per_part``): the
recorded engine runs showed prefill steps 20-25% slower in a run's first seconds than later
(docs/validation.md), and only the clocks can tell a GPU that had not sped up from an engine
that had not warmed up."""

from __future__ import annotations

import csv
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

TELEMETRY_CSV = "gpu_telemetry.csv"
FIELDS = (
    "timestamp", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu",
    "pstate",
)  # fmt: skip
"""What is sampled: long-standing ``nvidia-smi --query-gpu`` fields (MHz, MHz, W, C, %, P0-P12)."""
NUMERIC = {"clocks.sm": "sm_mhz", "clocks.mem": "mem_mhz", "power.draw": "power_w",
           "temperature.gpu": "temperature_c", "utilization.gpu": "utilization_pct"}  # fmt: skip
INTERVAL_MS = 200
TIMESTAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"
STOP_GRACE_S = 5.0


def sampler_argv(executable: str, out_file: Path, interval_ms: int = INTERVAL_MS) -> list[str]:
    """``nvidia-smi`` sampling the first GPU every ``interval_ms`` into ``out_file`` (CSV)."""
    if interval_ms <= 0:
        raise ValueError(f"interval_ms must be > 0, got {interval_ms}")
    return [
        executable, "--id=0", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
        f"-lms={interval_ms}", f"--filename={out_file}",
    ]  # fmt: skip


class Telemetry:
    """Samples the GPU into ``out/gpu_telemetry.csv`` from entering to leaving the block. Where
    ``nvidia-smi`` is not on the path (or cannot start), nothing is sampled and ``reason`` says
    why; the check goes on either way."""

    def __init__(self, out: Path, executable: str | None = None) -> None:
        self.path = out / TELEMETRY_CSV
        self.executable = executable if executable is not None else shutil.which("nvidia-smi")
        self.reason = "" if self.executable else "nvidia-smi is not on the path"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Telemetry:
        if self.executable is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._process = subprocess.Popen(
                sampler_argv(self.executable, self.path),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as error:
            self.reason = f"could not start {self.executable}: {error}"
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is not None and process.returncode:
            message = process.stderr.read().decode(errors="replace") if process.stderr else ""
            self.reason = f"nvidia-smi exited with {process.returncode}: {message.strip()}"
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def summary(self, spans: Sequence[tuple[str, float, float]]) -> dict[str, Any]:
        """What was sampled, per part (``spans``: name, start and end in Unix seconds)."""
        if self.reason or not self.path.exists():
            return {"sampled": False, "reason": self.reason or "no samples were written"}
        samples = read_samples(self.path)
        return {"sampled": True, "file": TELEMETRY_CSV, "samples": len(samples),
                "parts": per_part(samples, spans)}  # fmt: skip


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The sampled rows as dicts: ``time_s`` (Unix seconds, the machine's local time as
    ``nvidia-smi`` writes it), the NUMERIC fields (None where the GPU reports none, e.g.
    ``[N/A]``) and ``pstate``. Rows that are not samples (a message, a cut-off last line)
    are left out."""
    rows: list[dict[str, Any]] = []
    with path.open(newline="") as handle:
        for values in csv.reader(handle):
            if len(values) != len(FIELDS):
                continue
            cells = dict(zip(FIELDS, (value.strip() for value in values), strict=True))
            try:
                stamp = datetime.strptime(cells["timestamp"], TIMESTAMP_FORMAT)
            except ValueError:
                continue
            row: dict[str, Any] = {"time_s": stamp.timestamp(), "pstate": cells["pstate"]}
            for field, name in NUMERIC.items():
                row[name] = _number(cells[field])
            rows.append(row)
    return rows


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def per_part(
    samples: Sequence[dict[str, Any]], spans: Sequence[tuple[str, float, float]]
) -> dict[str, dict[str, Any]]:
    """For each part, the min / median / max of each NUMERIC figure over the samples taken
    while it ran, and its P-states; a part with no sample says so."""
    out: dict[str, dict[str, Any]] = {}
    for name, start_s, end_s in spans:
        inside = [s for s in samples if start_s <= s["time_s"] <= end_s]
        if not inside:
            out[name] = {"samples": 0}
            continue
        figures: dict[str, Any] = {"samples": len(inside)}
        for key in NUMERIC.values():
            values = [s[key] for s in inside if s[key] is not None]
            if values:
                figures[key] = [min(values), statistics.median(values), max(values)]
        figures["pstates"] = sorted({s["pstate"] for s in inside})
        out[name] = figures
    return out
