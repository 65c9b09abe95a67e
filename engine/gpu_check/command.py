"""``python -m engine gpu-check``'s handler: what this engine and its tools offer (CUDA graphs,
a graph mode of ``kernels.bench``, pytest workers), the parts' environment, ``--dry-run`` (list
the parts and check each command's flags against its ``--help``) and the check itself."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from importlib import metadata, util
from pathlib import Path
from typing import Any

from engine.gpu_check.parts import ROOT, CheckSettings, Command, Part, environment_part, plan
from engine.gpu_check.run import Check, PartResult
from engine.gpu_check.summary import SUMMARY_MD, write_summary
from engine.gpu_check.telemetry import TELEMETRY_CSV, Telemetry

BUDGET_S = 480.0  # issue 29: the whole check in at most 8 minutes
ENTRY_POINT_GROUP = "servesim.commands"
FLAG = re.compile(r"^--?[A-Za-z][\w-]*")


def detect(out: Path, model: str, dtype: str, hardware: str | None) -> CheckSettings:
    """The settings of a check on this installation: whether the engine has CUDA graphs
    (``EngineConfig.enforce_eager``) and piecewise ones (``EngineConfig.mixed_graphs``),
    whether ``kernels.bench`` times in a CUDA graph (its help names graphs) and the flag for
    it (an option with "graph" in its name, if any), and pytest-xdist's workers."""
    from engine.llm_engine import EngineConfig

    bench = importlib.import_module("kernels.bench")  # untyped: its kernels' module
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        bench.parse_args(["--help"])
    flags = re.findall(r"--[\w-]*graph[\w-]*", text.getvalue())
    workers = min(8, (os.cpu_count() or 2) // 2) if util.find_spec("xdist") else 0
    return CheckSettings(
        out=out,
        model=model,
        dtype=dtype,
        hardware=hardware or "H100-SXM",
        graphs="enforce_eager" in EngineConfig.__dataclass_fields__,
        piecewise="mixed_graphs" in EngineConfig.__dataclass_fields__,
        bench_graphs="graph" in text.getvalue().lower(),
        bench_graph_flag=flags[0] if flags else None,
        pytest_workers=workers,
    )


def child_env(shim: Path) -> tuple[dict[str, str], str]:
    """The parts' environment: the project's sources on the path, Triton compiled
    (``TRITON_INTERPRET=0``) and, where servesim is not installed, its ``servesim.commands``
    entry point (``python -m sim calibrate`` and ``validate``) from a distribution folder of
    the check's own, written to ``shim``. Returns it and a note."""
    paths, note = [str(ROOT)], "installed"
    if not metadata.entry_points(group=ENTRY_POINT_GROUP):
        write_entry_point(shim)
        paths.insert(0, str(shim))
        note = f"servesim is not installed: its command entry point comes from {shim}"
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    # Compiled kernels: the kernel tests' conftest runs them interpreted unless told otherwise.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TRITON_INTERPRET": "0"}
    return env, note


def write_entry_point(folder: Path) -> None:
    """A distribution's metadata in ``folder`` naming fidelity's commands for ``python -m sim``
    (what ``pip install -e .`` would register), found through PYTHONPATH."""
    info = folder / "servesim_gpu_check-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: servesim-gpu-check\nVersion: 0.0.0\n"
    )
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfidelity = fidelity.cli\n")


def select(parts: list[Part], only: str | None, skip: str | None) -> list[Part]:
    """``parts`` limited to ``--only`` and without ``--skip`` (comma-separated names)."""
    names = {part.name for part in parts}
    chosen = parts
    for option, given in (("--only", only), ("--skip", skip)):
        if not given:
            continue
        wanted = {name.strip() for name in given.split(",") if name.strip()}
        unknown = sorted(wanted - names)
        if unknown:
            raise ValueError(f"{option}: no part named {unknown}; the parts: {sorted(names)}")
        keep = option == "--only"
        chosen = [part for part in chosen if (part.name in wanted) == keep]
    return chosen


def unknown_flags(args: tuple[str, ...], help_text: str) -> list[str]:
    """The flags among ``args`` that ``help_text`` does not list."""
    found = []
    for arg in args:
        match = FLAG.match(arg)
        if match is None:
            continue
        flag = match.group(0)
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text):
            found.append(flag)
    return found


def _help(argv: list[str], env: dict[str, str]) -> tuple[int | None, str]:
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    return done.returncode, done.stdout + done.stderr


def check_parts(parts: list[Part], python: str, env: dict[str, str]) -> dict[str, list[str]]:
    """Each part's problems: a missing input or command, or a flag its command does not know
    (every distinct ``--help`` is run once, in parallel)."""
    commands = {tuple(c.help_argv(python)) for part in parts for c in part.commands if c.args}
    with ThreadPoolExecutor(max_workers=4) as pool:
        helps = dict(zip(commands, pool.map(lambda a: _help(list(a), env), commands), strict=True))
    problems: dict[str, list[str]] = {}
    for part in parts:
        found = [f"input {path} missing" for path in part.inputs if not (ROOT / path).exists()]
        for command in part.commands:
            found += _command_problems(command, python, helps)
        problems[part.name] = found
    return problems


def _command_problems(
    command: Command, python: str, helps: dict[tuple[str, ...], tuple[int | None, str]]
) -> list[str]:
    head = command.head
    if head[0] == "-m" and util.find_spec(head[1]) is None:
        return [f"module {head[1]} not found"]
    if head[0] != "-m" and not (ROOT / head[0]).is_file():
        return [f"script {head[0]} not found"]
    if not command.args:
        return []
    code, text = helps[tuple(command.help_argv(python))]
    if code != 0:
        tail = " | ".join(text.strip().splitlines()[-2:])
        return [f"{shlex.join(command.help_argv(python))} failed: {tail}"]
    return [
        f"{shlex.join(head)}: unknown flag {flag}" for flag in unknown_flags(command.args, text)
    ]


def dry_run(
    settings: CheckSettings, parts: list[Part], env: dict[str, str], budget_s: float = BUDGET_S
) -> int:
    """List the parts with their commands and check them (against ``budget_s``, the run's
    ``--budget-s``); 1 if any has a problem."""
    problems = check_parts(parts, settings.python, env)
    total = sum(part.estimate_s for part in parts)
    print(
        f"gpu-check dry run: {len(parts)} parts, about {total:.0f} s in all, budget "
        f"{budget_s:.0f} s (parts that no longer fit are skipped, and the summary says so)"
    )
    print(
        f"engine CUDA graphs: {'yes' if settings.graphs else 'no'}; kernels.bench in a CUDA "
        f"graph: {'yes' if settings.bench_graphs else 'no'} (flag: "
        f"{settings.bench_graph_flag or 'none'}); pytest workers: {settings.pytest_workers}"
    )
    for part in parts:
        missing = [name for name in part.modules if util.find_spec(name) is None]
        state = "; ".join(problems[part.name]) or "ok"
        if missing:
            state += f" (would be skipped here: needs {', '.join(missing)})"
        print(f"{part.name:<34} ~{part.estimate_s:>4.0f} s, limit {part.limit_s:>4.0f} s  {state}")
        print(f"    {part.about}")
        for command in part.commands:
            print(f"    $ {shlex.join(command.argv('python'))}")
    bad = sum(1 for found in problems.values() if found)
    print(f"{bad} part(s) with problems" if bad else "every part's command checks out")
    return 1 if bad else 0


def run_gpu_check(args: argparse.Namespace) -> int:
    start_s = time.monotonic()  # the budget counts the set-up too
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a directory")
    settings = detect(out, args.model, args.dtype, args.hardware)
    parts = [environment_part(settings), *select(plan(settings), args.only, args.skip)]
    if args.dry_run:  # writes nothing under --out
        with tempfile.TemporaryDirectory() as shim:
            return dry_run(settings, parts, child_env(Path(shim))[0], args.budget_s)
    env, entry_point = child_env(out / ".entry-points")
    header: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "engine", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "budget_s": args.budget_s,
        "model": settings.model,
        "dtype": settings.dtype,
        "cuda_graphs": settings.graphs,
        "kernels_bench_graphs": settings.bench_graphs,
        "kernels_bench_graph_flag": settings.bench_graph_flag,
        "pytest_workers": settings.pytest_workers,
        "servesim_commands": entry_point,
    }
    check = Check(
        out, args.budget_s, settings.python, env,
        on_result=lambda results: write_summary(out, header, results), start_s=start_s,
    )  # fmt: skip
    with Telemetry(out) as telemetry:
        code = finish(check, settings, parts, header, args.hardware)
    spans = [(r.name, r.started_s, r.started_s + r.wall_s) for r in check.results if r.started_s]
    header["gpu_telemetry"] = telemetry.summary(spans)
    write_summary(out, header, check.results)
    sampled = header["gpu_telemetry"]
    print(
        f"GPU clocks sampled into {out / TELEMETRY_CSV}"
        if sampled["sampled"]
        else f"GPU clocks not sampled: {sampled['reason']}"
    )
    return code


def finish(
    check: Check,
    settings: CheckSettings,
    parts: list[Part],
    header: dict[str, Any],
    hardware: str | None,
) -> int:
    """``parts[0]``, the environment, first (it names the device, so the roofline's
    hardware), then the rest; prints the summary's table. 0 when no part failed or timed
    out."""
    (first,) = check.run(parts[:1])
    found = first.figures.get("hardware")
    if hardware is None and found and found != settings.hardware:
        settings = replace(settings, hardware=found)
        names = {part.name for part in parts}
        parts = [parts[0], *(part for part in plan(settings) if part.name in names)]
    if hardware is None:
        source = "from the device" if found else "the device matches no preset"
        header["hardware"] = f"{settings.hardware} ({source})"
    else:
        header["hardware"] = hardware
    if first.figures.get("device") == "cpu":
        header["note"] = "no CUDA device: the parts that need one fail"
    results = check.run(parts[1:])
    header["wall_s"] = round(time.monotonic() - check.start_s, 1)
    write_summary(check.out, header, results)
    _print_results(results, check.out)
    return 0 if all(r.status in ("passed", "skipped") for r in results) else 1


def _print_results(results: list[PartResult], out: Path) -> None:
    for r in results:
        print(f"{r.name:<34} {r.status:<9} {r.wall_s:>5.0f} s  {r.reason}")
    print(f"wrote {out / SUMMARY_MD} and summary.json")
