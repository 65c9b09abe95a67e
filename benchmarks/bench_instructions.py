"""Instructions a simulation executes, counted by valgrind's callgrind: a figure that, unlike a
wall time, does not move with the other tenants of a shared machine, so a change of 1% shows.

Each count is one process of a servesim checkout: it imports what ``bench_vidur.py``'s workload
needs (Llama-2-70B TP2 on an A100, 2048 + 512 tokens; selecting the compiled build first when
asked) and simulates 10 requests once, uninstrumented, so that every lazy import is done; then
callgrind is switched on (``callgrind_control -i on``) for the simulation of N requests alone,
trace generation and run summary included. The same for this tree and, with ``--baseline DIR``,
another checkout, from the sources and from a compiled build (made there first).
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
WARM_REQUESTS = 10
# Run in the measured checkout. Before its imports it selects the compiled build as
# ``python -m sim`` does, where the checkout has the switch (older ones read the environment
# when ``sim`` is imported).
CHILD = """
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
if os.path.exists(os.path.join("sim", "compiled", "switch.py")):
    from sim.compiled import switch
    switch.select(os.environ)
import bench_vidur
bench_vidur.run_one(sys.argv[1], {warm}, True)
print("ready", flush=True)
sys.stdin.readline()
run = bench_vidur.run_one(sys.argv[1], int(sys.argv[2]), True)
print(run["compiled"], flush=True)
"""


def count(root: Path, core: str, policy: str, n: int, keep: Path | None = None) -> int:
    """Instructions (callgrind's Ir) of simulating ``n`` requests in a process of ``root``;
    callgrind's output is copied to ``keep``, if given (for ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            CHILD.format(warm=WARM_REQUESTS),
            policy,
            str(n),
        ]
        env = {
            **os.environ,
            "SERVESIM_CORE": core,
            "PYTHONPATH": str(root),
            # A fixed hash seed: string hashes decide set and dict layouts, and so branches.
            "PYTHONHASHSEED": "0",
            # One BLAS thread: numpy's idle BLAS threads spin, as many instructions as the
            # machine's other tenants leave them time for (callgrind counts every thread).
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        log = Path(tmp) / "stderr"
        with log.open("w") as stderr:
            child = subprocess.Popen(
                cmd,
                cwd=root,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
            assert child.stdin is not None and child.stdout is not None
            ready = child.stdout.readline().strip() == "ready"
            if ready:
                subprocess.run(
                    ["callgrind_control", "-i", "on", str(child.pid)], capture_output=True
                )
                child.stdin.write("go\n")
                child.stdin.flush()
            compiled = child.stdout.readline().strip()
            code = child.wait()
        if not ready or code != 0 or compiled != str(float(core == "compiled")):
            tail = log.read_text()[-2000:]
            sys.exit(f"{policy} {n} ({core}, {root}) failed, or ran the other core:\n{tail}")
        if keep is not None:
            keep.write_bytes(out.read_bytes())
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
    parser.add_argument("--keep", metavar="DIR", help="keep callgrind's outputs there")
    args = parser.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    trees = {"this": ROOT}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    print(f"# instructions (G) of simulating {args.requests} requests, callgrind")
    print(f"{'policy':<11}{'core':>9}" + "".join(f"{t:>10}" for t in trees) + "   this/baseline")
    for policy in args.policies.split(","):
        for core in args.cores.split(","):
            counts = {
                tree: count(
                    root,
                    core,
                    policy,
                    args.requests,
                    None if keep is None else keep / f"{policy}-{core}-{tree}.out",
                )
                for tree, root in trees.items()
            }
            line = f"{policy:<11}{core:>9}" + "".join(f"{c / 1e9:>10.3f}" for c in counts.values())
            if "baseline" in counts:
                line += f"   {counts['this'] / counts['baseline']:.4f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
