"""Running many points: ``run_point`` simulates one (a worker's whole job), ``execute`` runs a list
of them on local processes (``-j N``) or Ray, and ``run_sweep`` adds resume, the per-point
folders and ``sweep.csv``. The ``sweep`` command's arguments and entry live here too."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from records.run_dir import write_run_dir
from records.sweep_table import points_text, write_sweep_csv
from sim.experiments.point_row import num_gpus, point_judgement, slo_attainment
from sim.experiments.sweep_spec import (
    RATE,
    REPEATS,
    TRACE_OPTIONS,
    OptionValue,
    TraceSource,
    load_spec,
    point_argv,
    point_config,
    repeat_trace,
    scale_trace,
    unused_in_points,
)

SWEEP_KEY = "sweep_point"  # summary.json key holding the options a point ran with
JUDGED_KEY = "sweep_judgement"  # summary.json key holding `point_judgement` (for resume)


@dataclass(frozen=True, slots=True)
class PointTask:
    """One point to run: its index, options and the trace source they apply to."""

    index: int
    options: tuple[tuple[str, OptionValue], ...]
    source: TraceSource

    @property
    def identity(self) -> dict[str, Any]:
        """What makes two points the same run (compared on resume)."""
        return {"options": dict(self.options), "source": self.source.describe()}

    @property
    def folder(self) -> str:
        digest = hashlib.sha1(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()
        return f"points/{digest[:12]}"


@dataclass
class PointOutput:
    """What a worker sends back: the sweep.csv row, on success the run's files, and facts about
    the run itself that are not results (``extra``: ``cpu_s``)."""

    index: int
    row: dict[str, Any]
    files: tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_TRACE_CACHE: dict[tuple[str, float | None], Any] = {}


def _trace(source: TraceSource, rate: float | None, repeats: int = 1) -> Any:
    """The point's trace: a file is read once per worker, repeated and time-scaled per point; a
    generator runs again at each rate. Only the latest trace is kept, so memory stays flat."""
    described = json.dumps(source.describe(), sort_keys=True)
    key: tuple[str, float | None]
    if source.path is not None:
        key = (described, None)
        if key not in _TRACE_CACHE:
            _TRACE_CACHE.clear()
            _TRACE_CACHE[key] = source.load()
        base = repeat_trace(_TRACE_CACHE[key], repeats)
        return base if rate is None else scale_trace(base, rate)
    key = (described, rate)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE.clear()
        _TRACE_CACHE[key] = source.load(rate)
    return repeat_trace(_TRACE_CACHE[key], repeats)


def run_point(task: PointTask, keep_files: bool = True) -> PointOutput:
    """Simulate one point; any failure becomes the row's error, never an exception. The
    worker's CPU seconds for it go in ``extra["cpu_s"]`` (never in a row: rows are compared
    byte for byte)."""
    cpu_start_s = time.process_time()
    output = _run_point(task, keep_files)
    output.extra["cpu_s"] = time.process_time() - cpu_start_s
    return output


def _run_point(task: PointTask, keep_files: bool) -> PointOutput:
    from sim.run import simulate

    options = dict(task.options)
    row: dict[str, Any] = {"point": task.index, "run_dir": task.folder, **options}
    try:
        config = point_config(options)
        row["num_gpus"] = num_gpus(config)
        rate = options.get(RATE)
        repeats = int(options.get(REPEATS, 1))
        trace = _trace(task.source, float(rate) if rate is not None else None, repeats)
        result = simulate(trace, config)
    except Exception as error:  # a failing point is recorded; the sweep goes on
        last = traceback.extract_tb(error.__traceback__)[-1:]
        where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        row.update(status="error", error=f"{type(error).__name__}: {error}{where}")
        return PointOutput(task.index, row)
    row.update(status="ok", error="")
    if task.source.path and not any(name in options for name in TRACE_OPTIONS):
        # The same run by hand; a time-scaled trace has no file to name.
        source = task.source
        flags = ["--format", source.format] if source.format != "auto" else []
        flags += ["--on-error", source.on_error] if source.on_error != "raise" else []
        argv = ["python", "-m", "sim", "run", task.source.path, *flags, *point_argv(options)]
        result.command = shlex.join(argv)
    row.update(result.summary)
    row["slo_attainment"] = slo_attainment(result.summary)
    judged = point_judgement(result)
    row.update(judged)
    files = None
    if keep_files:
        payload = {**result.payload(), SWEEP_KEY: task.identity, JUDGED_KEY: judged}
        files = (result.requests_frame(), result.steps.to_frame(), payload)
    return PointOutput(task.index, row, files)


def lost_point(task: PointTask, error: BaseException) -> PointOutput:
    """The row of a point whose worker died before it could report."""
    row: dict[str, Any] = {"point": task.index, "run_dir": task.folder, **dict(task.options)}
    row.update(status="error", error=f"worker lost: {type(error).__name__}: {error}")
    return PointOutput(task.index, row)


def resumed_output(task: PointTask, out: Path) -> PointOutput | None:
    """The row of a point whose folder already holds a complete summary.json for the same
    options, or None (missing, unreadable or different options: run it again)."""
    path = out / task.folder / "summary.json"
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get(SWEEP_KEY) != json.loads(
        json.dumps(task.identity)
    ):
        return None
    summary = payload.get("summary")
    if not isinstance(summary, dict):
        return None
    options = dict(task.options)
    row: dict[str, Any] = {"point": task.index, "run_dir": task.folder, **options}
    row.update(status="ok", error="", num_gpus=num_gpus(point_config(options)))
    row.update(summary)
    row["slo_attainment"] = slo_attainment(summary)
    judged = payload.get(JUDGED_KEY)
    if not isinstance(judged, dict):  # a point run before rows were judged: run it again
        return None
    row.update(judged)
    return PointOutput(task.index, row)


class Workers:
    """Where points run: ``num_workers`` at a time, in this process (one worker), in local
    processes or on Ray. Opened once by ``open_workers`` and reused for every batch, so that a
    capacity search's rounds pay for start-up (a process pool, a Ray instance) once."""

    num_workers: int = 1

    def run(self, tasks: Sequence[PointTask], keep: bool) -> Iterator[PointOutput]:
        for task in tasks:
            yield run_point(task, keep)


class LocalWorkers(Workers):
    """``jobs`` local worker processes; each keeps the latest trace it read between points."""

    def __init__(self, pool: ProcessPoolExecutor, jobs: int) -> None:
        self.pool, self.num_workers = pool, jobs

    def run(self, tasks: Sequence[PointTask], keep: bool) -> Iterator[PointOutput]:
        futures = {self.pool.submit(run_point, task, keep): task for task in tasks}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as error:  # a worker died (killed, out of memory): record it
                yield lost_point(futures[future], error)


class RayWorkers(Workers):
    """Points as Ray tasks (one CPU each); results come back to the driver as objects."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.remote = ray.remote(num_cpus=1)(run_point)
        self.num_workers = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def run(self, tasks: Sequence[PointTask], keep: bool) -> Iterator[PointOutput]:
        pending = [self.remote.remote(task, keep) for task in tasks]
        tasks_by_ref = dict(zip(pending, tasks, strict=True))
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            try:
                yield self.ray.get(done[0])
            except Exception as error:  # a worker or node died: record it
                yield lost_point(tasks_by_ref[done[0]], error)


LOCAL_RAY = "local"  # ``--ray`` with no address: always a fresh local instance, never a joined one


@contextmanager
def open_workers(
    jobs: int | None = None, use_ray: bool = False, ray_address: str | None = None
) -> Iterator[Workers]:
    """Workers for ``execute``: ``jobs`` local processes (None or 1: this process), or Ray at
    ``ray_address`` (None: start a local instance, with ``jobs`` CPUs when given; ``auto``:
    join the running cluster). A Ray session this opened is shut down on exit."""
    if use_ray:
        yield from _ray_workers(jobs, ray_address or LOCAL_RAY)
    elif jobs is None or jobs == 1:
        yield Workers()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            yield LocalWorkers(pool, jobs)


RAY_CONNECT_TIMEOUT_S = 5.0


def check_ray_address(address: str) -> None:
    """Fail fast on a HOST:PORT nobody listens at: ``ray.init`` retries such an address for
    many minutes before giving up. ``local``, ``auto`` and ``ray://`` (client) addresses are
    left to Ray."""
    if address in (LOCAL_RAY, "auto") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--ray {address!r}: give HOST:PORT, 'auto', or nothing")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise ValueError(f"--ray {address!r}: no Ray cluster answers there ({error})") from error


def _ray_workers(jobs: int | None, address: str) -> Iterator[Workers]:
    try:
        import ray
    except ImportError as error:
        raise ValueError("--ray needs the ray extra: pip install -e '.[ray]'") from error
    check_ray_address(address)
    started = not ray.is_initialized()
    if started:
        # num_cpus only applies to an instance this starts; a cluster has its own.
        cpus = jobs if address == LOCAL_RAY else None
        try:
            ray.init(address=address, num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        except Exception as error:  # no cluster at that address, or it would not start
            where = "start a local instance" if address == LOCAL_RAY else f"join {address!r}"
            raise ValueError(f"--ray: could not {where}: {error}") from error
    try:
        yield RayWorkers(ray)
    finally:
        if started:
            ray.shutdown()


def execute(
    tasks: Sequence[PointTask],
    workers: Workers | None = None,
    keep_files: bool = True,
    progress: bool = False,
    on_output: Callable[[PointOutput], None] | None = None,
) -> list[PointOutput]:
    """Run every task on ``workers`` (default: in this process); outputs in task order."""
    stream = (workers or Workers()).run(tasks, keep_files)
    bar = tqdm(total=len(tasks), unit="point", disable=not (progress and sys.stderr.isatty()))
    outputs: list[PointOutput] = []
    for output in stream:
        if on_output is not None:
            on_output(output)
        outputs.append(output)
        bar.update(1)
    bar.close()
    return sorted(outputs, key=lambda o: o.index)


def _write_point(out: Path, output: PointOutput) -> None:
    if output.files is not None:
        requests, steps, payload = output.files
        write_run_dir(out / output.row["run_dir"], requests, steps, payload)
        output.files = None  # the driver keeps rows only


def _arrived(root: Path, output: PointOutput, hook: Callable[[PointOutput], None] | None) -> None:
    if hook is not None:
        hook(output)
    _write_point(root, output)


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    rows: list[dict[str, Any]]
    option_names: list[str]
    num_resumed: int
    csv_path: Path


def run_sweep(
    spec_path: str | Path,
    out: str | Path,
    jobs: int | None = None,
    use_ray: bool = False,
    ray_address: str | None = None,
    progress: bool = False,
    on_output: Callable[[PointOutput], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> SweepOutcome:
    """Run every point of the spec not already complete under ``out``; write ``sweep.csv``.
    ``jobs``, ``use_ray`` and ``ray_address`` choose the workers, as ``open_workers``;
    ``on_output`` sees each point that ran as it arrives (before its files are written);
    ``on_note``, before anything runs, each option some points (or the ``[generator]``) give
    and never read. A spec that lists one point twice is refused before anything runs."""
    spec = load_spec(spec_path)
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--out {root} exists and is not a directory")
    tasks = [
        PointTask(idx, tuple(point.items()), spec.source) for idx, point in enumerate(spec.points)
    ]
    _refuse_repeated_points(spec_path, tasks)
    if on_note is not None:
        for note in [*spec.source.unused_options(), *unused_in_points(spec.points)]:
            on_note(note)
    resumed = [o for o in (resumed_output(t, root) for t in tasks) if o is not None]
    done = {o.index for o in resumed}
    todo = [t for t in tasks if t.index not in done]
    ran: list[PointOutput] = []
    if todo:  # a finished sweep starts no workers (no Ray instance for nothing)
        with open_workers(jobs, use_ray, ray_address) as workers:
            ran = execute(
                todo,
                workers,
                keep_files=True,
                progress=progress,
                on_output=lambda output: _arrived(root, output, on_output),
            )
    rows = [o.row for o in sorted([*resumed, *ran], key=lambda o: o.index)]
    path = write_sweep_csv(root / "sweep.csv", spec.option_names, rows)
    return SweepOutcome(rows, spec.option_names, len(resumed), path)


def _refuse_repeated_points(spec_path: str | Path, tasks: Sequence[PointTask]) -> None:
    """Two points with the same options are one run, which would be run twice into one folder
    (at once, with ``-j``); a spec that lists one twice is refused."""
    first: dict[str, int] = {}
    for task in tasks:
        earlier = first.setdefault(task.folder, task.index)
        if earlier != task.index:
            raise ValueError(
                f"{spec_path}: points {earlier} and {task.index} are the same run "
                f"({dict(task.options)}); list it once"
            )


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=None,
        help="worker processes (default: 1, in this process; 0 means one per CPU core). With "
        "--ray it caps the CPUs of the local Ray instance it starts (default: every core)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run points on Ray instead: no ADDRESS starts a local instance, 'auto' joins the "
        "running cluster, HOST:PORT joins that one (needs pip install -e '.[ray]')",
    )


def resolve_jobs(jobs: int | None) -> int | None:
    """``--jobs`` checked: 0 becomes the number of CPU cores; None (not given) stays None."""
    if jobs is None:
        return None
    if jobs < 0:
        raise ValueError(f"--jobs must be >= 0, got {jobs}")
    return jobs or (os.cpu_count() or 1)


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep spec (TOML; see docs/sweep.md)")
    parser.add_argument(
        "--out", required=True, help="folder for sweep.csv and one points/<id>/ folder per point"
    )
    add_executor_arguments(parser)
    parser.add_argument("--report", default=None, help="write the sweep's HTML report here")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar, summary line or table (failed points are still named on stderr)",
    )


def sweep_command(args: argparse.Namespace) -> int:
    """Run the sweep; 0 when every point ran, 1 when some failed (each named on stderr, with
    or without --quiet), 2 on bad input (raised, for ``sim.cli.main`` to report)."""
    if args.report and Path(args.report).is_dir():
        raise ValueError(f"--report {args.report}: is a directory; give an .html file name")
    outcome = run_sweep(
        args.spec,
        args.out,
        jobs=resolve_jobs(args.jobs),
        use_ray=args.ray is not None,
        ray_address=args.ray or None,
        progress=not args.quiet,
        on_note=lambda note: print(f"note: {note}; it has no effect there", file=sys.stderr),
    )
    failed = [row for row in outcome.rows if row["status"] != "ok"]
    if not args.quiet:
        print(
            f"wrote {outcome.csv_path}: {len(outcome.rows)} points ({outcome.num_resumed} "
            f"resumed, {len(failed)} failed)"
        )
        print(points_text(outcome.option_names, outcome.rows))
    if args.report:
        from reports.sweep import write_sweep_report

        path = write_sweep_report(outcome.csv_path, args.report)
        if not args.quiet:
            print(f"wrote report {path}")
    for row in failed:
        options = {name: row[name] for name in outcome.option_names if name in row}
        print(f"error: point {row['point']} {options}: {row['error']}", file=sys.stderr)
    if failed:
        print(
            f"error: {len(failed)} of {len(outcome.rows)} points failed (status error in "
            f"{outcome.csv_path}); they run again when the sweep is resumed",
            file=sys.stderr,
        )
    return 1 if failed else 0
