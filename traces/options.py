"""Argparse types for the numeric options of every command line (``trace``, ``run``,
``compare``): each refuses NaN, infinities and out-of-range values with a message argparse
prints as ``error: argument --option: ...`` (exit code 2). And the trace options that every
command replaying a trace takes (`add_trace_arguments`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from traces.loaders import FORMATS
from traces.rows import ON_ERROR_CHOICES


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _bounded(
    kind: type[int] | type[float], low: float, low_inclusive: bool, high: float | None = None
) -> Callable[[str], float]:
    """A type accepting ``kind`` values above ``low`` (or equal, if inclusive), up to ``high``."""
    bound = f"{'>=' if low_inclusive else '>'} {low:g}"
    if high is not None:
        bound = f"in {'[' if low_inclusive else '('}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        value = _number(text, kind)
        too_low = value < low if low_inclusive else value <= low
        if too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
        return value

    return parse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return int(_POSITIVE_INT(text))


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return int(_NON_NEGATIVE_INT(text))


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _POSITIVE_FLOAT(text)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _NON_NEGATIVE_FLOAT(text)


def fraction(text: str) -> float:
    """A share in (0, 1]."""
    return _FRACTION(text)


_POSITIVE_INT = _bounded(int, 1, True)
_NON_NEGATIVE_INT = _bounded(int, 0, True)
_POSITIVE_FLOAT = _bounded(float, 0, False)
_NON_NEGATIVE_FLOAT = _bounded(float, 0, True)
_FRACTION = _bounded(float, 0, False, 1.0)


def add_trace_arguments(parser: argparse.ArgumentParser, check_format: bool = True) -> None:
    """``TRACE``, ``--format`` and ``--on-error``. `check_format` False leaves the format name
    to the trace loader instead of argparse's choices."""
    parser.add_argument(
        "trace",
        help="trace file (servesim CSV, Vidur CSV, Azure CSV, Mooncake JSONL, BurstGPT CSV)",
    )
    parser.add_argument(
        "--format",
        default="auto",
        choices=["auto", *sorted(FORMATS)] if check_format else None,
        help="trace format (default: detect from the header)",
    )
    parser.add_argument(
        "--on-error",
        default="raise",
        choices=ON_ERROR_CHOICES,
        help="bad trace rows: raise fails listing every one (file, line, field); skip leaves "
        "them out and the summary counts them (default: %(default)s)",
    )
