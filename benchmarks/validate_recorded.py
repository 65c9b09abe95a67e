"""The simulator against servesim's engine on the recorded H200 runs, offline: ``python -m sim
validate --replay RUN --profile P`` on each of the nine recorded engine runs with each of the two
recorded calibrations, and the analytic roofline beside them (``../shared/gpu-runs/``, README).
Prints per run the median per-request |error| of TTFT, TPOT, E2E and the cost model's median
|error| on the engine's own steps; then how far the two profiles' predictions of the same steps
differ and where the profiles themselves differ (their raw tables and whole steps, and the
cause), and the engine against itself (the same configuration run again).

    python benchmarks/validate_recorded.py > benchmarks/results/validate_recorded.txt

Targets (issue 30): TPOT and E2E <= 5%, TTFT <= 10%, steps <= 5% with either profile on every run
(run1 of example.csv, measured on a freshly started machine, reported apart); the two profiles'
step predictions within 5% of each other.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fidelity.profile_diff import describe  # noqa: E402
from fidelity.recorded import RECORDED, recorded_runs  # noqa: E402

METRICS = ("ttft", "tpot", "e2e")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="the shared data")
    parser.add_argument("--out", default=None, help="keep the validation folders here")
    parser.add_argument("--runs", default=None, help="comma-separated run folders (default all)")
    parser.add_argument("--json", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    root = Path(args.shared) / RECORDED
    if not root.exists():
        print(f"error: {root}: the recorded H200 runs are not there (--shared)", file=sys.stderr)
        return 2
    wanted = args.runs.split(",") if args.runs else None
    started = time.time()
    print(f"# python benchmarks/validate_recorded.py {shlex.join(argv or sys.argv[1:])}".rstrip())
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.out or scratch)
        figures = recorded_runs(root, out, wanted)
    _print(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(f"# wall time {time.time() - started:.0f} s")
    return 0


def _print(figures: dict[str, Any]) -> None:
    print("median |error| % per request (TTFT, TPOT, E2E) and on the engine's own steps; 'tail':")
    print("the decode-only steps' total over the model's less their median step's, in points (the")
    print("run's slow steps, which a request's TPOT carries); 'calm': the same without the steps")
    print("whose input preparation also ran >= 1.2x the run's own table of it (the host's stalls)")
    header = f"{'run':44s} {'model':12s}" + "".join(f"{m.upper():>7s}" for m in METRICS)
    print(header + f"{'steps':>7s}{'bias':>7s}{'tail':>7s}{'calm':>7s}")
    for run, models in figures["runs"].items():
        for name, row in models.items():
            cells = "".join(f"{row[m]:7.1f}" for m in METRICS)
            steps = f"{row['steps']:7.1f}{row['steps_bias']:+7.1f}{row['decode_tail']:+7.1f}"
            steps += f"{row['decode_tail_calm']:+7.1f}"
            print(f"{run:44s} {name:12s}{cells}{steps}")
    print("on the run's own host: each run's host against the fastest run of its configuration,")
    print("measured from the engine's input preparation (fidelity/host_speed.py; a configuration")
    print("run once is its own reference), and the errors again with the host's clock stretched")
    print("by it (CostModelConfig.host_slowdown; the GPU's clock untouched)")
    print(
        f"{'run':44s} {'model':12s}{'slowdown':>9s}" + "".join(f"{m.upper():>7s}" for m in METRICS)
    )
    for run, models in figures["on_own_host"].items():
        slowdown = figures["host_slowdown"][run]
        if slowdown == 1.0:
            print(f"{run:44s} {'(reference)':12s}{slowdown:9.3f}")
            continue
        for name, row in models.items():
            cells = "".join(f"{row[m]:7.1f}" for m in METRICS)
            steps = f"{row['steps']:7.1f}{row['steps_bias']:+7.1f}"
            print(f"{run:44s} {name:12s}{slowdown:9.3f}{cells}{steps}")
    print("TTFT beside its per-request error: the step-phase floor (from the engine run alone:")
    print("the median per-request |difference| that independent step boundaries make, and the")
    print("median of E|difference| / TTFT), the per-request |error| after the wait for the step")
    print("under way ('rest'), and the error of the TTFT distribution (median, p90; a different")
    print("metric); then the prefill-heavy steps' median signed error, first fifth / the rest")
    columns = "floor  E/TTFT   TTFT   rest  dist-med  dist-p90  pf-early  pf-rest"
    print(f"{'run':44s} {'model':10s} {columns}")
    for run, models in figures["runs"].items():
        floor = figures["ttft_phase_floor"][run]
        for name, row in models.items():
            print(
                f"{run:44s} {name:10s}{floor['median_pct']:6.1f}{floor['expected_pct']:8.1f}"
                f"{row['ttft']:7.1f}{row['ttft_rest']:7.1f}{row['ttft_median_err']:+10.1f}"
                f"{row['ttft_p90_err']:+10.1f}{row['prefill_early']:+10.1f}{row['prefill_rest']:+9.1f}"
            )
    print("the two profiles on the same engine steps: median |cal1 - cal2| / cal2 %")
    for run, value in figures["profiles_agree"].items():
        print(f"  {run:44s} {value:6.1f}")
    print("where the two profiles differ: raw tables at shared points, whole steps at matching")
    print("shapes (cal2 / cal1 - 1, %)")
    for line in describe(figures["profiles_differ"]):
        print(line)
    print("the engine against itself: median |difference| % per request (second vs first); its")
    print("TTFT difference split into the wait for the step under way and the rest")
    for pair, row in figures["engine_floor"].items():
        cells = "".join(f" {m.upper()} {row[m]:5.1f}" for m in METRICS)
        print(f"  {pair:60s}{cells} wait {row['ttft_wait']:5.1f} rest {row['ttft_rest']:5.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
