"""What fast-forward cannot skip on Vidur's reference workload (``bench_vidur.py``'s, 10,000
requests by default): the steps simulated, those the policy scheduled one at a time, and the runs
of identical steps skipped over at once, with the boundaries per request and the requests running
in a run. Read off the step records: a row covering ``num_steps`` > 1 steps is a run skipped
over, a row of one step a step the policy scheduled (a run is never planned for one step).
Run: python benchmarks/fast_forward_boundaries.py [--requests 10000]
(docs/simulator_speed.md, "The steps fast-forward cannot skip", shows its output)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vidur import CONFIGS

from sim.run import RunConfig, simulate
from traces.distributions import FixedLengths, PoissonArrivals
from traces.generators import generate_trace


def counts(policy: str, num_requests: int) -> dict[str, float]:
    trace = generate_trace(
        num_requests, PoissonArrivals(0.5), FixedLengths(2048, 512), seed=0, name="vidur"
    )
    config = RunConfig(model="Llama-2-70B", hardware="A100-80GB", tp=2, **CONFIGS[policy])  # type: ignore[arg-type]
    columns = simulate(trace, config).steps.columns
    num_steps = np.asarray(columns["num_steps"], dtype=np.int64)
    running = np.asarray(columns["num_running"], dtype=np.int64)
    runs = num_steps > 1
    return {
        "steps simulated": float(num_steps.sum()),
        "steps the policy scheduled": float((~runs).sum()),
        "runs skipped over": float(runs.sum()),
        "steps in them": float(num_steps[runs].sum()),
        "mean run length": float(num_steps[runs].mean()),
        "boundaries per request": float(len(num_steps) / num_requests),
        "requests running in a run (mean)": float(running[runs].mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    table = {policy: counts(policy, args.requests) for policy in ("continuous", "chunked")}
    print(f"{args.requests:,} requests | continuous | chunked")
    for name in table["continuous"]:
        cells = []
        for policy in ("continuous", "chunked"):
            value = table[policy][name]
            cells.append(f"{value:,.0f}" if value.is_integer() else f"{value:,.1f}")
        print(f"{name} | {' | '.join(cells)}")


if __name__ == "__main__":
    main()
