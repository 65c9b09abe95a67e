"""``python -m sim compile-core``: build the shared core with mypyc (``sim.compiled.build``), so
that ``SERVESIM_CORE=compiled`` runs the same simulation faster."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from sim.compiled import build as compiled


def add_compile_command(commands: Any) -> None:
    """Register ``compile-core`` on `commands` (what `add_subparsers` returned)."""
    parser = commands.add_parser(
        "compile-core",
        help="build the shared core with mypyc, for SERVESIM_CORE=compiled",
        description="Compile the simulation's hot path (the core: scheduler, allocators, "
        "policies; fast-forward, the step loop, the executor and the roofline) to C extensions "
        "with mypyc, into a cache directory keyed by the sources' hash. Then "
        "SERVESIM_CORE=compiled makes every python -m sim command use that build: the same "
        "results, faster (docs/compiled_core.md). "
        "Needs mypy (which ships mypyc) and a C compiler; an existing build of the same sources "
        "is reused.",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help=f"cache directory (default ${compiled.CACHE_ENV_VAR}, else ~/.cache/servesim/core)",
    )
    parser.set_defaults(func=run_compile)


def run_compile(args: argparse.Namespace) -> int:
    try:
        where, seconds = compiled.compile_core(args.cache)
    except RuntimeError as error:
        raise ValueError(f"compile-core: {error}") from error
    print(f"compiled core in {where} ({seconds:.1f} s)")
    hint = f"{compiled.ENV_VAR}=compiled"
    if args.cache is not None:
        hint += f" {compiled.CACHE_ENV_VAR}={args.cache}"
    if os.environ.get(compiled.ENV_VAR) != "compiled" or args.cache is not None:
        print(f"use it with: {hint} python -m sim run ...")
    return 0
