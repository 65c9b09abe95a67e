"""Speed against Vidur on its reference workload: Llama-2-70B, tensor-parallel 2, one replica on
A100-80GB, every request 2048 prompt + 512 output tokens, Poisson arrivals at 0.5 req/s,
under `continuous` (batch cap 128, 4096-token budget) and `chunked` (512-token chunks).

Each configuration runs in a fresh subprocess so its peak memory (max RSS) is its own, and
``--repeat`` times (default 3): the shared machines this runs on are noisy (the same run's
wall time varies by 20% or more), so it prints the median wall time with the fastest and
slowest, and the median CPU time of the simulation (less disturbed by other tenants).
Run: python benchmarks/bench_vidur.py [--sizes 1000,10000,100000] [--repeat 3]
[--cores python,compiled] (``compiled``: the build made by ``python -m sim compile-core``, run
with ``SERVESIM_CORE=compiled``; every mode must give the same results to the last digit)
[--baseline DIR] (another checkout of servesim, e.g. the tree before a change: each of its runs
alternates with this tree's, with the same interpreter, so that both see the same machine)
(results committed in benchmarks/results/vidur.txt)

``--cost-as-45813dd`` prices steps as the cost model did before async scheduling and the rotary
fit (``async_scheduling=False``, ``benchmarks/a100_80gb_45813dd.toml``): the same simulated
work as older trees (45813dd and before), so that before/after timings compare like for like.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "continuous": {"policy": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096},
    "chunked": {"policy": "chunked", "max_num_seqs": 128, "max_num_batched_tokens": 512},
}
# The A100-80GB as priced before the rotary fit (rotary_bandwidth_efficiency 0.5).
COST_AS_45813DD_HARDWARE = str(Path(__file__).with_name("a100_80gb_45813dd.toml"))
# Vidur 0.0.26 on this workload, whole process, timed six times on a 2-core development machine
# with the other core busy (benchmarks/results/vidur_measured.txt, 2026-11-26): 100k requests in
# 368.9, 385.5, 281.7, 241.2, 253.2 and 267.6 s (its vllm scheduler), 405.7, 414.9, 270.3, 275.6,
# 293.7 and 304.6 s (sarathi), the machine faster in the later runs; the means below. The
# ``x Vidur`` column holds only roughly, on such a machine: a ratio worth quoting times both in
# the same minutes (vidur_measured.txt).
ROOT = Path(__file__).resolve().parents[1]
VIDUR_REQ_PER_S = {"continuous": 100_000 / 299.7, "chunked": 100_000 / 327.5}


def run_one(
    policy: str, num_requests: int, fast_forward: bool, cost_as_45813dd: bool = False
) -> dict[str, float]:
    """Generate the workload and simulate it; called in the child process."""
    from sim.compiled import switch

    switch.select(os.environ)  # as ``python -m sim``'s main(): before the hot path is imported
    from core.settings import build
    from sim.run import RunConfig, simulate
    from traces.distributions import FixedLengths, PoissonArrivals
    from traces.generators import generate_trace

    trace = generate_trace(
        num_requests, PoissonArrivals(0.5), FixedLengths(2048, 512), seed=0, name="vidur"
    )
    config = build(
        RunConfig,
        model="Llama-2-70B",
        hardware=COST_AS_45813DD_HARDWARE if cost_as_45813dd else "A100-80GB",
        tp=2,
        fast_forward=fast_forward,
        async_scheduling=not cost_as_45813dd,
        **CONFIGS[policy],
    )
    import core.scheduler

    compiled = not core.scheduler.__file__.endswith(".py")
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(trace, config)
    wall_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    s = result.summary
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "completed": float(s["completed"] or 0),
        "steps": float(len(result.steps)),
        "simulated_steps": float(sum(result.steps.columns["num_steps"])),
        "mean_ttft_ms": float(s["mean_ttft_ms"] or 0),
        "mean_tpot_ms": float(s["mean_tpot_ms"] or 0),
        "compiled": float(compiled),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    parser.add_argument("--no-fast-forward", action="store_true")
    parser.add_argument(
        "--cost-as-45813dd",
        action="store_true",
        help="price as the cost model did at 45813dd (for before/after timings against it)",
    )
    parser.add_argument(
        "--cores",
        default="python",
        help="core builds to time, comma-separated: python (the sources), compiled "
        "(SERVESIM_CORE=compiled; build it first with python -m sim compile-core)",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="another servesim checkout to time against, run for run (its own compiled build "
        "made there first)",
    )
    parser.add_argument("--child", nargs=2, metavar=("POLICY", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = run_one(
            args.child[0], int(args.child[1]), not args.no_fast_forward, args.cost_as_45813dd
        )
        print(json.dumps(out))
        return
    print(
        f"# servesim on Vidur's reference workload; python {platform.python_version()}, "
        f"{platform.machine()}, fast_forward={not args.no_fast_forward}"
    )
    cores = args.cores.split(",")
    for core in cores:
        if core not in ("python", "compiled"):
            parser.error(f"--cores: unknown core {core!r} (python, compiled)")
    trees = {"this": ROOT}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
        if not (trees["baseline"] / "benchmarks" / "bench_vidur.py").is_file():
            parser.error(f"--baseline: no benchmarks/bench_vidur.py under {args.baseline}")
        print(f"# baseline: {trees['baseline']}")
    print(
        f"{'policy':<11}{'core':>9}{'tree':>9}{'requests':>9}{'wall s':>8}{'(min-max)':>14}"
        f"{'cpu s':>8}{'req/wall-s':>11}{'x Vidur':>8}{'peak MiB':>9}{'rows':>9}{'steps':>11}"
        f"{'TTFT s':>9}{'TPOT ms':>8}"
    )
    flags = [
        *(["--no-fast-forward"] if args.no_fast_forward else []),
        *(["--cost-as-45813dd"] if args.cost_as_45813dd else []),
    ]
    for policy in CONFIGS:
        for n in (int(x) for x in args.sizes.split(",")):
            runs = {(core, tree): [] for core in cores for tree in trees}
            # The cores and trees alternate, so that the machine's drift hits them all.
            for _ in range(max(1, args.repeat)):
                for core in cores:
                    for tree, root in trees.items():
                        runs[core, tree].append(run_child(root, core, policy, n, flags))
            # Every run simulates the same thing: its results must agree to the last digit.
            every = [r for rs in runs.values() for r in rs]
            for key in ("completed", "steps", "simulated_steps", "mean_ttft_ms", "mean_tpot_ms"):
                assert len({r[key] for r in every}) == 1, f"runs disagree on {key}"
            for (core, tree), rs in runs.items():
                print_row(policy, core, tree, n, rs)
            if len(trees) > 1:
                for core in cores:
                    ratio = statistics.median(
                        a["cpu_s"] / b["cpu_s"]
                        for a, b in zip(runs[core, "this"], runs[core, "baseline"], strict=True)
                    )
                    print(f"#   {policy} {core} {n}: cpu this / baseline, median pair {ratio:.3f}")


def run_child(root: Path, core: str, policy: str, n: int, flags: list[str]) -> dict[str, float]:
    """One run in a fresh process of the checkout at ``root`` (its sources first on the path)."""
    cmd = [sys.executable, str(root / "benchmarks" / "bench_vidur.py"), "--child", policy, str(n)]
    env = {**os.environ, "SERVESIM_CORE": core, "PYTHONPATH": str(root)}
    done = subprocess.run(cmd + flags, capture_output=True, text=True, env=env, cwd=root)
    if done.returncode != 0:
        sys.exit(f"{policy} {n} ({core} core, {root}) failed:\n{done.stderr[-2000:]}")
    run: dict[str, float] = json.loads(done.stdout)
    assert run["compiled"] == float(core == "compiled"), f"not the {core} core in {root}"
    return run


def print_row(policy: str, core: str, tree: str, n: int, runs: list[dict[str, float]]) -> None:
    r = runs[0]
    walls = sorted(x["wall_s"] for x in runs)
    wall_s = statistics.median(walls)
    cpu_s = statistics.median(x["cpu_s"] for x in runs)
    peak = max(x["peak_rss_mib"] for x in runs)
    rate = r["completed"] / wall_s
    spread = f"({walls[0]:.2f}-{walls[-1]:.2f})"
    print(
        f"{policy:<11}{core:>9}{tree:>9}{n:>9}{wall_s:>8.2f}{spread:>14}{cpu_s:>8.2f}{rate:>11,.0f}"
        f"{rate / VIDUR_REQ_PER_S[policy]:>8.1f}{peak:>9.0f}{r['steps']:>9,.0f}"
        f"{r['simulated_steps']:>11,.0f}{r['mean_ttft_ms'] / 1000:>9,.1f}"
        f"{r['mean_tpot_ms']:>8.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
