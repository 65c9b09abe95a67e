"""Problems found while reading a trace file, and the named error that carries them.

Stdlib only: the schema and every loader report bad input through these two types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_LISTED_PROBLEMS = 20


@dataclass(frozen=True, slots=True)
class TraceProblem:
    """One bad row (or header) of a trace file: where it is and what is wrong with it.

    `line` is the 1-based physical line number in the file (a CSV header is line 1).
    `field` names the column (or JSON key) at fault, or `header`/`row`/`json` for whole-line
    problems.
    """

    path: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.message}"


class TraceFormatError(ValueError):
    """A trace file could not be loaded; `problems` lists every problem found, in file order."""

    def __init__(self, path: str, problems: Iterable[TraceProblem], summary: str = "") -> None:
        self.path = path
        self.problems: list[TraceProblem] = list(problems)
        self.summary = summary
        super().__init__(format_problems(path, self.problems, summary))


def format_problems(path: str, problems: list[TraceProblem], summary: str = "") -> str:
    """Render the first `MAX_LISTED_PROBLEMS` problems and a count of the rest, one per line."""
    head = summary or f"{len(problems)} problem(s) in trace file {path}"
    lines = [head + ":"] if problems else [head]
    lines += [f"  {problem}" for problem in problems[:MAX_LISTED_PROBLEMS]]
    num_rest = len(problems) - MAX_LISTED_PROBLEMS
    if num_rest > 0:
        lines.append(f"  ... and {num_rest} more problem(s) not listed")
    return "\n".join(lines)
