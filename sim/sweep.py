"""Running many points: ``run_point`` simulates one (a worker's whole job), ``execute`` runs a list
of them on local processes (``-j N``) or Ray, and ``run_sweep`` adds resume, the per-point
folders and ``sweep.csv``. The ``sweep`` command's arguments and entry live here too."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from records.run_dir import write_run_dir
from records.sweep_table import write_sweep_csv
from sim.sweep_spec import (
    RATE,
    OptionValue,
    TraceSource,
    load_spec,
    point_argv,
    point_config,
    scale_trace,
)

SWEEP_KEY = "sweep_point"  # summary.json key holding the options a point ran with


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
    """What a worker sends back: the sweep.csv row and, on success, the run's files."""

    index: int
    row: dict[str, Any]
    files: tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def num_gpus(config: Any) -> int:
    """GPUs a deployment holds: TP times its replicas (both pools for disagg)."""
    replicas = (
        config.num_prefill + config.num_decode
        if config.policy == "disagg"
        else (config.num_replicas)
    )
    return int(config.tp * replicas)


def slo_attainment(summary: Mapping[str, Any]) -> float | None:
    """Share of all requests that finished within both SLOs (request_goodput × duration over
    num_requests; the count is rounded back to an integer)."""
    goodput, duration = summary.get("request_goodput"), summary.get("duration_s")
    total = summary.get("num_requests") or 0
    if goodput is None or duration is None or not total:
        return None
    return round(float(goodput) * float(duration)) / float(total)


_TRACE_CACHE: dict[tuple[str, float | None], Any] = {}


def _trace(source: TraceSource, rate: float | None) -> Any:
    """The point's trace: a file is read once per worker and time-scaled per rate; a generator
    runs again at each rate. Only the latest trace is kept, so memory stays flat."""
    described = json.dumps(source.describe(), sort_keys=True)
    key: tuple[str, float | None]
    if source.path is not None:
        key = (described, None)
        if key not in _TRACE_CACHE:
            _TRACE_CACHE.clear()
            _TRACE_CACHE[key] = source.load()
        base = _TRACE_CACHE[key]
        return base if rate is None else scale_trace(base, rate)
    key = (described, rate)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE.clear()
        _TRACE_CACHE[key] = source.load(rate)
    return _TRACE_CACHE[key]


def run_point(task: PointTask, keep_files: bool = True) -> PointOutput:
    """Simulate one point; any failure becomes the row's error, never an exception."""
    from sim.run import simulate

    options = dict(task.options)
    row: dict[str, Any] = {"point": task.index, "run_dir": task.folder, **options}
    try:
        config = point_config(options)
        row["num_gpus"] = num_gpus(config)
        rate = options.get(RATE)
        trace = _trace(task.source, float(rate) if rate is not None else None)
        result = simulate(trace, config)
    except Exception as error:  # a failing point is recorded; the sweep goes on
        last = traceback.extract_tb(error.__traceback__)[-1:]
        where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        row.update(status="error", error=f"{type(error).__name__}: {error}{where}")
        return PointOutput(task.index, row)
    row.update(status="ok", error="")
    if task.source.path and RATE not in options:
        # The same run by hand; a time-scaled trace has no file to name.
        source = task.source
        flags = ["--format", source.format] if source.format != "auto" else []
        flags += ["--on-error", source.on_error] if source.on_error != "raise" else []
        argv = ["python", "-m", "sim", "run", task.source.path, *flags, *point_argv(options)]
        result.command = shlex.join(argv)
    row.update(result.summary)
    row["slo_attainment"] = slo_attainment(result.summary)
    files = None
    if keep_files:
        payload = {**result.payload(), SWEEP_KEY: task.identity}
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
    return PointOutput(task.index, row)


def _local(tasks: Sequence[PointTask], jobs: int, keep: bool) -> Iterator[PointOutput]:
    if jobs == 1:
        for task in tasks:
            yield run_point(task, keep)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_point, task, keep): task for task in tasks}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as error:  # a worker died (killed, out of memory): record it
                yield lost_point(futures[future], error)


def _ray(tasks: Sequence[PointTask], address: str | None, keep: bool) -> Iterator[PointOutput]:
    try:
        import ray
    except ImportError as error:
        raise ValueError("--ray needs the ray extra: pip install -e '.[ray]'") from error
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(run_point)
        pending = [remote.remote(task, keep) for task in tasks]
        tasks_by_ref = dict(zip(pending, tasks, strict=True))
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                yield ray.get(done[0])
            except Exception as error:  # a worker or node died: record it
                yield lost_point(tasks_by_ref[done[0]], error)
    finally:
        if started:
            ray.shutdown()


def execute(
    tasks: Sequence[PointTask],
    jobs: int = 1,
    ray_address: str | None = None,
    use_ray: bool = False,
    keep_files: bool = True,
    progress: bool = False,
    on_output: Callable[[PointOutput], None] | None = None,
) -> list[PointOutput]:
    """Run every task (local processes, or Ray when ``use_ray``); outputs in task order."""
    stream = _ray(tasks, ray_address, keep_files) if use_ray else _local(tasks, jobs, keep_files)
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


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    rows: list[dict[str, Any]]
    option_names: list[str]
    num_resumed: int
    csv_path: Path


def run_sweep(
    spec_path: str | Path,
    out: str | Path,
    jobs: int = 1,
    use_ray: bool = False,
    ray_address: str | None = None,
    progress: bool = False,
) -> SweepOutcome:
    """Run every point of the spec not already complete under ``out``; write ``sweep.csv``."""
    spec = load_spec(spec_path)
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--out {root} exists and is not a directory")
    tasks = [
        PointTask(idx, tuple(point.items()), spec.source) for idx, point in enumerate(spec.points)
    ]
    resumed = [o for o in (resumed_output(t, root) for t in tasks) if o is not None]
    done = {o.index for o in resumed}
    todo = [t for t in tasks if t.index not in done]
    ran = execute(
        todo,
        jobs,
        ray_address,
        use_ray,
        keep_files=True,
        progress=progress,
        on_output=lambda output: _write_point(root, output),
    )
    rows = [o.row for o in sorted([*resumed, *ran], key=lambda o: o.index)]
    path = write_sweep_csv(root / "sweep.csv", spec.option_names, rows)
    return SweepOutcome(rows, spec.option_names, len(resumed), path)


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="local worker processes (default: 1; 0 means one per CPU core)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run points on Ray instead: no ADDRESS starts a local cluster, 'auto' joins a "
        "running one (needs pip install -e '.[ray]')",
    )


def resolve_jobs(jobs: int) -> int:
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
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary line")


def sweep_command(args: argparse.Namespace) -> int:
    outcome = run_sweep(
        args.spec,
        args.out,
        jobs=resolve_jobs(args.jobs),
        use_ray=args.ray is not None,
        ray_address=args.ray or None,
        progress=not args.quiet,
    )
    failed = [row for row in outcome.rows if row["status"] != "ok"]
    if not args.quiet:
        print(
            f"wrote {outcome.csv_path}: {len(outcome.rows)} points ({outcome.num_resumed} "
            f"resumed, {len(failed)} failed)"
        )
        for row in failed:
            print(f"  point {row['point']}: {row['error']}")
    if args.report:
        from reports.sweep import write_sweep_report

        path = write_sweep_report(outcome.csv_path, args.report)
        if not args.quiet:
            print(f"wrote report {path}")
    return 0
