"""Speed against Vidur on its reference workload: Llama-2-70B, tensor-parallel 2, one replica on
A100-80GB, every request 2048 prompt + 512 output tokens, Poisson arrivals at 0.5 req/s,
under `continuous` (batch cap 128, 4096-token budget) and `chunked` (512-token chunks).

Each configuration runs in a fresh subprocess so its peak memory (max RSS) is its own.
Run: python benchmarks/bench_vidur.py [--sizes 1000,10000,100000]
(results committed in benchmarks/results/vidur.txt)
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

CONFIGS = {
    "continuous": {"policy": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096},
    "chunked": {"policy": "chunked", "max_num_seqs": 128, "max_num_batched_tokens": 512},
}
VIDUR_REQ_PER_S = 370.0  # Vidur's loop on this kind of machine: 100k requests in 272 s


def run_one(policy: str, num_requests: int, fast_forward: bool) -> dict[str, float]:
    """Generate the workload and simulate it; called in the child process."""
    from sim.run import RunConfig, simulate
    from traces.distributions import FixedLengths, PoissonArrivals
    from traces.generators import generate_trace

    trace = generate_trace(
        num_requests, PoissonArrivals(0.5), FixedLengths(2048, 512), seed=0, name="vidur"
    )
    config = RunConfig(
        model="Llama-2-70B",
        hardware="A100-80GB",
        tp=2,
        fast_forward=fast_forward,
        **CONFIGS[policy],  # type: ignore[arg-type]
    )
    start = time.perf_counter()
    result = simulate(trace, config)
    wall_s = time.perf_counter() - start
    s = result.summary
    return {
        "wall_s": wall_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "completed": float(s["completed"] or 0),
        "steps": float(len(result.steps)),
        "simulated_steps": float(sum(result.steps.columns["num_steps"])),
        "mean_ttft_ms": float(s["mean_ttft_ms"] or 0),
        "mean_tpot_ms": float(s["mean_tpot_ms"] or 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--no-fast-forward", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("POLICY", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = run_one(args.child[0], int(args.child[1]), not args.no_fast_forward)
        print(json.dumps(out))
        return
    print(
        f"# servesim on Vidur's reference workload; python {platform.python_version()}, "
        f"{platform.machine()}, fast_forward={not args.no_fast_forward}"
    )
    print(
        f"{'policy':<11}{'requests':>9}{'wall s':>9}{'req/wall-s':>12}{'x Vidur':>8}"
        f"{'peak MiB':>10}{'rows':>10}{'steps':>12}{'TTFT s':>10}{'TPOT ms':>9}"
    )
    for policy in CONFIGS:
        for n in (int(x) for x in args.sizes.split(",")):
            cmd = [sys.executable, __file__, "--child", policy, str(n)]
            if args.no_fast_forward:
                cmd.append("--no-fast-forward")
            r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            rate = r["completed"] / r["wall_s"]
            print(
                f"{policy:<11}{n:>9}{r['wall_s']:>9.2f}{rate:>12,.0f}{rate / VIDUR_REQ_PER_S:>8.1f}"
                f"{r['peak_rss_mib']:>10.0f}{r['steps']:>10,.0f}{r['simulated_steps']:>12,.0f}"
                f"{r['mean_ttft_ms'] / 1000:>10,.1f}{r['mean_tpot_ms']:>9.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
