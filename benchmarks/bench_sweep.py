"""Sweep throughput: 64 configurations (policy × max_num_seqs × token budget × replicas) of the
Azure LLM code trace (../shared/traces, 8,819 requests; skipped when absent), each sweep run by
``run_sweep`` in a fresh subprocess under every executor and worker count asked for.

Prints per sweep: wall time (Ray's start-up included), CPU seconds (the driver process plus every
point's CPU measured in its worker, so Ray's workers count too; worker start-up and Ray's own
daemons do not), points per minute per core, and parallel efficiency against the first
(one-worker) sweep: T1 / (N × TN) on wall time (target ≥ 90%; it needs N idle cores), and
C1 / CN on CPU time (what running in parallel itself costs: pickling, sending frames back,
writing; other tenants of the machine change it little). Every sweep.csv must be byte-identical
to the first: the script fails otherwise.
Run: python benchmarks/bench_sweep.py [--count 64] [--jobs 1,2] [--ray]

``--capacity`` times ``capacity --sweep`` over 12 Llama-3-70B configurations instead (the
question Vidur-Search answers; see docs/sweep.md for what compares and what does not).
Run: python benchmarks/bench_sweep.py --capacity [--jobs 2] [--rate-tol 0.05]
(results committed in benchmarks/results/sweep.txt)
"""

from __future__ import annotations

import argparse
import itertools
import json
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


def run_sweep(spec: Path, out: Path, jobs: int, ray: bool) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (driver + points) and points' CPU seconds of one sweep, run in
    a fresh ``--child`` subprocess."""
    argv = [sys.executable, __file__, "--child", str(spec), str(out), str(jobs)]
    argv += ["--ray"] if ray else []
    done = subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    measured = json.loads(done.stdout.splitlines()[-1])
    return measured["wall_s"], measured["cpu_s"], measured["points_cpu_s"]


def child(spec: str, out: str, jobs: int, ray: bool) -> int:
    """One sweep in this process; prints its timings as one JSON line."""
    sys.path.insert(0, str(ROOT))
    from sim.experiments.sweep import PointOutput
    from sim.experiments.sweep import run_sweep as sweep

    points_cpu_s: list[float] = []

    def arrived(output: PointOutput) -> None:
        points_cpu_s.append(float(output.extra.get("cpu_s", 0.0)))

    wall_start, cpu_start = time.perf_counter(), time.process_time()
    outcome = sweep(spec, out, jobs=jobs, use_ray=ray, on_output=arrived)
    wall_s, driver_cpu_s = time.perf_counter() - wall_start, time.process_time() - cpu_start
    if any(row["status"] != "ok" for row in outcome.rows):
        raise SystemExit(f"{out}: some points failed")
    # With one worker the points ran in this process: their CPU is already the driver's.
    cpu_s = driver_cpu_s + (sum(points_cpu_s) if ray or jobs > 1 else 0.0)
    print(json.dumps({"wall_s": wall_s, "cpu_s": cpu_s, "points_cpu_s": sum(points_cpu_s)}))
    return 0


# Capacity of every configuration (``capacity --sweep``): the question Vidur-Search answers for
# LLaMA2-70B, on a grid of the same kind (TP degree × batching policy × batch cap) on A100-80GB.
# Llama-3-70B (same size and GQA shape, 8k context) because 1,257 of the trace's 8,819 requests
# exceed Llama-2-70B's 4,096-token context and would be rejected, failing any 90% goodput.
CAPACITY_GRID = {
    "tp": [4, 8],
    "policy": ["continuous", "chunked"],
    "max-num-seqs": [64, 128, 256],
}
CAPACITY_RUN = {"model": "Llama-3-70B", "hardware": "A100-80GB"}
CAPACITY_SLOS = ["--slo-ttft", "2000", "--slo-tpot", "200", "--goodput", "0.9"]


def capacity_spec_text() -> str:
    lines = [f'[trace]\npath = "{TRACE}"\n', "[run]"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in CAPACITY_RUN.items()]
    lines += ["", "[grid]"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in CAPACITY_GRID.items()]
    return "\n".join(lines) + "\n"


def run_capacity(jobs: int, rate_tol: float) -> int:
    """Time ``capacity --sweep`` over CAPACITY_GRID in a subprocess: wall and CPU seconds (the
    command and its worker processes), configurations, probes."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "capacity.toml"
        spec.write_text(capacity_spec_text())
        argv = [sys.executable, "-m", "sim", "capacity", "--sweep", str(spec), *CAPACITY_SLOS]
        argv += ["--rate-tol", str(rate_tol), "-j", str(jobs), "--out", str(Path(tmp) / "out")]
        print("$ " + " ".join(argv[1:]).replace(str(Path(tmp)), "TMP"))
        load_start = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall_start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        wall_s = time.perf_counter() - wall_start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(done.stdout, end="")
        configs = len(list(itertools.product(*CAPACITY_GRID.values())))
        print(
            f"capacity of {configs} configurations: {wall_s:.1f} s wall, {cpu_s:.1f} s CPU "
            f"(-j {jobs}; load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end)"
        )
        return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64, help="configurations (default 64)")
    parser.add_argument("--jobs", default="1,2", help="local worker counts (default 1,2)")
    parser.add_argument("--ray", action="store_true", help="also run under a local Ray")
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="instead: time capacity --sweep over a Llama-3-70B grid (see CAPACITY_GRID)",
    )
    parser.add_argument("--rate-tol", type=float, default=0.05, help="with --capacity")
    parser.add_argument("--child", nargs=3, metavar=("SPEC", "OUT", "JOBS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]), args.ray)
    if not TRACE.is_file():
        print(f"skipped: {TRACE} is absent")
        return 0
    if args.capacity:
        return run_capacity(max(int(j) for j in args.jobs.split(",")), args.rate_tol)
    load = os.getloadavg()
    print(
        f"{args.count} configurations of {TRACE.name}; {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} at start"
    )
    runs = [("local", int(j)) for j in args.jobs.split(",")]
    if args.ray:
        runs.append(("ray", max(job for _, job in runs)))  # a local instance with that many CPUs
    reference: bytes | None = None
    base_wall: float | None = None
    base_cpu: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(spec_text(args.count))
        print(
            f"{'executor':>8} {'workers':>7} {'wall s':>8} {'cpu s':>8} {'pts cpu s':>9} "
            f"{'pts/min/core':>12} {'wall eff.':>9} {'cpu eff.':>8} {'load':>9}"
        )
        for executor, jobs in runs:
            out = Path(tmp) / f"{executor}-{jobs}"
            load_start = os.getloadavg()[0]
            wall_s, cpu_s, points_cpu_s = run_sweep(spec, out, jobs, executor == "ray")
            csv = (out / "sweep.csv").read_bytes()
            if reference is None:
                reference = csv
            elif csv != reference:
                raise SystemExit(f"{executor} -j {jobs}: sweep.csv differs from the first sweep's")
            base_wall = base_wall if base_wall is not None else wall_s * jobs
            base_cpu = base_cpu if base_cpu is not None else cpu_s
            per_core = args.count / (wall_s / 60.0) / jobs
            load = f"{load_start:.1f}-{os.getloadavg()[0]:.1f}"
            print(
                f"{executor:>8} {jobs:>7} {wall_s:8.1f} {cpu_s:8.1f} {points_cpu_s:9.1f} "
                f"{per_core:12.2f} {base_wall / (jobs * wall_s):>9.0%} {base_cpu / cpu_s:>8.0%} "
                f"{load:>9}",
                flush=True,
            )
    print("sweep.csv byte-identical across all executors: yes")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
