"""Command line for traces: `generate` writes a synthetic trace CSV, `info` summarises any trace.

The simulator mounts these as `python -m sim trace generate|info`; `python -m traces.cli` runs
them directly. `main(argv)` returns the exit code, so tests call it in-process.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from core.text_files import trace_stem
from traces.distributions import (
    ArrivalProcess,
    FixedLengths,
    GammaArrivals,
    LengthDistribution,
    LognormalLengths,
    PoissonArrivals,
    TableLengths,
    UniformLengths,
)
from traces.generators import SharedPrefix, generate_trace
from traces.loaders import FORMATS, load_length_table, load_trace
from traces.options import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from traces.problems import TraceFormatError
from traces.rows import ON_ERROR_CHOICES
from traces.schema import Trace
from traces.writer import write_trace

LENGTH_CHOICES = ("fixed", "uniform", "lognormal", "table")


def _default(cls: type, name: str) -> Any:
    """A dataclass field's default, so the CLI defaults never drift from the classes."""
    return next(f.default for f in fields(cls) if f.name == name)


def _int_list(text: str) -> list[int]:
    values = _any_int_list(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1 like '2' or '1,2,4': {text!r}")
    return values


def _any_int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.replace(",", " ").split()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected ints like '2' or '0,1,2': {text!r}") from error
    if not values:
        raise argparse.ArgumentTypeError(f"expected ints like '2' or '0,1,2': {text!r}")
    return values


def _option_type(name: str, default: object) -> Callable[[str], float]:
    """Lengths are positive ints, medians positive numbers, sigmas non-negative numbers."""
    if isinstance(default, int):
        return positive_int
    return non_negative_float if name.endswith("sigma") else positive_float


# Each length option, the --lengths models that read it, and what it sets. The others ignore
# it, so `unused_generate_options` names it when given to them.
_LENGTH_OPTIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("prompt_tokens", ("fixed",), "prompt length"),
    ("output_tokens", ("fixed",), "output length"),
    ("min_prompt_tokens", ("uniform",), "shortest prompt"),
    ("min_output_tokens", ("uniform",), "shortest output"),
    ("max_prompt_tokens", ("uniform", "lognormal"), "longest prompt"),
    ("max_output_tokens", ("uniform", "lognormal"), "longest output"),
    ("prompt_median", ("lognormal",), "median prompt"),
    ("prompt_sigma", ("lognormal",), "sigma of log prompt length"),
    ("output_median", ("lognormal",), "median output"),
    ("output_sigma", ("lognormal",), "sigma of log output length"),
)
_LENGTH_CLASSES: dict[str, type] = {
    "fixed": FixedLengths,
    "uniform": UniformLengths,
    "lognormal": LognormalLengths,
}
# The options that shape the shared system prompts, and their `SharedPrefix` fields.
_PREFIX_FIELDS = (
    ("prefix_tokens", "prefix_tokens"),
    ("hash_block_tokens", "hash_block_tokens"),
    ("prefix_ids", "ids"),
)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `trace generate` (defaults equal the generator dataclasses' defaults). The
    options that only some arrival processes, length models or prefix settings read are None
    when not given, their defaults written into the help, so that `unused_generate_options`
    can tell which ones the command line gave."""
    parser.add_argument("-o", "--output", required=True, help="CSV file to write (.gz: gzip)")
    parser.add_argument(
        "--num-requests", type=positive_int, default=200, help="requests (default 200)"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    parser.add_argument("--name", default=None, help="trace name (default: output file stem)")
    arrivals = parser.add_argument_group("arrivals")
    arrivals.add_argument(
        "--arrival",
        choices=("poisson", "gamma"),
        default="poisson",
        help="arrival process (default poisson)",
    )
    arrivals.add_argument("--rate", type=positive_float, default=4.0, help="mean req/s (default 4)")
    arrivals.add_argument(
        "--cv",
        type=positive_float,
        default=None,
        help="gamma: coefficient of variation of gaps; 1 = Poisson, >1 bursty "
        f"(default {_default(GammaArrivals, 'cv'):g})",
    )
    lengths = parser.add_argument_group("lengths (tokens)")
    lengths.add_argument(
        "--lengths",
        choices=LENGTH_CHOICES,
        default="lognormal",
        help="how prompt and output lengths are drawn; each option below names the models "
        "that read it (default lognormal)",
    )
    for name, models, what in _LENGTH_OPTIONS:
        default = _default(_LENGTH_CLASSES[models[0]], name)
        lengths.add_argument(
            _flag(name),
            type=_option_type(name, default),
            default=None,
            help=f"{'/'.join(models)}: {what} (default {default})",
        )
    lengths.add_argument("--length-table", help="lengths: 'table' draws rows of this file")
    prefix = parser.add_argument_group("shared system prompts (prefix caching)")
    prefix.add_argument(
        "--num-prefixes", type=non_negative_int, default=0, help="system prompts (0 = none)"
    )
    for name, what in (
        ("prefix_tokens", "tokens in each system prompt"),
        ("hash_block_tokens", "tokens per prefix hash id"),
    ):
        prefix.add_argument(
            _flag(name),
            type=positive_int,
            default=None,
            help=f"with --num-prefixes: {what} (default {_default(SharedPrefix, name)})",
        )
    prefix.add_argument(
        "--prefix-ids",
        choices=("hash", "tokens"),
        default=None,
        help="with --num-prefixes: write prefix hash ids (compact) or full prompt token ids "
        f"(default {_default(SharedPrefix, 'ids')})",
    )
    parser.add_argument(
        "--num-samples",
        type=_int_list,
        default=[1],
        help="parallel samples n per request; a list like '1,2,4' draws one per request",
    )
    parser.add_argument(
        "--priorities",
        type=_any_int_list,
        default=None,
        help="a priority per request, drawn from a list like '0,1,2' (lower is served first "
        "under --scheduling-policy priority); none: the trace has no priority column",
    )


def unused_generate_options(args: argparse.Namespace) -> list[str]:
    """The options given that this trace never reads, each with what it applies to: for
    `generate` to say so rather than write the trace as if they had been heard."""
    unused = []
    if args.cv is not None and args.arrival != "gamma":
        unused.append("--cv: applies to --arrival gamma only")
    for name, models, _ in _LENGTH_OPTIONS:
        if getattr(args, name) is not None and args.lengths not in models:
            unused.append(f"{_flag(name)}: applies to --lengths {' or '.join(models)} only")
    if args.length_table is not None and args.lengths != "table":
        unused.append("--length-table: applies to --lengths table only")
    if args.num_prefixes == 0:
        for name, _ in _PREFIX_FIELDS:
            if getattr(args, name) is not None:
                unused.append(f"{_flag(name)}: applies with --num-prefixes 1 or more only")
    return unused


def _arrivals(args: argparse.Namespace) -> ArrivalProcess:
    if args.arrival == "gamma":
        cv = _default(GammaArrivals, "cv") if args.cv is None else args.cv
        return GammaArrivals(args.rate, cv)
    return PoissonArrivals(args.rate)


def _lengths(args: argparse.Namespace) -> LengthDistribution:
    if args.lengths == "table":
        if not args.length_table:
            raise ValueError("--lengths table needs --length-table FILE")
        return TableLengths(load_length_table(args.length_table))
    cls = _LENGTH_CLASSES[args.lengths]
    # Only the options this model reads, and only those given: the class has the defaults.
    given = {
        name: getattr(args, name)
        for name, models, _ in _LENGTH_OPTIONS
        if args.lengths in models and getattr(args, name) is not None
    }
    distribution: LengthDistribution = cls(**given)
    return distribution


def build_trace(args: argparse.Namespace) -> Trace:
    """The trace that `trace generate` would write for these parsed arguments."""
    shared = None
    if args.num_prefixes > 0:
        given = {
            field: getattr(args, name)
            for name, field in _PREFIX_FIELDS
            if getattr(args, name) is not None
        }
        shared = SharedPrefix(args.num_prefixes, **given)
    name = args.name or trace_stem(Path(args.output))
    return generate_trace(
        args.num_requests,
        _arrivals(args),
        _lengths(args),
        seed=args.seed,
        name=name,
        num_samples=args.num_samples,
        shared_prefix=shared,
        priorities=args.priorities,
    )


def run_generate(args: argparse.Namespace) -> int:
    """Generate and write the trace; 0 on success, 2 (with a message on stderr) on bad input.
    An option this trace never reads is named on stderr first; the trace is still written."""
    for unused in unused_generate_options(args):
        print(f"note: {unused}; it has no effect on this trace", file=sys.stderr)
    if Path(args.output).is_dir():
        print(f"error: -o {args.output}: is a directory; give a file name (.csv)", file=sys.stderr)
        return 2
    try:
        trace = build_trace(args)
        path = write_trace(trace, args.output)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stats = trace.length_stats()
    print(
        f"wrote {len(trace)} requests to {path}: {trace.duration_s:.1f} s,"
        f" {stats['mean_rate_per_s']:.2f} req/s, prompt mean {stats['prompt_mean']:.0f},"
        f" output mean {stats['output_mean']:.0f} tokens"
    )
    return 0


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="trace file (any supported format)")
    parser.add_argument("--format", default="auto", choices=("auto", *FORMATS))
    parser.add_argument(
        "--on-error",
        default="raise",
        choices=ON_ERROR_CHOICES,
        help="bad rows: raise fails listing every one (file, line, field); skip leaves them "
        "out and counts them (default: %(default)s)",
    )


def run_info(args: argparse.Namespace) -> int:
    """Print a trace's size, rate and length statistics, and anything the loader left out."""
    try:
        trace = load_trace(args.path, format=args.format, on_error=args.on_error)
    except (TraceFormatError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{trace.name} ({trace.format}, {trace.source})")
    for key, value in trace.length_stats().items():
        print(f"  {key:18s} {value:.6g}")
    for line in (trace.describe_skipped(), *trace.notes):
        if line:
            print(f"  note: {line}")
    return 0


def _add_generate_and_info(commands: Any, info_help: str) -> None:
    generate = commands.add_parser("generate", help="write a synthetic trace as our CSV")
    add_generate_arguments(generate)
    generate.set_defaults(func=run_generate)
    info = commands.add_parser("info", help=info_help)
    add_info_arguments(info)
    info.set_defaults(func=run_info)


def add_trace_commands(commands: Any) -> None:
    """Register ``trace generate`` and ``trace info`` on `commands` (what `add_subparsers`
    returned), as ``python -m sim trace``."""
    trace = commands.add_parser("trace", help="generate or inspect traces")
    trace_commands = trace.add_subparsers(dest="trace_command", required=True)
    _add_generate_and_info(trace_commands, "summarise a trace file of any format")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m traces.cli", description="Generate or inspect request traces."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_generate_and_info(commands, "summarise a trace file of any supported format")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
