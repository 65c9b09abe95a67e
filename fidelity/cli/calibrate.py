"""``python -m sim calibrate``'s options and handler; the calibration itself (which needs the
engine, and so torch) is ``fidelity.calibrate``, imported when the command runs."""

from __future__ import annotations

import argparse
import shlex
import sys

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
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run_calibrate(args: argparse.Namespace) -> int:
    block_size = build(CacheConfig, given_settings(args, ["block_size"])).block_size
    command = shlex.join(["python", "-m", "sim", *getattr(args, "argv", sys.argv[1:])])
    with needs_engine("calibrate"):
        from fidelity.calibrate import calibrate

    path = calibrate(
        args.model,
        args.device,
        block_size,
        args.out,
        command,
        small=args.small_grid,
        progress=not args.quiet,
        cpu_threads=args.cpu_threads,
        clock=args.clock,
    )
    if not args.quiet:
        print(f"wrote profile {path}")
    return 0
