"""The engine's time between steps that no step holds: in a wall-clock replay the next step
starts after this step's busy time (schedule, prepare, execute, update) plus the replay loop's
own work (arrivals, bookkeeping). The simulator prices busy time only, so this gap is a bias
of the engine against the simulator, about 1% of a step before 2026-11-28.

For each engine run folder given (``steps.csv`` or ``step_shapes.jsonl``, gzip-compressed or
not): the median gap after the update over back-to-back steps (the next step starting within
2 ms of the end: the engine did not wait for an arrival), the median update, the median busy
step, and the gap as a share of it.

    python benchmarks/replay_loop_gap.py RUN_DIR [RUN_DIR ...]
    python benchmarks/replay_loop_gap.py --cpu-example OUT   # first runs example.csv on the
        CPU engine (tiny-llama, wall clock) into OUT, then reads it
(results in benchmarks/results/replay_loop_gap.txt)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fidelity.loop_gap import loop_gap  # noqa: E402
from records.run_dir import run_file  # noqa: E402
from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes  # noqa: E402


def _figures(run_dir: Path) -> dict[str, Any]:
    return loop_gap(load_step_shapes(run_file(run_dir, STEP_SHAPES_FILE)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="engine run folders")
    parser.add_argument("--cpu-example", type=Path, help="run example.csv on the CPU here first")
    args = parser.parse_args(argv)
    runs = list(args.runs)
    if args.cpu_example is not None:
        command = [
            sys.executable, "-m", "engine", "run", str(ROOT / "traces/data/example.csv"),
            "--model", "tiny-llama", "--device", "cpu", "--weights", "random",
            "--clock", "wall", "--out", str(args.cpu_example), "--quiet",
        ]  # fmt: skip
        started = time.monotonic()
        subprocess.run(command, check=True, cwd=ROOT)
        print(f"# ran {' '.join(command[1:])} ({time.monotonic() - started:.0f} s)")
        runs.insert(0, args.cpu_example)
    if not runs:
        parser.error("give engine run folders, or --cpu-example OUT")
    print(f"{'run':<64} {'steps':>6} {'b2b':>6} {'gap us':>7} {'update us':>9} "
          f"{'busy ms':>8} {'gap %':>6}")  # fmt: skip
    for run in runs:
        try:
            f = _figures(run)
        except (OSError, ValueError) as error:
            print(f"replay_loop_gap: {run}: {error}", file=sys.stderr)
            return 2
        if f["gap_s"] is None:
            print(f"{str(run)[-64:]:<64} {f['num_steps']:6d}      0   no two steps back to back")
            continue
        print(
            f"{str(run)[-64:]:<64} {f['num_steps']:6d} {f['back_to_back']:6d} "
            f"{1e6 * f['gap_s']:7.1f} {1e6 * f['update_s']:9.1f} {1e3 * f['busy_s']:8.2f} "
            f"{f['share_pct']:6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
