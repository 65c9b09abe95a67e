"""The commands this package adds to ``python -m sim`` (``calibrate``, ``validate``,
``measured``), plugged in through the ``servesim.commands`` entry point so that the simulator
never imports them. Registering them loads no torch: each handler imports the engine when it
runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fidelity.cli.calibrate import add_calibrate_arguments, run_calibrate
from fidelity.cli.measured import add_measured_commands
from fidelity.cli.validate import add_validate_arguments, measured_spelling, run_validate


def rewrite_argv(argv: Sequence[str]) -> list[str] | None:
    """``validate --measured RUN_DIR`` is ``measured validate RUN_DIR`` (issue 16's spelling)."""
    return measured_spelling(argv)


def add_commands(commands: Any) -> None:
    """Register ``calibrate``, ``validate`` and ``measured`` on `commands` (what
    `add_subparsers` returned)."""
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
    add_measured_commands(commands)
