"""How long a capacity probe must be: the capacity of one configuration found with probes that
replay the trace 1, 5, 10, 25 and 50 times end to end, beside the answer of the default rule
(``sim.experiments.capacity_judgement.probe_requests``). A short trace's probes see a burst that
the batch absorbs, not the steady state; the answer settles once probes are long enough.

Defaults: the bundled example (200 requests), Llama-3-8B on an H100 (the run defaults,
max_num_seqs 256), TTFT <= 500 ms and TPOT <= 50 ms for 90% of requests, --rate-tol 0.02.
Run: python benchmarks/capacity_window.py [--trace T] [--max-num-seqs N] [--repeats 1,5,...]
(results committed in benchmarks/results/capacity_window.txt)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sim.experiments.capacity import ProbeRunner, SearchSettings, run_searches, search
from sim.experiments.capacity_judgement import confidence_bounds, probe_repeats
from sim.experiments.sweep import open_workers
from sim.experiments.sweep_spec import TraceSource, point_config

ROOT = Path(__file__).resolve().parents[1]


def capacity(
    source: TraceSource, options: dict[str, object], repeats: int | None, jobs: int
) -> tuple[float | None, tuple[float | None, float | None], int, float]:
    """(capacity, 95% bounds, probes, wall s) with probes of ``repeats`` copies (None: the
    default rule)."""
    trace = source.load()
    settings = SearchSettings(goodput=0.9, rel_tol=0.02)
    config = point_config(options)

    def copies(_: int, rate: float) -> int:
        return repeats or probe_repeats(len(trace), config, rate)

    start = time.perf_counter()
    with open_workers(jobs) as workers:
        runner = ProbeRunner(source, [options], workers, None, copies)
        (result,) = run_searches(
            [search(trace.mean_rate_per_s, settings, workers.num_workers)], runner
        )
    wall = time.perf_counter() - start
    rate = result.capacity_rate
    bounds = confidence_bounds(result.probes, rate, 0.9) if rate is not None else (None, None)
    return rate, bounds, len(result.probes), wall


def _text(rate: float | None) -> str:
    """A bound, or "none" where no probe was clear enough to give one."""
    return "none" if rate is None else f"{rate:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(ROOT / "traces" / "data" / "example.csv"))
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--repeats", default="1,5,10,25,50")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args()
    source = TraceSource(path=args.trace)
    num_requests = len(source.load())
    options: dict[str, object] = {"max_num_seqs": args.max_num_seqs}
    options |= {"slo_ttft": 500, "slo_tpot": 50}
    shown = os.path.relpath(args.trace, ROOT)
    print(f"trace {shown} ({num_requests} requests), max_num_seqs {args.max_num_seqs}")
    print("probe length        requests  capacity req/s  95% interval req/s   probes  wall s")
    runs: list[tuple[str, int | None]] = [
        (f"{k} x the trace", k) for k in map(int, args.repeats.split(","))
    ]
    runs.append(("default rule", None))
    for name, repeats in runs:
        rate, (low, high), probes, wall = capacity(source, options, repeats, args.jobs)
        config = point_config(options)
        count = num_requests * (repeats or probe_repeats(num_requests, config, rate or 1.0))
        interval = f"[{_text(low)}, {_text(high)}]"
        print(
            f"{name:<18} {count:>9,}  {rate or float('nan'):>14.4g}  {interval:<19} "
            f"{probes:>6}  {wall:6.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
