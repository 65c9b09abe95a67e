"""``python -m sim run TRACE``: simulate one configuration, print its summary and write its
records and report; the output helpers here serve ``compare`` too."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.settings import flat_settings
from records.run_dir import records_from_result
from reports.html import write_report
from reports.tables import deployment_text, rejection_note
from sim.cli.options import add_run_arguments, config_from_args, unused_options
from sim.run import RunResult, simulate
from traces.loaders import load_trace
from traces.schema import Trace


def add_run_command(commands: Any) -> None:
    """Register ``run`` on `commands` (what `add_subparsers` returned)."""
    run: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="simulate one configuration on a trace",
        description="Replay TRACE through a serving configuration and report TTFT, TPOT, "
        "ITL, E2E latency, throughput and KV memory use.",
    )
    add_run_arguments(run)
    run.set_defaults(func=run_command)


def print_summary(result: RunResult) -> None:
    s = result.summary
    c = result.config
    hardware = f"{result.hardware_name} ({c.hardware})" if result.hardware_name else c.hardware
    lines = [
        f"trace        {result.trace_name}: {s['num_requests']} requests ({s['completed']} "
        f"finished, {s['rejected']} rejected, {result.num_skipped_rows} bad rows skipped)",
        f"config       {c.scheduler.policy} / {result.memory_model} memory, {c.model} on "
        f"{hardware} TP{c.tp}, {result.num_blocks} KV blocks of {c.cache.block_size} tokens "
        "per replica",
        f"deployment   {deployment_text(flat_settings(c))}",
        f"duration     {s['duration_s']:.3f} s simulated",
        throughput_line(s),
    ]
    if not s["completed"]:
        lines.append("finished     nothing finished: no latency to report")
    for metric in ("ttft", "tpot", "itl", "e2el"):
        mean = s.get(f"mean_{metric}_ms")
        if mean is None:
            continue
        lines.append(
            f"{metric.upper():<12} mean {mean:9.2f}  median {s[f'median_{metric}_ms']:9.2f}  "
            f"p90 {s[f'p90_{metric}_ms']:9.2f}  p99 {s[f'p99_{metric}_ms']:9.2f}  ms"
        )
    lines.extend(priority_lines(result.priority_summary))
    lines.append(
        f"preemptions  {s['num_preemptions']}, recomputed tokens {s['num_recomputed_tokens']}, "
        f"swapped-out blocks {s['num_blocks_swapped_out']}, "
        f"prefix hit rate {s['prefix_hit_rate']:.1%}"
    )
    share = result.mean_real_token_share
    if share is None:
        lines.append("KV memory    no request admitted: no KV memory was allocated")
    else:
        lines.append(
            f"KV memory    {share:.1%} of allocated slots held real tokens (mean over steps)"
        )
    rejected = rejection_note(result.requests_frame())
    if rejected:
        lines.append(f"rejected     {rejected}")
    if result.overload is not None:
        lines.append(f"warning      {result.overload.warning}")
    print("\n".join(lines))


def priority_lines(classes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per priority class (lowest, served first, first): its requests and its
    median / p99 TTFT and E2EL; nothing when the trace has one class."""

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = []
    for priority, c in classes.items():
        lines.append(
            f"priority {priority:<3} {c['completed']} of {c['num_requests']} finished; TTFT "
            f"median {ms(c['median_ttft_ms'])} p99 {ms(c['p99_ttft_ms'])}, E2EL median "
            f"{ms(c['median_e2el_ms'])} p99 {ms(c['p99_e2el_ms'])} ms"
        )
    return lines


def throughput_line(s: Mapping[str, Any]) -> str:
    """Rates over the run, or why there are none (a run that lasts no time has no rate)."""
    if s["request_throughput"] is None:
        return "throughput   none: the run lasted no simulated time"
    return (
        f"throughput   {s['request_throughput']:.3f} req/s, "
        f"{s['output_throughput']:.1f} output tok/s, {s['total_token_throughput']:.1f} total tok/s"
    )


def command_line(args: argparse.Namespace | None = None) -> str:
    """The command as given: the argv ``main`` parsed (sys.argv when run from a shell)."""
    argv = getattr(args, "argv", None)
    return shlex.join(["python", "-m", "sim", *(sys.argv[1:] if argv is None else argv)])


def write_outputs(args: argparse.Namespace, results: list[RunResult], names: list[str]) -> None:
    if args.out:
        out = Path(args.out)
        for result, name in zip(results, names, strict=True):
            target = out / name if name else out
            result.write(target)
            if not args.quiet:
                print(f"wrote {target}/requests.csv, steps.csv, summary.json")
    if args.report:
        runs = [
            records_from_result(
                r, command=r.command, source=str(Path(args.out) / name) if args.out else None
            )
            for r, name in zip(results, names, strict=True)
        ]
        path = write_report(runs, Path(args.report))
        if not args.quiet:
            print(f"wrote report {path}")


def check_output_paths(args: argparse.Namespace) -> None:
    """Fail before simulating, not after, when an output cannot be written where asked."""
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a directory")
    if args.report and Path(args.report).is_dir():
        raise ValueError(f"--report {args.report}: is a directory; give an .html file name")
    if args.out:
        writable_folder("--out", Path(args.out))
    if args.report:
        writable_folder("--report", Path(args.report).parent)


def writable_folder(option: str, folder: Path) -> None:
    """Make ``folder`` (and its parents) now, so that an output the run ends with cannot fail
    after all its work; a ``ValueError`` naming ``option`` if it cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{option}: cannot create {folder} ({error.strerror})") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(f"{option}: cannot write in {folder} ({error.strerror})") from None


def print_skipped(trace: Trace) -> None:
    """Say on stderr which rows the trace's loader left out (``--on-error skip``) and why, and
    its other notes (columns it did not read, rows a format's option left out)."""
    for line in trace.load_notes():
        print(line, file=sys.stderr)


def run_command(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace, format=args.format, on_error=args.on_error)
    print_skipped(trace)
    config = config_from_args(args)
    for unused in unused_options(config, args):
        print(f"note: {unused}; it has no effect on this run", file=sys.stderr)
    if config.scheduler.scheduling_policy == "priority":
        priorities = {request.priority for request in trace.requests}
        if len(priorities) == 1:
            print(
                f"note: --scheduling-policy priority: every request of {trace.name} has "
                f"priority {priorities.pop()} (a trace's priority column sets them), so it "
                "serves them by arrival as fcfs does (equal arrivals by request id)",
                file=sys.stderr,
            )
    check_output_paths(args)  # (after the inputs: a run refused leaves no empty folder)
    result = simulate(trace, config, progress=not args.quiet)
    result.command = command_line(args)
    if not args.quiet:
        print_summary(result)
    write_outputs(args, [result], [""])
    return 0
