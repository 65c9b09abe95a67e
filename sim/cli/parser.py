"""The ``python -m sim`` parser: one sub-command per module (``run`` in ``sim.cli.run``,
``compare`` in ``sim.cli.compare``, ...), plus the commands that packages above the simulator
plug in through the ``servesim.commands`` entry points (``fidelity``: ``calibrate``,
``validate``, ``measured``), so that the simulator never imports them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

from reports.cli import add_report_command
from sim.cli.compare import add_compare_command
from sim.cli.compile import add_compile_command
from sim.cli.costmodel import add_costmodel_commands
from sim.cli.grid import add_sweep_commands
from sim.cli.run import add_run_command
from sim.run import servesim_version
from traces.cli import add_trace_commands

PLUGIN_GROUP = "servesim.commands"


class CommandPlugin(Protocol):
    """What a ``servesim.commands`` entry point names: a module that adds sub-commands, and may
    rewrite an argv before parsing (an alternative spelling of one of its commands)."""

    def add_commands(self, commands: Any) -> None: ...

    def rewrite_argv(self, argv: Sequence[str]) -> list[str] | None: ...


def plugins() -> list[CommandPlugin]:
    """The installed command plugins, in name order."""
    found = sorted(entry_points(group=PLUGIN_GROUP), key=lambda point: point.name)
    loaded: list[CommandPlugin] = [point.load() for point in found]
    return loaded


def build_parser(extra: Sequence[CommandPlugin] | None = None) -> argparse.ArgumentParser:
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
    for plugin in plugins() if extra is None else extra:
        plugin.add_commands(commands)
    add_costmodel_commands(commands)
    add_trace_commands(commands)
    add_compile_command(commands)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed, after any plugin's rewrite of it."""
    found = plugins()
    for plugin in found:
        rewritten = plugin.rewrite_argv(argv)
        if rewritten is not None:
            argv = rewritten
            break
    return build_parser(found).parse_args(argv)
