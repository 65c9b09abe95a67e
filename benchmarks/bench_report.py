"""Report size and render time: the bundled example run and a fabricated 100k-request run
(500k steps), written with `reports.write_report` and rendered in headless Chromium."""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from core.settings import build
from records.run_dir import RunRecords, records_from_result
from records.schema import STEP_COLUMNS
from reports import write_report
from reports.browser import dump_dom, find_chromium, read_rendered
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

ROOT = Path(__file__).resolve().parents[1]


def synthetic_run(num_requests: int = 100_000, num_steps: int = 500_000) -> RunRecords:
    """Frames of a long run's size and shape (a queue that builds up, then drains)."""
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(0.02, num_requests))
    queueing = (
        np.maximum(0.0, np.sin(arrival / arrival[-1] * np.pi)) * 4000 * rng.random(num_requests)
    )
    ttft = queueing + rng.gamma(2.0, 15.0, num_requests)
    tpot = rng.normal(9.0, 1.0, num_requests).clip(5)
    output = rng.integers(1, 800, num_requests)
    e2el = ttft + tpot * output
    requests = pd.DataFrame(
        {
            "request_id": np.arange(num_requests),
            "status": "finished",
            "reject_reason": "",
            "arrival_s": arrival,
            "first_scheduled_s": arrival + queueing / 1000,
            "first_token_s": arrival + ttft / 1000,
            "finish_s": arrival + e2el / 1000,
            "prompt_tokens": rng.integers(16, 4096, num_requests),
            "output_tokens": output,
            "num_samples": 1,
            "queueing_ms": queueing,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "itl_max_ms": tpot * 3,
            "itl_min_ms": tpot / 2,
            "e2el_ms": e2el,
        }
    )
    total = 28_119 * 16
    running = rng.integers(1, 256, num_steps)
    real = (running * rng.uniform(300, 1500, num_steps)).astype(np.int64).clip(0, total // 2)
    steps = pd.DataFrame({name: np.zeros(num_steps, dtype=np.int64) for name in STEP_COLUMNS})
    steps["duration_s"] = rng.uniform(0.008, 0.06, num_steps)
    steps["start_s"] = np.cumsum(steps["duration_s"]) - steps["duration_s"]
    steps["num_requests"] = running
    steps["num_running"] = running
    steps["num_waiting"] = rng.integers(0, 100, num_steps)
    steps["num_decode_tokens"] = running
    steps["num_prefill_tokens"] = rng.integers(0, 8192 - 256, num_steps)
    steps["real_token_slots"] = real
    steps["internal_fragmentation_slots"] = running * 8
    steps["free_slots"] = total - real - running * 8
    summary = {
        "num_requests": num_requests,
        "completed": num_requests,
        "rejected": 0,
        "mean_ttft_ms": float(ttft.mean()),
        "p99_ttft_ms": float(np.percentile(ttft, 99)),
    }
    return RunRecords(
        label="synthetic 100k",
        config={"policy": "chunked", "model": "Llama-3-8B", "hardware": "H100-SXM"},
        summary=summary,
        requests=requests,
        steps=steps,
        trace_name="synthetic-100k",
        memory_model="paged",
    )


def measure(name: str, run: RunRecords, out_dir: Path, chromium: str | None) -> str:
    start = time.perf_counter()
    page = write_report([run], out_dir / f"{name}.html")
    write_s = time.perf_counter() - start
    line = (
        f"{name:<16} {len(run.requests):>7,} requests {len(run.steps):>7,} steps  "
        f"{page.stat().st_size / 1e6:5.1f} MB  written in {write_s:5.2f} s"
    )
    if chromium is None:
        return line + "  (no chromium: render not timed)"
    walls = []
    for _ in range(3):
        dom, wall_s = dump_dom(page, chromium)
        rendered = read_rendered(dom)
        if rendered.errors or not rendered.rendered:
            raise RuntimeError(f"{name}: render failed: {rendered.errors}")
        walls.append(wall_s)
    return line + f"  chromium load+render {min(walls):5.2f} s (best of 3)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    lines = [f"# python {platform.python_version()} on {platform.machine()}, chromium {chromium}"]
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        if chromium is not None:
            blank = out_dir / "blank.html"
            blank.write_text("<!DOCTYPE html><html><body>blank</body></html>")
            base = min(dump_dom(blank, chromium)[1] for _ in range(3))
            lines.append(f"blank page       chromium start+load {base:5.2f} s (best of 3)")
        trace = load_trace(str(ROOT / "traces" / "data" / "example.csv"))
        example = records_from_result(simulate(trace, build(RunConfig, policy="chunked")))
        lines.append(measure("example", example, out_dir, chromium))
        lines.append(measure("synthetic-100k", synthetic_run(), out_dir, chromium))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
