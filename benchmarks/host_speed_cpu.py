"""A host made slower on purpose, and the simulator told how much from the engine's own input
preparation: tiny-llama on this machine's CPU, on the wall clock.

The whole benchmark runs pinned to one core. It calibrates (or takes ``--profile``), then runs
``python -m sim validate`` on the first ``--requests`` requests of a trace twice: once with the
core to itself, once beside a busy loop pinned to the same core (the engine then gets about half
of it). Each engine run is compared as it is (``--host-slowdown 1``) and again on its own host
(``--host-slowdown measured``: its input preparation against the calibration's,
``fidelity/host_speed.py``). It prints, per run, the host's measured slowdown (with its drift
over the run's fifths), the median step ratio against the calibrated model, and the median
per-request TPOT and E2E error and the engine's own steps' error both ways.

    python benchmarks/host_speed_cpu.py > benchmarks/results/host_speed_cpu.txt

On CPU, one processor runs both of a step's clocks, so the slowdown stretches the whole step
(``CostModelConfig.host_slowdown``); on a GPU only the host's part.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.cli.main import main as sim_main  # noqa: E402

BUSY = "while True: pass"


def _validate(trace: str, profile: str, out: Path, extra: list[str]) -> dict[str, Any]:
    argv = ["validate", trace, "--policy", "chunked", "--profile", profile, "--clock", "wall"]
    if sim_main([*argv, *extra, "--out", str(out), "--quiet"]) != 0:
        raise SystemExit(f"validate failed: {out}")
    return dict(json.loads((out / "validation.json").read_text()))


def _cells(result: dict[str, Any]) -> str:
    model = result["models"]["calibrated"]
    metrics = model["requests"]["metrics"]
    steps = model["steps"]["all"]
    return (
        f"{metrics['tpot']['median_abs_pct']:6.1f}{metrics['e2e']['median_abs_pct']:6.1f}"
        f"{steps['median_abs_pct']:7.1f}{steps['bias_pct']:+7.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(ROOT / "traces" / "data" / "example.csv"))
    parser.add_argument("--requests", type=int, default=40, help="the trace's first N requests")
    parser.add_argument("--profile", default=None, help="use this profile (default: calibrate)")
    parser.add_argument("--out", default=None, help="keep the runs here")
    parser.add_argument("--core", type=int, default=0, help="the one core everything runs on")
    args = parser.parse_args(argv)
    started = time.time()
    print(f"# python benchmarks/host_speed_cpu.py {shlex.join(argv or sys.argv[1:])}".rstrip())
    os.sched_setaffinity(0, {args.core})
    print(f"# pinned to core {args.core}; load average at start {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.out or scratch)
        out.mkdir(parents=True, exist_ok=True)
        profile = args.profile
        if profile is None:
            profile = str(out / "profile.json")
            calibrate = ["calibrate", "--model", "tiny-llama", "--device", "cpu", "--clock", "wall"]
            began = time.time()
            if sim_main([*calibrate, "--out", profile, "--quiet"]) != 0:
                raise SystemExit("calibrate failed")
            print(f"# calibrated on the wall clock in {time.time() - began:.0f} s: {profile}")
        subset = ["--max-requests", str(args.requests)]
        rows = []
        for name, busy in (("alone", False), ("beside a busy loop", True)):
            loop = None
            if busy:  # (a child keeps its parent's core)
                loop = subprocess.Popen([sys.executable, "-c", BUSY])
            try:
                as_is = _validate(args.trace, profile, out / f"{name}-as-is", subset)
            finally:
                if loop is not None:
                    loop.kill()
                    loop.wait()
            engine = str(out / f"{name}-as-is" / "engine")
            replay = [*subset, "--replay", engine, "--host-slowdown", "measured"]
            own = _validate(args.trace, profile, out / f"{name}-own-host", replay)
            rows.append((name, as_is, own))
    print(f"tiny-llama, CPU, one torch thread, wall clock; {args.requests} requests of")
    print(f"{Path(args.trace).name} under chunked prefill; calibrated model; median |error| %")
    print("per request (TPOT, E2E) and on the engine's own steps (|error|, bias), as the run is")
    print("and on its own host (its input preparation against the calibration's)")
    print("('core' is the engine thread's median share of a step's wall time on a core)")
    head = f"{'engine run':20s}{'slowdown':>9s} {'by fifth of the run':25s}{'core':>6s}"
    print(f"{head}{'as is':>26s}{'own host':>26s}")
    print(f"{'':60s}{'TPOT   E2E  steps   bias':>26s}{'TPOT   E2E  steps   bias':>26s}")
    for name, as_is, own in rows:
        speed = as_is["host_speed"]
        fifths = " ".join(f"{x:.2f}" for x in speed["by_fifth"])
        cells = f"{_cells(as_is):>26s}{_cells(own):>26s}"
        print(f"{name:20s}{speed['slowdown']:9.3f} {fifths:25s}{speed['core_share']:6.2f}{cells}")
    print(f"# wall time {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
