"""``python -m sim capacity TRACE --slo-ttft MS --slo-tpot MS``: the highest arrival rate each
configuration sustains within the SLOs (the search is ``sim.experiments.capacity``, how a rate
is judged ``sim.experiments.capacity_judgement``), printed with how sure it is, and written as
capacity.csv, capacity_probes.csv and a report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from records.sweep_table import write_sweep_csv
from sim.experiments.capacity import (
    DEFAULT_GOODPUT,
    DEFAULT_REL_TOL,
    CapacityResult,
    ProbeRunner,
    SearchSettings,
    run_searches,
    search,
)
from sim.experiments.capacity_judgement import (
    CONCURRENCY_MULTIPLE,
    MIN_PROBE_REQUESTS,
    WINDOW_TTFT_MULTIPLE,
    confidence_bounds,
    probe_repeats,
)
from sim.experiments.sweep import open_workers, resolve_jobs
from sim.experiments.sweep_spec import (
    NOT_SWEPT,
    RATE,
    REPEATS,
    TraceSource,
    load_spec,
    point_config,
    unused_in_points,
)
from traces.options import fraction, positive_float, positive_int


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
    {
        *("help", "goodput", "rate_tol", "start_rate", "min_probe_requests", "sweep", "jobs"),
        *("ray", "slo_ttft", "slo_tpot"),
    }
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
        type=fraction,
        default=DEFAULT_GOODPUT,
        help="share of requests that must meet both SLOs, in (0, 1] (default: %(default)s)",
    )
    search.add_argument(
        "--rate-tol",
        type=_open_fraction,
        default=DEFAULT_REL_TOL,
        help="stop when (high - low) / low is at most this, in (0, 1) (default: %(default)s)",
    )
    search.add_argument(
        "--start-rate",
        type=positive_float,
        default=None,
        help="first rate to probe in req/s (default: the trace's own mean rate)",
    )
    search.add_argument(
        "--min-probe-requests",
        type=positive_int,
        default=None,
        metavar="N",
        help="replay the trace, repeated end to end, until each probe holds N requests "
        f"(default: {CONCURRENCY_MULTIPLE} x the sequences the deployment runs at once, at "
        f"least {MIN_PROBE_REQUESTS}); a probe also spans {WINDOW_TTFT_MULTIPLE} x the TTFT SLO",
    )
    search.add_argument(
        "--sweep", default=None, metavar="SPEC", help="find the capacity of every point of SPEC"
    )
    from sim.experiments.sweep import add_executor_arguments

    add_executor_arguments(search)  # type: ignore[arg-type]


def _open_fraction(text: str) -> float:
    """A number in (0, 1), as ``--rate-tol`` takes (argparse names the flag when refusing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return value


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
    """Search every configuration; 0 when each has a capacity, 1 when some has none (named on
    stderr, with or without --quiet), 2 on bad input (raised, for ``sim.cli.main``)."""
    if args.slo_ttft is None or args.slo_tpot is None:
        raise ValueError("capacity needs both --slo-ttft MS and --slo-tpot MS")
    settings = SearchSettings(args.goodput, args.rate_tol, args.start_rate, args.min_probe_requests)
    parser = argparse.ArgumentParser(add_help=False)
    add_capacity_arguments(parser)
    source, configs = _configs(args, _cli_options(args, parser))
    for note in unused_in_points(configs, "configurations"):  # no probe of theirs reads it
        print(f"note: {note}; it has no effect there", file=sys.stderr)
    trace = source.load()
    start = settings.start_rate or trace.mean_rate_per_s
    if not start > 0:
        raise ValueError("the trace has no arrival spread: give --start-rate")
    run_configs = [point_config(options) for options in configs]

    def repeats(config_idx: int, rate: float) -> int:
        config = run_configs[config_idx]
        return probe_repeats(len(trace), config, rate, settings.min_probe_requests)

    out = Path(args.out) if args.out else None
    use_ray = args.ray is not None
    with open_workers(resolve_jobs(args.jobs), use_ray, args.ray or None) as workers:
        # Probes per round and search: the workers shared out among the configurations.
        width = max(1, workers.num_workers // len(configs))
        runner = ProbeRunner(source, configs, workers, out, repeats)
        searches = [search(start, settings, width) for _ in configs]
        results = run_searches(searches, runner)
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    for idx, (options, result) in enumerate(zip(configs, results, strict=True)):
        probes.extend(result.probes)
        row = _config_row(idx, options, result, settings)
        rows.append(row)
        described = _describe(idx, options, result, settings, len(configs) > 1)
        if result.error:  # a failure is named on stderr, with or without --quiet
            print(f"error: {described}", file=sys.stderr)
        elif not args.quiet:
            print(described)
            print(_confidence_text(row, settings, len(trace)))
    if not args.quiet:
        print(f"{runner.num_run} probes run, {runner.num_reused} reused (same options)")
    if out is not None:
        names = sorted({k for c in configs for k in c})
        write_sweep_csv(out / "capacity_probes.csv", ["config", *names, RATE, REPEATS], probes)
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
    capacity = result.capacity_rate
    low, high = (None, None)
    repeats = None
    if capacity is not None:
        low, high = confidence_bounds(result.probes, capacity, settings.goodput)
        at = [row for row in result.probes if row.get(RATE) == capacity]
        repeats = int(at[0].get(REPEATS) or 1) if at else None
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
        "confidence_low_rate": low,
        "confidence_high_rate": high,
        "probe_repeats": repeats,
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


def _confidence_text(row: Mapping[str, Any], settings: SearchSettings, trace_len: int) -> str:
    """How sure the answer is (``capacity_judgement.confidence_bounds``) and how long each
    probe was."""
    low, high = row["confidence_low_rate"], row["confidence_high_rate"]
    low_text = f"{low:.4g}" if low is not None else "below every probe"
    high_text = f"{high:.4g}" if high is not None else "above every probe"
    repeats = row["probe_repeats"] or 1
    return (
        f"  95% confidence: between {low_text} and {high_text} req/s (the fastest probe whose "
        f"SLO attainment interval lies wholly at or above {settings.goodput:.0%}, the slowest "
        f"whose interval lies below it or whose queue grew; batch means over 10 batches); the "
        f"probe at the capacity replayed the trace {repeats} time(s) ({repeats * trace_len:,} "
        "requests)"
    )
