"""Command line: ``python -m sim COMMAND``. Builds the top parser from each command's module
(``run`` in run_cli.py, ``compare`` in compare_cli.py, ...) and reports bad input as an
``error:`` line with exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reports.cli import add_report_command
from sim.compare_cli import add_compare_command
from sim.compile_cli import add_compile_command
from sim.costmodel_cli import add_costmodel_commands
from sim.engine_cli import add_engine_commands
from sim.grid_cli import add_sweep_commands
from sim.measured_cli import add_measured_commands
from sim.run import servesim_version
from sim.run_cli import add_run_command
from sim.validate_cli import measured_spelling
from traces.cli import add_trace_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim",
        description="servesim: simulate LLM inference serving on a request trace.",
    )
    parser.add_argument("--version", action="version", version=f"servesim {servesim_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_run_command(commands)
    add_compare_command(commands)
    add_sweep_commands(commands)
    add_report_command(commands)
    add_engine_commands(commands)
    add_measured_commands(commands)
    add_costmodel_commands(commands)
    add_trace_commands(commands)
    add_compile_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        given = list(sys.argv[1:] if argv is None else argv)
        # `validate --measured RUN_DIR` is `measured validate RUN_DIR` (issue 16's spelling).
        args = build_parser().parse_args(measured_spelling(given) or given)
        args.argv = given
        return int(args.func(args))
    except (ValueError, OSError) as error:
        # Bad input (trace rows, configs, files) is reported, never a traceback.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report it
