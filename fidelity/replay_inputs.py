"""What a saved engine run replayed, read from its ``summary.json``: the trace file (from the
command that made it, else the bundled trace of its name), the model, and the simulator's
hardware preset of the device it ran on, so that ``sim validate --replay RUN`` needs nothing
else. Also the engine kind it ran as (eager, or with CUDA graphs)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from core.decode_split import split_mode_of

ROOT = Path(__file__).resolve().parents[1]
TRACE_SUFFIXES = (".csv", ".jsonl", ".json", ".csv.gz", ".jsonl.gz")


def run_summary(run_dir: str | Path) -> dict[str, Any]:
    """The run's ``summary.json`` as a dict; errors name the file."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise ValueError(f"--replay: {run_dir} holds no summary.json (not a run directory)")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a run summary ({error})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: not a run summary (expected a JSON object)")
    return payload


def trace_of(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    """The trace file the run replayed: the command's argument named after the run's trace,
    else ``traces/data/<trace>.csv``, else any other trace-like argument; each found from the
    working directory or the project root. (A command that never names its trace, like
    ``benchmarks/validate_cpu.py --profile P.json``, has files of other kinds that end like
    a trace.)"""
    tokens = shlex.split(str(summary.get("command") or ""))
    name = summary.get("trace")
    files = [t for t in tokens if not t.startswith("-") and t.endswith(TRACE_SUFFIXES)]
    named = [t for t in files if Path(t).stem == name]
    bundled = ROOT / "traces" / "data" / f"{name}.csv"
    for token in named:
        for base in (Path.cwd(), ROOT):
            if (base / token).exists():
                return base / token
    if name and bundled.exists():
        return bundled
    for token in files:
        for base in (Path.cwd(), ROOT):
            if (base / token).exists():
                return base / token
    raise ValueError(
        f"--replay: cannot find the trace of {run_dir} (its command names none that exists, "
        f"and no bundled trace is called {name!r}); give the TRACE argument"
    )


def hardware_of(device_name: str) -> str | None:
    """The simulator's hardware preset of a device name (None for one it has no preset of)."""
    from sim.specs.hardware import HARDWARE_PRESETS

    name = device_name.upper()
    if name == "CPU":
        return "CPU-1T"
    for key, preset in (("H200", "H200"), ("H100", "H100-SXM"), ("B200", "B200")):
        if key in name:
            return preset
    for preset in HARDWARE_PRESETS:
        if preset.replace("-", " ") in name.replace("-", " "):
            return preset
    return None


def decode_split_of_run(summary: dict[str, Any], path: str | Path = "summary.json") -> str:
    """How the run's decode kernel shared each context among its splits (its config's
    ``decode_split``); ``"fixed"`` for a run recorded before the engine had the setting.
    Errors name ``path``, the summary's file."""
    config = summary.get("config")
    return split_mode_of(
        config if isinstance(config, dict) else None, f"{path}: field 'config.decode_split'"
    )


def engine_kind_of_run(summary: dict[str, Any]) -> str:
    """``servesim-graphs`` when the engine ran decode steps on CUDA graphs (and
    ``servesim-piecewise`` when its other steps ran on piecewise graphs too, its config's
    ``mixed_graphs``), else ``servesim-eager`` (every run from before graphs existed)."""
    config = summary.get("config") or {}
    graphs = summary.get("cuda_graphs")
    if graphs is None:
        graphs = config.get("device", "cpu") != "cpu" and config.get("enforce_eager") is False
    if not graphs:
        return "servesim-eager"
    return "servesim-piecewise" if config.get("mixed_graphs") == "piecewise" else "servesim-graphs"
