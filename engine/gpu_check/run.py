"""Running the GPU check's parts (``Check``): each in its own processes with a log, stopped at
its limit or at the end of the budget, never stopping the check; a part is skipped, and says
why, when a module it needs is missing, a part it needs did not pass, an input is missing or
its estimate no longer fits the budget. The summary is rewritten after every part."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import util
from pathlib import Path
from typing import Any

from engine.gpu_check.figures import LOG_FILE
from engine.gpu_check.parts import ROOT, Part

STATUSES = ("passed", "failed", "timed out", "skipped")
# Kept back from the budget: a stopped part's process group gets KILL_GRACE_S after SIGTERM
# and again after SIGKILL, and the summary is written last.
KILL_GRACE_S = 5.0
SUMMARY_RESERVE_S = 2 * KILL_GRACE_S + 5.0


@dataclass(frozen=True, slots=True)
class PartResult:
    """What one part did: its status (one of ``STATUSES``), why (for any but ``passed``),
    its wall time, its commands as run, its log (relative to the check's folder) and what it
    measured."""

    name: str
    about: str
    status: str
    wall_s: float = 0.0
    reason: str = ""
    returncode: int | None = None
    commands: tuple[str, ...] = ()
    log: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    # When it started, in Unix seconds (0 if skipped): places it among the GPU's samples.
    started_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"PartResult.status must be one of {STATUSES}, got {self.status!r}")


# How a command runs: (argv, log file, timeout_s, environment) -> exit code, None on timeout.
Launcher = Callable[[list[str], Path, float, dict[str, str]], "int | None"]


def launch(argv: list[str], log: Path, timeout_s: float, env: dict[str, str]) -> int | None:
    """Run ``argv`` from the project root, its output appended to ``log``; past ``timeout_s``
    its process group is stopped (SIGTERM, then SIGKILL) and None returned."""
    with log.open("a") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return process.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            _stop(process)
            out.write(f"\n[gpu-check: stopped after {timeout_s:.0f} s]\n")
            return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(path: Path, num_lines: int = 3) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    return " | ".join([line for line in lines if line][-num_lines:])


class Check:
    """Runs parts in order within ``budget_s`` seconds (on ``clock``, from ``start_s``, by
    default now), writing each into ``out/<name>/``; ``on_result`` sees each result as it
    comes (the summary's writer)."""

    def __init__(
        self,
        out: Path,
        budget_s: float,
        python: str,
        env: dict[str, str],
        launcher: Launcher = launch,
        clock: Callable[[], float] = time.monotonic,
        on_result: Callable[[list[PartResult]], None] | None = None,
        start_s: float | None = None,
    ) -> None:
        self.out, self.budget_s, self.python, self.env = out, budget_s, python, env
        self.launcher, self.clock = launcher, clock
        self.on_result = on_result or (lambda _: None)
        self.start_s = clock() if start_s is None else start_s
        self.results: list[PartResult] = []

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.start_s) - SUMMARY_RESERVE_S

    def run(self, parts: Sequence[Part]) -> list[PartResult]:
        for part in parts:
            reason = self.why_skip(part)
            if reason:
                result = PartResult(part.name, part.about, "skipped", reason=reason)
            else:
                result = self.run_part(part)
            self.results.append(result)
            self.on_result(self.results)
        return self.results

    def why_skip(self, part: Part) -> str:
        missing = [name for name in part.modules if util.find_spec(name) is None]
        if missing:
            return f"needs {', '.join(missing)} (not installed)"
        passed = {r.name for r in self.results if r.status == "passed"}
        failed = [name for name in part.after if name not in passed]
        if failed:
            return f"needs {', '.join(failed)} to have passed"
        absent = [path for path in part.inputs if not (ROOT / path).exists()]
        if absent:
            return f"input {', '.join(absent)} missing"
        left = self.left_s()
        if part.estimate_s > left:
            return f"needs about {part.estimate_s:.0f} s, {max(0.0, left):.0f} s of the budget left"
        return ""

    def run_part(self, part: Part) -> PartResult:
        folder = self.out / part.name
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / LOG_FILE
        log.write_text("")
        argvs = [command.argv(self.python) for command in part.commands]
        started_s = time.time()
        start = self.clock()
        deadline = start + min(part.limit_s, self.left_s())
        status, code, reason = "passed", None, ""
        for argv in argvs:
            try:
                code = self.launcher(argv, log, deadline - self.clock(), self.env)
            except OSError as error:
                status, reason = "failed", f"could not start {argv[0]}: {error}"
                break
            if code is None:
                status, reason = "timed out", f"stopped at {deadline - start:.0f} s"
                break
            if code != 0 and status == "passed":
                status, reason = "failed", f"exit code {code}: {log_tail(log)}"
            if code != 0 and not part.keep_going:
                break
        figures: dict[str, Any] = {}
        if status != "timed out" and part.read is not None:
            # A failed part may still have measured something (the tests' counts, say).
            try:
                figures = part.read(folder)
            except (OSError, ValueError, KeyError, TypeError) as error:
                if status == "passed":
                    status, reason = "failed", f"results: {error}"
        return PartResult(
            part.name, part.about, status, self.clock() - start, reason, code,
            tuple(shlex.join(argv) for argv in argvs), str(log.relative_to(self.out)), figures,
            started_s,
        )  # fmt: skip
