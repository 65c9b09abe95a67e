"""Instructions a simulation executes, counted by valgrind's callgrind: a figure that, unlike a
wall time, does not move with the other tenants of a shared machine, so a change of 1% shows.

It runs ``bench_vidur.py``'s workload (Llama-2-70B TP2 on an A100, 2048 + 512 tokens) twice per
configuration, with N requests and with 10, and prints the difference (the simulation of N - 10
requests, without the interpreter's start and the imports), for this tree and, with
``--baseline DIR``, another checkout of servesim, from the sources and from a compiled build.
Run: python benchmarks/bench_instructions.py [--requests 2000] [--policies chunked,continuous]
[--cores python,compiled] [--baseline DIR] (needs valgrind; results in
benchmarks/results/vidur.txt)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = 10


def count(root: Path, core: str, policy: str, n: int) -> int:
    """Instructions (callgrind's Ir) of one ``bench_vidur.py --child`` process of ``root``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(root / "benchmarks" / "bench_vidur.py"),
            "--child",
            policy,
            str(n),
        ]
        # A fixed hash seed: string hashes decide set and dict layouts, and so a few branches.
        env = {**os.environ, "SERVESIM_CORE": core, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
        if done.returncode != 0:
            sys.exit(f"{policy} {n} ({core}, {root}) failed:\n{done.stderr[-2000:]}")
        summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        if summary is None:
            sys.exit(f"no summary line in callgrind's output for {policy} {n} ({core}, {root})")
        return int(summary.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--policies", default="chunked,continuous")
    parser.add_argument("--cores", default="python,compiled")
    parser.add_argument("--baseline", metavar="DIR", help="another servesim checkout")
    args = parser.parse_args()
    trees = {"this": ROOT}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    print(f"# instructions (G) of {args.requests} - {SMALL} requests, callgrind")
    print(f"{'policy':<11}{'core':>9}" + "".join(f"{t:>10}" for t in trees) + "   this/baseline")
    for policy in args.policies.split(","):
        for core in args.cores.split(","):
            counts = {
                tree: count(root, core, policy, args.requests) - count(root, core, policy, SMALL)
                for tree, root in trees.items()
            }
            line = f"{policy:<11}{core:>9}" + "".join(f"{c / 1e9:>10.3f}" for c in counts.values())
            if "baseline" in counts:
                line += f"   {counts['this'] / counts['baseline']:.4f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
