"""Sweep throughput: 64 configurations (policy × max_num_seqs × token budget × replicas) of the
Azure LLM code trace (../shared/traces, 8,819 requests; skipped when absent), each sweep run as
``python -m sim sweep`` in a fresh subprocess under every executor and worker count asked for.

Prints per sweep: wall time, CPU time of the sweep's processes, points per minute per core, and
parallel efficiency against the first (one-worker) sweep: T1 / (N × TN) on wall time (target
≥ 90%; it needs N idle cores), and C1 / CN on CPU time (what parallel running itself costs:
worker start-up, pickling, writing; other tenants do not change it). Every sweep.csv must be
byte-identical to the first: the script fails otherwise.
Run: python benchmarks/bench_sweep.py [--count 64] [--jobs 1,2] [--ray]
(results committed in benchmarks/results/sweep.txt)
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
# The last option varies fastest, so a smaller --count still spans policies and batch caps.
GRID = {
    "replicas": [1, 2],
    "router": ["round_robin", "least_outstanding"],
    "max-batch-tokens": [2048, 8192],
    "max-num-seqs": [32, 64, 128, 256],
    "policy": ["continuous", "chunked"],
}


def spec_text(count: int) -> str:
    """The first ``count`` points of the grid, listed (so a smaller count is a prefix)."""
    names = list(GRID)
    combos = list(itertools.product(*GRID.values()))[:count]
    lines = [f'[trace]\npath = "{TRACE}"\n']
    for combo in combos:
        lines.append("[[points]]")
        for name, value in zip(names, combo, strict=True):
            lines.append(f'{name} = "{value}"' if isinstance(value, str) else f"{name} = {value}")
        lines.append("")
    return "\n".join(lines)


def run_sweep(spec: Path, out: Path, jobs: int, ray: bool) -> tuple[float, float]:
    """Wall and worker CPU seconds of one ``python -m sim sweep`` subprocess."""
    argv = [sys.executable, "-m", "sim", "sweep", str(spec), "--out", str(out), "--quiet"]
    argv += ["--ray"] if ray else ["-j", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64, help="configurations (default 64)")
    parser.add_argument("--jobs", default="1,2", help="local worker counts (default 1,2)")
    parser.add_argument("--ray", action="store_true", help="also run under a local Ray")
    args = parser.parse_args()
    if not TRACE.is_file():
        print(f"skipped: {TRACE} is absent")
        return 0
    load = os.getloadavg()
    print(
        f"{args.count} configurations of {TRACE.name}; {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} at start"
    )
    runs = [("local", int(j)) for j in args.jobs.split(",")]
    if args.ray:
        runs.append(("ray", os.cpu_count() or 1))
    reference: bytes | None = None
    base_wall: float | None = None
    base_cpu: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(spec_text(args.count))
        print(
            f"{'executor':>8} {'workers':>7} {'wall s':>8} {'cpu s':>8} {'pts/min/core':>12} "
            f"{'wall eff.':>10} {'cpu eff.':>10}"
        )
        for executor, jobs in runs:
            out = Path(tmp) / f"{executor}-{jobs}"
            wall_s, cpu_s = run_sweep(spec, out, jobs, executor == "ray")
            csv = (out / "sweep.csv").read_bytes()
            if reference is None:
                reference = csv
            elif csv != reference:
                raise SystemExit(f"{executor} -j {jobs}: sweep.csv differs from the first sweep's")
            base_wall = base_wall if base_wall is not None else wall_s * jobs
            base_cpu = base_cpu if base_cpu is not None else cpu_s
            per_core = args.count / (wall_s / 60.0) / jobs
            print(
                f"{executor:>8} {jobs:>7} {wall_s:8.1f} {cpu_s:8.1f} {per_core:12.2f} "
                f"{base_wall / (jobs * wall_s):>10.0%} {base_cpu / cpu_s:>10.0%}"
            )
    print("sweep.csv byte-identical across all executors: yes")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
