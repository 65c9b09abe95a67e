"""``python -m sim sweep`` and ``capacity``, the commands that run many configurations; their
options and handlers live in sim/experiments/sweep.py and sim/cli/capacity.py."""

from __future__ import annotations

from typing import Any


def add_sweep_commands(commands: Any) -> None:
    """Register ``sweep`` and ``capacity`` on `commands` (what `add_subparsers` returned)."""
    from sim.cli import capacity
    from sim.experiments import sweep

    sweep_parser = commands.add_parser(
        "sweep",
        help="run a grid of configurations (a TOML spec) and tabulate them",
        description="Run every point of SPEC (docs/sweep.md) as an ordinary run, each in its own "
        "folder under --out, and write sweep.csv with one row per point. Points already "
        "complete under --out are not run again.",
    )
    sweep.add_sweep_arguments(sweep_parser)
    sweep_parser.set_defaults(func=sweep.sweep_command)
    capacity_parser = commands.add_parser(
        "capacity",
        help="find the highest arrival rate that meets the SLOs",
        description="Bracket, then bisect, the arrival rate (time-scaling TRACE's arrivals, the "
        "trace repeated end to end until each probe is long enough to judge the steady state) "
        "to the highest rate at which at least --goodput of requests meet both SLOs; the answer "
        "comes with a 95% confidence interval (docs/sweep.md).",
    )
    capacity.add_capacity_arguments(capacity_parser)
    capacity_parser.set_defaults(func=capacity.capacity_command)
