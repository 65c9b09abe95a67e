"""``python -m sim validate``'s options, handler and error table; the validation itself is
``fidelity.validate`` (it needs the engine, so torch), imported when the command runs. Also
issue 16's spelling, ``validate --measured RUN_DIR``, which ``fidelity.cli`` rewrites to
``measured validate`` before parsing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.config import LAYOUT_SETTINGS, CacheConfig, SchedulerConfig
from core.flags import add_setting_flags, given_settings
from core.settings import build
from fidelity.cli.engine_import import needs_engine
from fidelity.clocks import CLOCK_CHOICES, CLOCK_HELP
from fidelity.validate_config import VALIDATION_FILE, ValidateConfig
from sim.specs.hardware import get_hardware_preset


def print_table(result: dict[str, Any], file: Any = sys.stdout) -> None:
    """The error table: per cost model, per-request metrics and per-step error."""
    print(
        f"validation of {result['trace']} ({result['num_requests']} requests); engine clock "
        f"{result.get('engine_clock', 'wall')}, profile timer {result.get('profile_timer')}",
        file=file,
    )
    for name, model in result["models"].items():
        parts = []
        for metric, stats in model["requests"]["metrics"].items():
            if stats["median_abs_pct"] is None:
                continue
            parts.append(
                f"{metric.upper()} {stats['median_abs_pct']:.1f}% (p90 {stats['p90_abs_pct']:.1f}%,"
                f" bias {stats['bias_pct']:+.1f}%)"
            )
        print(f"  {name:<10} per request, median |error|: " + "; ".join(parts), file=file)
        steps = model["steps"]
        kinds = ", ".join(
            f"{kind} {s['median_abs_pct']:.1f}% (n={s['n']})"
            for kind, s in steps["by_kind"].items()
            if s["median_abs_pct"] is not None
        )
        overall = steps["all"]["median_abs_pct"]
        if overall is not None:
            print(
                f"  {name:<10} engine's own steps, median |error| {overall:.1f}% "
                f"(bias {steps['all']['bias_pct']:+.1f}%): {kinds}",
                file=file,
            )
        div = model["divergence"]
        print(
            f"  {name:<10} batches identical for the first {div['num_identical_steps']} of "
            f"{model['num_engine_steps']} engine steps ({model['num_sim_steps']} simulated)",
            file=file,
        )


MEASURED_OPTION = "--measured"


def measured_spelling(argv: Sequence[str]) -> list[str] | None:
    """Issue 16's spelling, ``validate --measured RUN_DIR [run options]``, as the argv of the one
    implementation, ``measured validate RUN_DIR [run options]``; None for any other argv. (The
    run options are ``sim run``'s, not the engine validation's, so the argv is rewritten before
    either parser sees it.)"""
    if not argv or argv[0] != "validate":
        return None
    rest = list(argv[1:])
    for idx, arg in enumerate(rest):
        if arg == MEASURED_OPTION:
            if idx + 1 == len(rest) or rest[idx + 1].startswith("-"):
                raise ValueError(f"{MEASURED_OPTION} needs a RUN_DIR (from sim measured import)")
            return ["measured", "validate", rest[idx + 1], *rest[:idx], *rest[idx + 2 :]]
        if arg.startswith(MEASURED_OPTION + "="):
            run_dir = arg.partition("=")[2]
            return ["measured", "validate", run_dir, *rest[:idx], *rest[idx + 1 :]]
    return None


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ValidateConfig()
    parser.add_argument(
        "trace",
        nargs="?",
        help="trace file (the formats `python -m sim run` reads); not with --measured",
    )
    parser.add_argument(
        MEASURED_OPTION,
        metavar="RUN_DIR",
        default=None,
        help="instead: replay a measured run (from `python -m sim measured import`) in the "
        "simulator and print the per-request error; the same command as `python -m sim "
        "measured validate RUN_DIR`, taking its run options (see its --help)",
    )
    parser.add_argument("--format", default="auto", help="trace format (default: detect)")
    parser.add_argument("--model", default=defaults.model, help="model (default: %(default)s)")
    parser.add_argument(
        "--device", default=defaults.device, help="cpu or cuda (default: %(default)s)"
    )
    parser.add_argument(
        "--profile", default=None, help="cost-model profile; default: calibrate one first"
    )
    parser.add_argument(
        "--replay",
        default=None,
        metavar="ENGINE_RUN_DIR",
        help="compare against this saved engine run (python -m engine run --out, or a "
        "previous validate's engine/) instead of running the engine",
    )
    parser.add_argument("--out", required=True, help="directory for validation.json and runs")
    parser.add_argument("--report", default=None, help="write the HTML validation section here")
    settings = parser.add_argument_group(
        "KV cache and scheduling (the engine's: the flags of python -m engine run)"
    )
    add_setting_flags(settings, (CacheConfig, SchedulerConfig), skip=LAYOUT_SETTINGS)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=defaults.time_scale,
        help="multiply arrival times by this (default: %(default)s)",
    )
    parser.add_argument(
        "--max-requests", type=int, default=None, help="use only the trace's first N requests"
    )
    parser.add_argument(
        "--hardware",
        default=None,
        help="hardware preset of the roofline baseline (default: CPU-1T on cpu, H100-SXM on cuda)",
    )
    parser.add_argument(
        "--clock",
        default=defaults.clock,
        choices=CLOCK_CHOICES,
        help=CLOCK_HELP + "; with cpu the engine replays on a virtual clock advanced by each "
        "step's thread-CPU time (python -m engine run --clock), so the comparison is like "
        "with like (default: %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def config_from_args(args: argparse.Namespace) -> ValidateConfig:
    return build(
        ValidateConfig,
        {
            **given_settings(args),
            "model": args.model,
            "device": args.device,
            "time_scale": args.time_scale,
            "max_requests": args.max_requests,
            "hardware": args.hardware,
            "clock": args.clock,
        },
    )


def run_validate(args: argparse.Namespace) -> int:
    import shlex

    from traces.loaders import load_trace

    if args.measured is not None:
        # main() rewrites this spelling before parsing (measured_spelling); reaching here means
        # a caller parsed it itself.
        raise ValueError(
            f"{MEASURED_OPTION}: call sim.cli.main.main, which runs `measured validate`"
        )
    if args.trace is None:
        raise ValueError(f"validate needs a TRACE (or {MEASURED_OPTION} RUN_DIR)")
    config = config_from_args(args)
    if args.hardware is not None:
        get_hardware_preset(args.hardware)
    trace = load_trace(args.trace, format=args.format)
    command = shlex.join(["python", "-m", "sim", *getattr(args, "argv", sys.argv[1:])])
    with needs_engine("validate"):
        from fidelity.validate import validate

    result = validate(
        trace,
        config,
        args.out,
        profile=args.profile,
        replay_dir=args.replay,
        command=command,
        progress=not args.quiet,
    )
    if not args.quiet:
        print_table(result)
        print(f"wrote {Path(args.out) / VALIDATION_FILE}")
    if args.report:
        from reports.validation import write_validation_report

        path = write_validation_report(result, args.report)
        if not args.quiet:
            print(f"wrote report {path}")
    return 0
