"""The `costmodel` and `profile` sub-commands of `python -m sim`, kept apart from the run
options in cli.py: `costmodel check` holds the roofline to measured op times."""

from __future__ import annotations

import argparse
from typing import Any

from sim.costmodel_check import add_check_arguments, check_command


def add_costmodel_commands(commands: Any) -> None:
    """Register the sub-commands on `commands` (what `add_subparsers` returned)."""
    costmodel = commands.add_parser("costmodel", help="hold the cost model to measured times")
    costmodel_commands = costmodel.add_subparsers(dest="costmodel_command", required=True)
    check: argparse.ArgumentParser = costmodel_commands.add_parser(
        "check",
        help="compare the roofline with Vidur's measured op times",
        description="For every measured shape in a Vidur profile directory that fits MODEL, "
        "print our prediction against the measured median per op (linear layers, elementwise "
        "ops, all-reduce, attention) and for whole decode and prefill steps built as the sum "
        "of measured ops: median and max absolute %% error and the signed bias.",
    )
    add_check_arguments(check)
    check.set_defaults(func=check_command)
