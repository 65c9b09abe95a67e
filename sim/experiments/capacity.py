"""Capacity search: the highest arrival rate at which at least a share ``goodput`` of requests
meets both SLOs. ``find_capacity`` brackets the rate by doubling or halving, then bisects it (in
rounds of as many probes as there are workers) to a relative tolerance; every probe is one run
through the sweep executors. The ``capacity`` command lives here too."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from records.sweep_table import write_sweep_csv
from sim.experiments.sweep import (
    PointOutput,
    PointTask,
    Workers,
    _write_point,
    execute,
    open_workers,
    resolve_jobs,
    resumed_output,
)
from sim.experiments.sweep_spec import NOT_SWEPT, RATE, OptionValue, TraceSource, load_spec

DEFAULT_GOODPUT = 0.9
DEFAULT_REL_TOL = 0.02
MAX_DOUBLINGS = 30  # 2^30 × the start rate: past that the SLOs do not bind the rate at all


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """What "meets the SLOs" means and how finely to search."""

    goodput: float = DEFAULT_GOODPUT
    rel_tol: float = DEFAULT_REL_TOL
    start_rate: float | None = None  # None: the trace's own mean rate

    def __post_init__(self) -> None:
        if not 0 < self.goodput <= 1:
            raise ValueError(f"goodput must be in (0, 1], got {self.goodput!r}")
        if not 0 < self.rel_tol < 1:
            raise ValueError(f"rel_tol must be in (0, 1), got {self.rel_tol!r}")
        if self.start_rate is not None and not self.start_rate > 0:
            raise ValueError(f"start_rate must be > 0 req/s, got {self.start_rate!r}")


@dataclass
class CapacityResult:
    """The bracket ``[low_rate, high_rate]``: ``low_rate`` passed, ``high_rate`` failed (None:
    none failed, or none passed for ``low_rate``)."""

    low_rate: float | None = None
    high_rate: float | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def capacity_rate(self) -> float | None:
        """The highest passing rate below the lowest failure; None when the search failed."""
        return None if self.error else self.low_rate


Runner = Callable[[list[float]], list[PointOutput]]
# A search is a generator: it yields the rates it wants probed, is sent their rows (in the same
# order) and returns its result, so that many searches can share one batch of probes per round.
Search = Generator[list[float], list[dict[str, Any]], CapacityResult]
Asks = Generator[list[float], list[dict[str, Any]], list[bool]]


def passes(row: Mapping[str, Any], goodput: float) -> bool:
    """A probe passes when it ran and its SLO attainment reaches ``goodput``."""
    attained = row.get("slo_attainment")
    return row.get("status") == "ok" and attained is not None and float(attained) >= goodput


def _probe(rates: list[float], result: CapacityResult, goodput: float) -> Asks:
    rows = yield rates
    for row in rows:
        if row.get("status") != "ok":
            raise ValueError(f"probe at {row.get(RATE)} req/s failed: {row.get('error')}")
        result.probes.append(row)
    return [passes(row, goodput) for row in rows]


def _bracket(start: float, width: int, result: CapacityResult, goodput: float) -> Asks:
    first = (yield from _probe([start], result, goodput))[0]
    factor = 2.0 if first else 0.5
    result.low_rate, result.high_rate = (start, None) if first else (None, start)
    for step in range(1, MAX_DOUBLINGS + 1, width):
        rates = [start * factor**k for k in range(step, min(step + width, MAX_DOUBLINGS + 1))]
        oks = yield from _probe(rates, result, goodput)
        for rate, ok in zip(rates, oks, strict=True):
            if ok and first:
                result.low_rate = rate
            elif not ok and first:
                result.high_rate = rate
                return []
            elif ok:  # going down: the first pass closes the bracket
                result.low_rate = rate
                return []
            else:
                result.high_rate = rate
    limit = start * factor**MAX_DOUBLINGS
    raise ValueError(
        f"no bracket: every rate {'up to' if first else 'down to'} {limit:.6g} req/s "
        f"{'meets' if first else 'misses'} the SLOs"
    )


def search(start: float, settings: SearchSettings, width: int) -> Search:
    """Bracket then bisect, ``width`` probes per round (doublings, or rates splitting the
    bracket geometrically)."""
    if width < 1:
        raise ValueError(f"width must be >= 1 probe per round, got {width}")
    result = CapacityResult()
    try:
        yield from _bracket(start, width, result, settings.goodput)
        while True:
            low, high = result.low_rate, result.high_rate
            assert low is not None and high is not None
            if (high - low) / low <= settings.rel_tol:
                return result
            # Geometric split: the bracket spans up to a factor of two.
            rates = [low * (high / low) ** (j / (width + 1)) for j in range(1, width + 1)]
            oks = yield from _probe(rates, result, settings.goodput)
            for rate, ok in zip(rates, oks, strict=True):
                if ok:
                    result.low_rate = rate
                else:
                    result.high_rate = rate
                    break
    except ValueError as error:
        result.error = str(error)
        return result


Prober = Callable[[list[tuple[int, float]]], list[dict[str, Any]]]


def run_searches(searches: Sequence[Search], probe: Prober) -> list[CapacityResult]:
    """Drive every search to its end; each round sends all their asks to ``probe`` at once as
    (search index, rate) pairs, so that C searches keep C × width workers busy."""
    results: dict[int, CapacityResult] = {}
    asks: dict[int, list[float]] = {}

    def advance(idx: int, rows: list[dict[str, Any]] | None) -> None:
        try:
            asks[idx] = searches[idx].send(rows)  # type: ignore[arg-type]  # None starts it
        except StopIteration as stop:
            results[idx] = stop.value

    for idx in range(len(searches)):
        advance(idx, None)
    while asks:
        current = dict(asks)
        asks.clear()
        rows = iter(probe([(idx, rate) for idx, rates in current.items() for rate in rates]))
        for idx, rates in current.items():
            advance(idx, [next(rows) for _ in rates])
    return [results[idx] for idx in range(len(searches))]


def find_capacity(
    run: Runner, start: float, settings: SearchSettings, width: int
) -> CapacityResult:
    """One search; ``run`` simulates a list of rates and returns their outputs."""

    def probe(batch: list[tuple[int, float]]) -> list[dict[str, Any]]:
        return [output.row for output in run([rate for _, rate in batch])]

    return run_searches([search(start, settings, width)], probe)[0]


class ProbeRunner:
    """Runs probes as sweep points on ``workers``, each at most once: a probe whose options
    (configuration plus rate) were already run in this search, or whose folder under ``out``
    holds a complete run with those options, is read back instead of run again."""

    def __init__(
        self,
        source: TraceSource,
        configs: Sequence[Mapping[str, OptionValue]],
        workers: Workers,
        out: Path | None,
    ) -> None:
        self.source, self.configs, self.workers, self.out = source, configs, workers, out
        self.cache: dict[str, dict[str, Any]] = {}
        self.num_run = self.num_reused = 0

    def __call__(self, batch: list[tuple[int, float]]) -> list[dict[str, Any]]:
        keys: list[str] = []
        todo: dict[str, PointTask] = {}
        for config_idx, rate in batch:
            options = {**self.configs[config_idx], RATE: rate}
            task = PointTask(
                len(self.cache) + len(todo), tuple(sorted(options.items())), self.source
            )
            key = json.dumps(task.identity, sort_keys=True)
            keys.append(key)
            if key in self.cache or key in todo:
                self.num_reused += 1
                continue
            resumed = resumed_output(task, self.out) if self.out is not None else None
            if resumed is not None:
                self.cache[key] = resumed.row
                self.num_reused += 1
            else:
                todo[key] = task
        out = self.out
        outputs = execute(
            list(todo.values()),
            self.workers,
            keep_files=out is not None,
            on_output=(lambda o: _write_point(out, o)) if out is not None else None,
        )
        self.num_run += len(outputs)
        self.cache.update(zip(todo, (o.row for o in outputs), strict=True))
        rows = []
        for (config_idx, _), key in zip(batch, keys, strict=True):
            rows.append({**self.cache[key], "config": config_idx})
        return rows


def _cli_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The run options given on the command line (those that differ from their defaults)."""
    options: dict[str, Any] = {}
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest in NOT_SWEPT or dest in CAPACITY_DESTS:
            continue
        value = getattr(args, dest, None)
        if value is not None and value != action.default:
            options[dest] = value
    return options


CAPACITY_DESTS = frozenset(
    {"help", "goodput", "rate_tol", "start_rate", "sweep", "jobs", "ray", "slo_ttft", "slo_tpot"}
)


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    from sim.cli.options import add_run_arguments

    add_run_arguments(parser)
    for action in parser._actions:
        if action.dest == "trace":
            action.nargs = "?"  # --sweep's spec may name the trace instead
            action.help = "trace file (any supported format); with --sweep, the spec's [trace]"
        if action.dest == "out":
            action.help = "write capacity.csv, capacity_probes.csv and a folder per probe here"
        if action.dest == "report":
            action.help = "write an HTML report (attainment and latency against rate) here"
        if action.dest == "slo_ttft":
            action.help = "TTFT SLO in ms (required)"
        if action.dest == "slo_tpot":
            action.help = "TPOT SLO in ms (required)"
    search = parser.add_argument_group("search")
    search.add_argument(
        "--goodput",
        type=float,
        default=DEFAULT_GOODPUT,
        help="share of requests that must meet both SLOs (default: %(default)s)",
    )
    search.add_argument(
        "--rate-tol",
        type=float,
        default=DEFAULT_REL_TOL,
        help="stop when (high - low) / low is at most this (default: %(default)s)",
    )
    search.add_argument(
        "--start-rate",
        type=float,
        default=None,
        help="first rate to probe in req/s (default: the trace's own mean rate)",
    )
    search.add_argument(
        "--sweep", default=None, metavar="SPEC", help="find the capacity of every point of SPEC"
    )
    from sim.experiments.sweep import add_executor_arguments

    add_executor_arguments(search)  # type: ignore[arg-type]


def _configs(
    args: argparse.Namespace, cli: dict[str, Any]
) -> tuple[TraceSource, list[dict[str, Any]]]:
    slos = {"slo_ttft": args.slo_ttft, "slo_tpot": args.slo_tpot}
    if args.sweep is None:
        if args.trace is None:
            raise ValueError("capacity needs TRACE or --sweep SPEC")
        source = TraceSource(path=args.trace, format=args.format, on_error=args.on_error)
        return source, [{**cli, **slos}]
    if args.trace is not None:
        raise ValueError("give TRACE or --sweep SPEC (whose [trace] names the trace), not both")
    spec = load_spec(args.sweep)
    if any(RATE in point for point in spec.points):
        raise ValueError(f"{args.sweep}: rate is what capacity searches; remove it from the spec")
    return spec.source, [{**cli, **point, **slos} for point in spec.points]


def capacity_command(args: argparse.Namespace) -> int:
    if args.slo_ttft is None or args.slo_tpot is None:
        raise ValueError("capacity needs both --slo-ttft MS and --slo-tpot MS")
    settings = SearchSettings(args.goodput, args.rate_tol, args.start_rate)
    parser = argparse.ArgumentParser(add_help=False)
    add_capacity_arguments(parser)
    source, configs = _configs(args, _cli_options(args, parser))
    start = settings.start_rate or source.load().mean_rate_per_s
    if not start > 0:
        raise ValueError("the trace has no arrival spread: give --start-rate")
    out = Path(args.out) if args.out else None
    use_ray = args.ray is not None
    with open_workers(resolve_jobs(args.jobs), use_ray, args.ray or None) as workers:
        # Probes per round and search: the workers shared out among the configurations.
        width = max(1, workers.num_workers // len(configs))
        runner = ProbeRunner(source, configs, workers, out)
        searches = [search(start, settings, width) for _ in configs]
        results = run_searches(searches, runner)
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    for idx, (options, result) in enumerate(zip(configs, results, strict=True)):
        probes.extend(result.probes)
        rows.append(_config_row(idx, options, result, settings))
        if not args.quiet:
            print(_describe(idx, options, result, settings, len(configs) > 1))
    if not args.quiet:
        print(f"{runner.num_run} probes run, {runner.num_reused} reused (same options)")
    if out is not None:
        names = sorted({k for c in configs for k in c})
        write_sweep_csv(out / "capacity_probes.csv", ["config", *names, RATE], probes)
        write_sweep_csv(out / "capacity.csv", ["config", *names], rows)
        if not args.quiet:
            print(f"wrote {out}/capacity.csv and capacity_probes.csv")
    if args.report:
        from reports.sweep import write_capacity_report

        path = write_capacity_report(probes, rows, settings.goodput, args.report)
        if not args.quiet:
            print(f"wrote report {path}")
    return 0 if all(not r["error"] for r in rows) else 1


def _config_row(
    idx: int, options: Mapping[str, Any], result: CapacityResult, settings: SearchSettings
) -> dict[str, Any]:
    return {
        "point": idx,
        "run_dir": "",
        "status": "error" if result.error else "ok",
        "error": result.error,
        "config": idx,
        **options,
        "capacity_rate": result.capacity_rate,
        "bracket_low_rate": result.low_rate,
        "bracket_high_rate": result.high_rate,
        "goodput_target": settings.goodput,
        "rel_tol": settings.rel_tol,
        "num_probes": len(result.probes),
    }


def _describe(
    idx: int,
    options: Mapping[str, Any],
    result: CapacityResult,
    settings: SearchSettings,
    many: bool,
) -> str:
    head = f"config {idx} {dict(options)}: " if many else ""
    if result.error:
        return f"{head}no capacity: {result.error} ({len(result.probes)} probes)"
    low, high = result.low_rate, result.high_rate
    assert low is not None and high is not None
    return (
        f"{head}capacity {low:.4g} req/s (bracket [{low:.4g}, {high:.4g}] req/s, relative width "
        f"{(high - low) / low:.3g} <= {settings.rel_tol}; {len(result.probes)} probes; "
        f">= {settings.goodput:.0%} of requests within the SLOs)"
    )
