"""Recorded CPU calibrations, refitted offline: for each folder under DIR (two calibrations of
tiny-llama on this machine, ``profile.json`` and ``profile-repeat2.json``, written by ``python
-m sim calibrate --repeat 2``, and the engine runs ``benchmarks/validate_cpu.py`` made with
them), how far the two profiles' models predict the same steps apart (issue 30's CPU target:
5%), and with each profile the simulator against the 16 engine runs (median over the runs of
the per-request median |error|; issue 30's target: TPOT and E2E within the engine's floor + 3
points, the floor from the two ``noise`` runs of the same configuration). A CPU profile's step
fit runs when it is loaded, and the decode rule that ``sim calibrate`` now chooses by the whole
steps (``fidelity.decode_rule``) is applied to a copy of each profile first (``--as-recorded``
leaves the profiles as they are), so this measures what the sources it runs from make of the
same measurements.

    python benchmarks/refit_cpu.py benchmarks/results/cpu-calibrations-2026-11-27 \
        > benchmarks/results/refit_cpu.txt
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fidelity.decode_rule import apply_rule_by_steps  # noqa: E402
from fidelity.profile_check import compare_profiles  # noqa: E402
from fidelity.recorded import validate_run  # noqa: E402
from fidelity.validate import engine_floor  # noqa: E402

PROFILES = ("profile.json", "profile-repeat2.json")
METRICS = ("ttft", "tpot", "e2e")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="a folder of recorded CPU calibrations (one per subfolder)")
    parser.add_argument(
        "--as-recorded", action="store_true", help="keep each profile's recorded decode rule"
    )
    args = parser.parse_args(argv)
    started = time.time()
    print(f"# python benchmarks/refit_cpu.py {shlex.join(argv or sys.argv[1:])}")
    sets = sorted(p for p in Path(args.dir).iterdir() if (p / PROFILES[0]).exists())
    if not sets:
        print(f"error: {args.dir}: no folder with {PROFILES[0]}", file=sys.stderr)
        return 2
    print("set             two calibrations apart | profile          TTFT  TPOT   E2E  steps")
    scratch = tempfile.TemporaryDirectory()
    for folder in sets:
        profiles = [folder / name for name in PROFILES]
        if not args.as_recorded:
            profiles = [_as_calibrated(p, Path(scratch.name) / folder.name) for p in profiles]
        pair = compare_profiles(profiles)["pairs"][0]
        label = f"{folder.name:15s} {pair['median_pct']:4.1f}% (p90 {pair['p90_pct']:4.1f}%)"
        one = pair["one_host"]
        print(
            f"# {folder.name}: on one host, not measured ({one['error']})"
            if "error" in one
            else f"# {folder.name}: the second's host ran {one['host_slowdown']:.3f}x the "
            f"first's; priced back on the first's, apart {one['median_pct']:.1f}% (p90 "
            f"{one['p90_pct']:.1f}%)"
        )
        floor = _floor(folder / "runs")
        for name, profile in zip(PROFILES, profiles, strict=True):
            cells = _medians(folder / "runs", profile)
            print(
                f"{label:38s} | {name.split('.')[0]:16s} "
                + " ".join(f"{cells[k]:5.1f}" for k in (*METRICS, "steps"))
            )
            label = ""
        print(
            f"{'':38s} | {'engine floor':16s} "
            + " ".join(f"{floor[k]:5.1f}" for k in METRICS)
            + f"   (floor + 3: TPOT {floor['tpot'] + 3:.1f}, E2E {floor['e2e'] + 3:.1f})"
        )
    print(f"# wall time {time.time() - started:.0f} s")
    return 0


def _as_calibrated(profile: Path, folder: Path) -> Path:
    """A copy of ``profile`` with the decode rule its whole steps choose."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / profile.name
    shutil.copy(profile, copy)
    chosen = apply_rule_by_steps(copy)
    if chosen is not None:
        print(
            f"# {profile.parent.name}/{profile.name}: decode rule {chosen['rule']} by the whole "
            f"steps (the kernel checks chose {chosen['kernel_checks_chose']})"
        )
    return copy


def _runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/*/engine/summary.json"))


def _medians(root: Path, profile: Path) -> dict[str, float]:
    """Medians over the runs of each metric's per-request median |error| (and the steps')."""
    values: dict[str, list[float]] = {k: [] for k in (*METRICS, "steps")}
    for run in _runs(root):
        with tempfile.TemporaryDirectory() as out:
            result = validate_run(run, profile, Path(out), first_requests=True)
        model = result["models"]["calibrated"]
        for metric in METRICS:
            values[metric].append(model["requests"]["metrics"][metric]["median_abs_pct"])
        values["steps"].append(model["steps"]["all"]["median_abs_pct"])
    return {k: statistics.median(v) for k, v in values.items()}


def _floor(root: Path) -> dict[str, float]:
    floor = engine_floor(root / "noise-1", root / "noise-2")
    metrics = floor["requests"]["metrics"]
    return {k: float(metrics[k]["median_abs_pct"]) for k in METRICS}


if __name__ == "__main__":
    raise SystemExit(main())
