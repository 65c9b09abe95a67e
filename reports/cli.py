"""Command line for re-rendering saved runs: ``python -m sim report RUN_DIR [RUN_DIR ...] -o
out.html`` (mounted by sim/cli.py) or ``python -m reports.cli`` directly."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from records.run_dir import load_run
from reports.html import write_report


def add_report_command(commands: Any) -> None:
    """Register ``report`` on `commands` (what `add_subparsers` returned), as
    ``python -m sim report``."""
    report = commands.add_parser(
        "report", help="render saved runs (--out folders) as one HTML report"
    )
    add_report_arguments(report)
    report.set_defaults(func=run_report)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="directories written by `python -m sim run ... --out RUN_DIR` (summary.json, "
        "requests.csv, steps.csv); several are compared side by side",
    )
    parser.add_argument(
        "-o", "--output", required=True, help="HTML file to write (self-contained, opens offline)"
    )
    parser.add_argument("--title", default=None, help="page title (default: the runs' labels)")
    parser.add_argument(
        "--label",
        action="append",
        default=None,
        help="name of a run in legends and tables, once per RUN_DIR in order "
        "(default: policy / memory model)",
    )


def run_report(args: argparse.Namespace) -> int:
    labels = args.label or []
    if labels and len(labels) != len(args.run_dirs):
        raise ValueError(
            f"--label must be given once per RUN_DIR ({len(args.run_dirs)}), got {len(labels)}"
        )
    runs = [
        load_run(run_dir, labels[idx] if labels else None)
        for idx, run_dir in enumerate(args.run_dirs)
    ]
    path = write_report(runs, args.output, title=args.title)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reports.cli",
        description="Render saved servesim runs as one self-contained HTML report.",
    )
    add_report_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_report(args)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
