"""A measured serving run (``MeasuredRun``) and how it is written: our run directory
(``requests.csv`` with the measured timestamps, ``summary.json`` of the vLLM-benchmark metrics)
plus the trace to replay (``trace.csv``). ``fidelity.measured_importers`` reads the sources."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fidelity.vllm_log import KvCapacityRecord
from records.run_dir import write_run_dir
from records.schema import STEP_COLUMNS
from traces.schema import Trace
from traces.writer import write_trace

TRACE_FILE = "trace.csv"
HARDWARE_FILE = "hardware.json"
_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class MeasuredRun:
    """A measured run: per-request rows (our ``requests.csv`` columns, times from 0 at the
    first arrival), the trace that replays it, and the settings the engine ran with, as
    ``RunConfig`` field names (``replay``)."""

    name: str
    source: str
    format: str
    requests: pd.DataFrame
    trace: Trace
    replay: dict[str, Any] = field(default_factory=dict)
    reported: dict[str, Any] = field(default_factory=dict)  # the source's own summary
    hardware: dict[str, Any] | None = None  # a hardware file's table, when the source has one
    # The number of GPU blocks the run's log or metadata states (vLLM's count, null included).
    kv_capacity: KvCapacityRecord | None = None
    workload: str | None = None  # the workload file the prompt token ids were read from
    # What the import could not read or check but did without, for the command to say.
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.requests) != len(self.trace.requests):
            raise ValueError(
                f"MeasuredRun.requests has {len(self.requests)} rows but the trace has "
                f"{len(self.trace.requests)} requests"
            )


def measured_summary(frame: pd.DataFrame) -> dict[str, float | int | None]:
    """vLLM-benchmark metrics of a request frame: counts, throughputs over the span from the
    first arrival to the last finish, and mean/std/median/p90/p99 of TTFT, TPOT and E2E (ms)."""
    done = frame[frame["status"] == "finished"]
    duration = float(done["finish_s"].max() - frame["arrival_s"].min()) if len(done) else 0.0
    inputs, outputs = int(done["prompt_tokens"].sum()), int(done["output_tokens"].sum())
    out: dict[str, float | int | None] = {
        "num_requests": len(frame),
        "completed": len(done),
        "failed": int((frame["status"] == "failed").sum()),
        "duration_s": duration,
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": len(done) / duration if duration > 0 else None,
        "output_throughput": outputs / duration if duration > 0 else None,
        "total_token_throughput": (inputs + outputs) / duration if duration > 0 else None,
    }
    for metric in ("ttft", "tpot", "e2el"):
        values = pd.to_numeric(done[f"{metric}_ms"], errors="coerce").dropna().to_numpy(float)
        out[f"mean_{metric}_ms"] = float(values.mean()) if values.size else None
        out[f"std_{metric}_ms"] = float(values.std()) if values.size else None
        for p in _PERCENTILES:
            key = f"{'median' if p == 50 else f'p{p}'}_{metric}_ms"
            out[key] = float(np.percentile(values, p)) if values.size else None
    return out


def write_measured_run(run: MeasuredRun, out: str | Path) -> Path:
    """Write the run directory (requests.csv, an empty steps.csv, summary.json), the replay
    trace (trace.csv) and, when the source describes its GPU, hardware.json. A KV capacity the
    run recorded becomes the replay's ``num_blocks``, its source in summary.json; the workload
    read (or null) is kept there too, and the import's warnings are among its notes."""
    root = Path(out)
    replay = dict(run.replay)
    if run.hardware is not None:
        root.mkdir(parents=True, exist_ok=True)
        (root / HARDWARE_FILE).write_text(json.dumps(run.hardware, indent=2) + "\n")
        replay["hardware"] = HARDWARE_FILE  # relative to the run directory
    notes = [f"measured run imported from {run.source} ({run.format})", *run.warnings]
    measured = {"format": run.format, "source": run.source, "reported": run.reported}
    payload: dict[str, Any] = {
        "trace": run.name,
        "config": replay,
        "memory_model": "paged",
        "summary": measured_summary(run.requests),
        "measured": {**measured, "workload": run.workload},
        "notes": notes,
    }
    if run.kv_capacity is not None:
        replay["num_blocks"] = payload["num_blocks"] = run.kv_capacity.num_gpu_blocks
        payload["measured"]["kv_capacity_source"] = run.kv_capacity.source
        notes.append(
            f"{run.kv_capacity.num_gpu_blocks} GPU KV blocks, from {run.kv_capacity.source}"
        )
    write_run_dir(root, run.requests, pd.DataFrame(columns=list(STEP_COLUMNS)), payload)
    write_trace(run.trace, root / TRACE_FILE)
    return root
