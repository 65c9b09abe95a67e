"""The options about a run's outputs that ``python -m sim run`` and ``python -m engine run``
share: where its records go (``--out``), the goodput SLOs its summary counts against
(``--slo-ttft``, ``--slo-tpot``), an HTML report (``--report``) and ``--quiet``."""

from __future__ import annotations

import argparse
import math
from typing import Any

from core.flags import checked_type


def _positive(value: Any) -> str | None:
    return None if 0 < value < math.inf else f"must be > 0, got {value!r}"


def add_slo_arguments(parser: argparse.ArgumentParser) -> None:
    """``--slo-ttft`` and ``--slo-tpot`` in ms; `slo_s` turns them into the configs' seconds."""
    for flag, metric in (("--slo-ttft", "TTFT"), ("--slo-tpot", "TPOT")):
        parser.add_argument(
            flag,
            type=checked_type(float, _positive),
            default=None,
            metavar="MS",
            help=f"{metric} SLO in ms: goodput counts the requests that meet every SLO given",
        )


def slo_s(slo_ms: float | None) -> float | None:
    """An ``--slo-*`` value in seconds; None (no SLO) stays None."""
    return None if slo_ms is None else slo_ms / 1000.0


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``, where a run writes its records."""
    parser.add_argument(
        "--out", default=None, help="write requests.csv, steps.csv, summary.json here"
    )


def add_report_and_quiet_arguments(parser: argparse.ArgumentParser) -> None:
    """``--report FILE`` and ``--quiet``."""
    parser.add_argument(
        "--report", default=None, help="write a self-contained HTML report to this file"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")
