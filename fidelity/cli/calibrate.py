"""``python -m sim calibrate``'s options and handler; the calibration itself (which needs the
engine, and so torch) is ``fidelity.calibrate``, imported when the command runs."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from core.config import CacheConfig
from core.flags import add_setting_flags, given_settings
from core.settings import build
from fidelity.cli.engine_import import needs_engine
from fidelity.clocks import CLOCK_CHOICES, CLOCK_HELP


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="tiny-llama",
        help="engine model preset or Hugging Face directory (default: %(default)s)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    add_setting_flags(parser, (CacheConfig,), only=("block_size",))
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument(
        "--small-grid", action="store_true", help="a tiny grid (for tests; seconds on CPU)"
    )
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=1,
        help="torch threads on CPU, as the engine runs (default: %(default)s)",
    )
    parser.add_argument("--clock", default="auto", choices=CLOCK_CHOICES, help=CLOCK_HELP)
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="calibrate the engine without CUDA graphs (where it has them)",
    )
    parser.add_argument(
        "--mixed-graphs",
        default="off",
        choices=["off", "piecewise"],
        help="calibrate the engine with its steps with a prompt chunk on piecewise CUDA graphs "
        "(python -m engine run --mixed-graphs; CUDA only) (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="calibrate this many times, one after the other (the second and later profiles "
        "are written beside --out as NAME-repeatK.json), and report how far their "
        "predictions of the step grid differ (default: %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def repeat_paths(out: str, repeat: int) -> list[Path]:
    """``out``, then NAME-repeat2.json ... beside it."""
    first = Path(out)
    return [first] + [
        first.with_name(f"{first.stem}-repeat{i}{first.suffix}") for i in range(2, repeat + 1)
    ]


def run_calibrate(args: argparse.Namespace) -> int:
    block_size = build(CacheConfig, given_settings(args, ["block_size"])).block_size
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    command = shlex.join(["python", "-m", "sim", *getattr(args, "argv", sys.argv[1:])])
    with needs_engine("calibrate"):
        from fidelity.calibrate import calibrate

    paths = []
    for out in repeat_paths(args.out, args.repeat):
        path = calibrate(
            args.model,
            args.device,
            block_size,
            out,
            command,
            small=args.small_grid,
            progress=not args.quiet,
            cpu_threads=args.cpu_threads,
            clock=args.clock,
            enforce_eager=args.enforce_eager,
            mixed_graphs=args.mixed_graphs,
        )
        paths.append(path)
        if not args.quiet:
            print(f"wrote profile {path}")
        if (warning := late_timer_warning(path)) is not None:
            print(warning, file=sys.stderr)
    if len(paths) > 1:
        from fidelity.profile_check import compare_profiles

        report = compare_profiles(paths, args.model)
        target = paths[0].with_name(f"{paths[0].stem}-repeats.json")
        target.write_text(json.dumps(report, indent=1) + "\n")
        print_repeats(report)
        print(f"wrote {target}")
    return 0


def late_timer_warning(path: Path) -> str | None:
    """A warning where some of the profile's timed calls on CUDA still had the host's launches
    in their events after every hold (``engine.profiling.timer``), else None."""
    engine = json.loads(path.read_text()).get("engine") or {}
    late = int(engine.get("timer_late", 0) or 0)
    if not late:
        return None
    return (
        f"warning: {path}: {late} of {engine.get('timer_calls', '?')} timed calls' launches "
        "outran the GPU's hold every time; their table points include host time (a host "
        "busy elsewhere?): calibrate again"
    )


def print_repeats(report: dict[str, Any]) -> None:
    """How far the repeated calibrations' predictions of the step grid differ, and where."""
    from fidelity.profile_diff import describe

    spreads = ", ".join("-" if s is None else f"{s:.1f}%" for s in report["step_spread_pct"])
    print(f"each profile's whole steps around its own model, median |residual|: {spreads}")
    for pair in report["pairs"]:
        print(
            f"{pair['profile']} against the first on both step grids: median "
            f"{pair['median_pct']:.1f}%, p90 {pair['p90_pct']:.1f}%; where they differ:"
        )
        for line in describe(pair["where"]):
            print(line)
        one = pair.get("one_host") or {}
        if "error" in one:
            print(f"  on one host: not measured ({one['error']})")
        elif one:
            print(
                f"  on one host: its host ran {one['host_slowdown']:.3f}x the first's (input "
                f"preparation, median over {one['num_steps']} steps of the same shapes); priced "
                "back on the first's, the two "
                f"predict the step grids {one['median_pct']:.1f}% apart (median), p90 "
                f"{one['p90_pct']:.1f}%"
            )
