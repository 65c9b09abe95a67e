"""``python -m sim calibrate`` and ``validate``, the commands that drive the real engine; their
options and handlers live in sim/calibrate.py and sim/validate_cli.py."""

from __future__ import annotations

from typing import Any

from sim.calibrate import add_calibrate_arguments, run_calibrate
from sim.validate_cli import add_validate_arguments, run_validate


def add_engine_commands(commands: Any) -> None:
    """Register ``calibrate`` and ``validate`` on `commands` (what `add_subparsers` returned)."""
    calibrate = commands.add_parser(
        "calibrate",
        help="time the real engine's parts and write a cost-model profile",
        description="Time the real engine (torch) over a grid of sizes: linear layers, "
        "elementwise ops, paged decode and prefill attention, the KV store, block copies, "
        "swaps, LM head + sampling, input preparation, and whole steps as check points. "
        "Writes a profile that --profile reads (docs/profile_format.md).",
    )
    add_calibrate_arguments(calibrate)
    calibrate.set_defaults(func=run_calibrate)
    validate = commands.add_parser(
        "validate",
        help="replay a trace on the real engine and measure the simulator's error",
        description="Replay TRACE on the real engine (or read --replay ENGINE_RUN_DIR), "
        "calibrate if no --profile, simulate the same trace and configuration with the profile "
        "and with the analytic roofline, and compare per request (TTFT, TPOT, ITL, E2E), per "
        "step (the cost model on the engine's own batches) and in aggregate. Writes "
        "validation.json under --out.",
    )
    add_validate_arguments(validate)
    validate.set_defaults(func=run_validate)
