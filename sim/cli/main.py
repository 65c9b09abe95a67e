"""``python -m sim COMMAND``: the entry point. It selects the compiled build when asked
(``SERVESIM_CORE=compiled``) before anything of the hot path is imported, then parses and
dispatches (``sim.cli.parser``), and reports bad input as an ``error:`` line with exit code 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sim.compiled import switch


def main(argv: Sequence[str] | None = None) -> int:
    try:
        switch.select(os.environ)
        # Imported only now: the command modules import the hot path, which the switch may
        # have just pointed at the compiled build.
        from sim.cli.parser import parse

        given = list(sys.argv[1:] if argv is None else argv)
        args = parse(given)
        args.argv = given
        return int(args.func(args))
    except (ValueError, OSError) as error:
        # Bad input (trace rows, configs, files) is reported, never a traceback.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        # A missing compiled build, or a command whose optional dependencies are absent.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report it
