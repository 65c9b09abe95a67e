"""Many more draws of the fast-forward differential test than CI runs: each draws a small
trace and a configuration, runs it with and without fast-forward, and compares request frames,
summaries, per-row totals and allocator state at every row boundary.

Run: python benchmarks/fast_forward_differential.py [--examples N] [--seed S]
(results: benchmarks/results/fast_forward_differential.txt)
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.run import RunConfig
from tests.sim.fastforward.differential import assert_fast_forward_exact, configs, traces
from traces.schema import Trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="draws to run (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    args = parser.parse_args(argv)
    runs = {"examples": 0, "with_skips": 0, "skipped_steps": 0}

    @seed(args.seed)
    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(trace=traces(), config=configs())
    def check(trace: Trace, config: RunConfig) -> None:
        skipped = assert_fast_forward_exact(trace, config)
        runs["examples"] += 1
        runs["with_skips"] += skipped > 0
        runs["skipped_steps"] += skipped

    start = time.perf_counter()
    failure = None
    try:
        check()
    except AssertionError as error:  # shrunk by hypothesis
        failure = f"{type(error).__name__}: {error}"
        print("\n".join(getattr(error, "__notes__", [])))  # the shrunk draw
    wall_s = time.perf_counter() - start
    print(f"# python {platform.python_version()} on {platform.machine()}, seed {args.seed}")
    print(
        f"{runs['examples']} draws run (asked {args.examples}); {runs['with_skips']} of them "
        f"fast-forwarded ({runs['skipped_steps']:,} steps skipped in all); {wall_s:.0f} s"
    )
    print("result: " + ("all equal" if failure is None else f"FAILED: {failure}"))
    return 0 if failure is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
