"""Command line: ``python -m sim run TRACE`` simulates a trace; ``python -m sim trace ...``
generates or inspects traces."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from engine.core.config import MEMORY_MODELS, PREEMPTION_MODES, RESERVATION_RULES
from engine.core.policies import POLICIES
from records.run_dir import records_from_result
from reports.cli import add_report_arguments, run_report
from reports.html import write_report
from reports.tables import deployment_text, rejection_note
from sim.calibrate import add_calibrate_arguments, run_calibrate
from sim.costmodel_cli import add_costmodel_commands
from sim.deployment import ROUTERS
from sim.hardware_spec import HARDWARE_PRESETS
from sim.measured_cli import add_measured_commands
from sim.model_spec import MODEL_PRESETS
from sim.run import POLICY_CHOICES, RunConfig, RunResult, servesim_version, simulate
from sim.validate import add_validate_arguments, measured_spelling, run_validate
from traces import cli as traces_cli
from traces.loaders import FORMATS, load_trace
from traces.options import (
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from traces.rows import ON_ERROR_CHOICES

DEFAULTS = RunConfig()


def add_run_arguments(parser: argparse.ArgumentParser, with_trace: bool = True) -> None:
    if with_trace:
        parser.add_argument(
            "trace",
            help="trace file (servesim CSV, Vidur CSV, Azure CSV, Mooncake JSONL, BurstGPT CSV)",
        )
        parser.add_argument(
            "--format",
            default="auto",
            choices=["auto", *sorted(FORMATS)],
            help="trace format (default: detect from the header)",
        )
        parser.add_argument(
            "--on-error",
            default="raise",
            choices=ON_ERROR_CHOICES,
            help="bad trace rows: raise fails listing every one (file, line, field); skip leaves "
            "them out and the summary counts them (default: %(default)s)",
        )
    parser.add_argument(
        "--policy",
        default=DEFAULTS.policy,
        choices=POLICY_CHOICES,
        help="batching policy (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        default=DEFAULTS.model,
        help=f"model preset ({', '.join(MODEL_PRESETS)}) or a Hugging Face config.json path "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--hardware",
        default=DEFAULTS.hardware,
        help=f"GPU preset ({', '.join(HARDWARE_PRESETS)}) or a hardware file (.json or .toml, "
        "see docs/hardware_format.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--tp",
        type=positive_int,
        default=DEFAULTS.tp,
        help="tensor-parallel degree (default: %(default)s)",
    )
    parser.add_argument(
        "--memory",
        choices=MEMORY_MODELS,
        default=None,
        help="KV memory model (default: the policy's own: contiguous for static/dynamic, "
        "paged otherwise)",
    )
    parser.add_argument(
        "--reservation",
        choices=RESERVATION_RULES,
        default=None,
        help=f"contiguous memory only: how much each sequence reserves "
        f"(default: {DEFAULTS.reservation})",
    )
    parser.add_argument(
        "--block-size",
        type=positive_int,
        default=DEFAULTS.block_size,
        help="KV block size in tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--num-blocks",
        type=positive_int,
        default=None,
        help=(
            "KV blocks per replica, counted as vLLM's num_gpu_blocks: paged memory keeps one "
            "as the null block (default: derived from GPU memory, as vLLM does)"
        ),
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=fraction,
        default=DEFAULTS.gpu_memory_utilization,
        help="share of GPU memory the engine may use (default: %(default)s)",
    )
    parser.add_argument(
        "--swap-space-gib",
        type=non_negative_float,
        default=DEFAULTS.swap_space_gib,
        help="CPU swap space per replica in GiB (default: %(default)s)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=DEFAULTS.max_num_seqs,
        help="max sequences per step (default: %(default)s)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=DEFAULTS.max_num_batched_tokens,
        help="token budget per step (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULTS.batch_size,
        help="static/dynamic batch size B (default: %(default)s)",
    )
    parser.add_argument(
        "--max-wait-s",
        type=non_negative_float,
        default=DEFAULTS.max_wait_s,
        help="dynamic batching: start a batch once the oldest has waited this long "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--preemption",
        choices=PREEMPTION_MODES,
        default=DEFAULTS.preemption_mode,
        help="preemption mode (default: %(default)s)",
    )
    parser.add_argument(
        "--prefix-caching", action="store_true", help="enable prefix caching (paged memory)"
    )
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="max tokens per request (default: the model's)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="calibrated cost-model profile (JSON); default: analytic roofline",
    )
    parser.add_argument(
        "--slo-ttft", type=positive_float, default=None, help="TTFT SLO in ms for goodput"
    )
    parser.add_argument(
        "--slo-tpot", type=positive_float, default=None, help="TPOT SLO in ms for goodput"
    )
    parser.add_argument(
        "--seed",
        type=non_negative_int,
        default=DEFAULTS.seed,
        help="recorded with the run (the simulation itself is deterministic)",
    )
    parser.add_argument(
        "--out", default=None, help="write requests.csv, steps.csv, summary.json here"
    )
    parser.add_argument(
        "--no-fast-forward",
        action="store_true",
        help="simulate every decode step one by one (slower; results are identical)",
    )
    deployment = parser.add_argument_group("deployment")
    deployment.add_argument(
        "--replicas",
        type=positive_int,
        default=DEFAULTS.num_replicas,
        help="colocated replicas behind the router (default: %(default)s)",
    )
    deployment.add_argument(
        "--router",
        choices=ROUTERS,
        default=DEFAULTS.router,
        help="how arrivals are spread over replicas (default: %(default)s)",
    )
    deployment.add_argument(
        "--prefill-replicas",
        type=positive_int,
        default=DEFAULTS.num_prefill,
        help="--policy disagg: prefill pool size (default: %(default)s)",
    )
    deployment.add_argument(
        "--decode-replicas",
        type=positive_int,
        default=DEFAULTS.num_decode,
        help="--policy disagg: decode pool size (default: %(default)s)",
    )
    deployment.add_argument(
        "--pool-policy",
        choices=sorted(POLICIES),
        default=DEFAULTS.pool_policy,
        help="--policy disagg: batching inside each pool (default: %(default)s)",
    )
    deployment.add_argument(
        "--link-gbps",
        type=positive_float,
        default=DEFAULTS.link_bandwidth_gbps,
        help="--policy disagg: KV link bandwidth in Gb/s (default: %(default)s)",
    )
    deployment.add_argument(
        "--link-latency-us",
        type=non_negative_float,
        default=DEFAULTS.link_latency_us,
        help="--policy disagg: KV link latency in us (default: %(default)s)",
    )
    deployment.add_argument(
        "--link-parallel",
        type=positive_int,
        default=DEFAULTS.link_parallel_transfers,
        help="--policy disagg: transfers the link carries at once; the "
        "rest queue (default: %(default)s)",
    )
    parser.add_argument(
        "--report", default=None, help="write a self-contained HTML report to this file"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    config = _config_from_args(args)
    if args.reservation is not None and config.resolved_memory_model() == "paged":
        raise ValueError(
            f"--reservation {args.reservation}: applies to contiguous memory only, but "
            f"--policy {config.policy} runs paged memory here (add --memory contiguous)"
        )
    return config


def _config_from_args(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        policy=args.policy,
        model=args.model,
        hardware=args.hardware,
        tp=args.tp,
        memory_model=args.memory,
        reservation=args.reservation or DEFAULTS.reservation,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization,
        swap_space_gib=args.swap_space_gib,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batch_tokens,
        batch_size=args.batch_size,
        max_wait_s=args.max_wait_s,
        preemption_mode=args.preemption,
        enable_prefix_caching=args.prefix_caching,
        max_model_len=args.max_model_len,
        profile=args.profile,
        slo_ttft_s=args.slo_ttft / 1000.0 if args.slo_ttft is not None else None,
        slo_tpot_s=args.slo_tpot / 1000.0 if args.slo_tpot is not None else None,
        seed=args.seed,
        fast_forward=not args.no_fast_forward,
        num_replicas=args.replicas,
        router=args.router,
        num_prefill=args.prefill_replicas,
        num_decode=args.decode_replicas,
        pool_policy=args.pool_policy,
        link_bandwidth_gbps=args.link_gbps,
        link_latency_us=args.link_latency_us,
        link_parallel_transfers=args.link_parallel,
    )


def print_summary(result: RunResult) -> None:
    s = result.summary
    c = result.config
    lines = [
        f"trace        {result.trace_name}: {s['num_requests']} requests ({s['completed']} "
        f"finished, {s['rejected']} rejected, {result.num_skipped_rows} bad rows skipped)",
        f"config       {c.policy} / {result.memory_model} memory, {c.model} on {c.hardware} "
        f"TP{c.tp}, {result.num_blocks} KV blocks of {c.block_size} tokens per replica",
        f"deployment   {deployment_text(asdict(c))}",
        f"duration     {s['duration_s']:.3f} s simulated",
        f"throughput   {s['request_throughput']:.3f} req/s, "
        f"{s['output_throughput']:.1f} output tok/s, {s['total_token_throughput']:.1f} total tok/s",
    ]
    for metric in ("ttft", "tpot", "itl", "e2el"):
        mean = s.get(f"mean_{metric}_ms")
        if mean is None:
            continue
        lines.append(
            f"{metric.upper():<12} mean {mean:9.2f}  median {s[f'median_{metric}_ms']:9.2f}  "
            f"p90 {s[f'p90_{metric}_ms']:9.2f}  p99 {s[f'p99_{metric}_ms']:9.2f}  ms"
        )
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
    print("\n".join(lines))


def _command_line(args: argparse.Namespace | None = None) -> str:
    """The command as given: the argv ``main`` parsed (sys.argv when run from a shell)."""
    argv = getattr(args, "argv", None)
    return shlex.join(["python", "-m", "sim", *(sys.argv[1:] if argv is None else argv)])


def _write_outputs(args: argparse.Namespace, results: list[RunResult], names: list[str]) -> None:
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


def _check_output_paths(args: argparse.Namespace) -> None:
    """Fail before simulating, not after, when an output cannot be written where asked."""
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a directory")
    if args.report and Path(args.report).is_dir():
        raise ValueError(f"--report {args.report}: is a directory; give an .html file name")


def run_command(args: argparse.Namespace) -> int:
    _check_output_paths(args)
    trace = load_trace(args.trace, format=args.format, on_error=args.on_error)
    result = simulate(trace, config_from_args(args), progress=not args.quiet)
    result.command = _command_line(args)
    if not args.quiet:
        print_summary(result)
    _write_outputs(args, [result], [""])
    return 0


def parse_variants(text: str) -> list[tuple[str, str | None, str | None]]:
    """``policy[:memory[:reservation]]`` items, comma-separated."""
    variants: list[tuple[str, str | None, str | None]] = []
    for item in text.split(","):
        parts: list[str | None] = list(item.strip().split(":"))
        if not parts[0] or len(parts) > 3:
            raise ValueError(f"--policies item {item!r}: expected policy[:memory[:reservation]]")
        policy, memory, reservation = [*parts, None, None][:3]
        if policy is None or policy not in POLICY_CHOICES:
            raise ValueError(f"--policies item {item!r}: unknown policy {policy!r}")
        if memory is not None and memory not in MEMORY_MODELS:
            raise ValueError(f"--policies item {item!r}: memory must be one of {MEMORY_MODELS}")
        if reservation is not None and reservation not in RESERVATION_RULES:
            raise ValueError(
                f"--policies item {item!r}: reservation must be one of {RESERVATION_RULES}"
            )
        if (policy, memory, reservation) in variants:
            raise ValueError(f"--policies: item {item.strip()!r} appears twice")
        variants.append((policy, memory, reservation))
    return variants


def _compare_configs(args: argparse.Namespace) -> list[tuple[str, RunConfig]]:
    """(folder name, config) per --policies item, checked before anything runs."""
    if args.policy is not None:
        raise ValueError("--policy: compare runs one policy per --policies item; use --policies")
    base = _config_from_args(argparse.Namespace(**(vars(args) | {"policy": DEFAULTS.policy})))
    named = []
    for policy, memory, reservation in parse_variants(args.policies):
        if reservation and memory == "paged":
            raise ValueError(
                f"--policies {policy}:{memory}:{reservation}: a reservation rule "
                "applies to contiguous memory only"
            )
        config = replace(
            base,
            policy=policy,
            memory_model=memory or base.memory_model,  # type: ignore[arg-type]
            reservation=reservation or base.reservation,  # type: ignore[arg-type]
        )
        named.append(("_".join(p for p in (policy, memory, reservation) if p), config))
    if args.reservation and all(c.resolved_memory_model() == "paged" for _, c in named):
        raise ValueError(
            f"--reservation {args.reservation}: applies to contiguous memory only, and every "
            "--policies item runs paged memory"
        )
    return named


def compare_command(args: argparse.Namespace) -> int:
    named = _compare_configs(args)
    _check_output_paths(args)
    trace = load_trace(args.trace, format=args.format, on_error=args.on_error)
    results = []
    for _, config in named:
        result = simulate(trace, config, progress=not args.quiet)
        result.command = _command_line(args)
        if not args.quiet:
            print_summary(result)
            print()
        results.append(result)
    _write_outputs(args, results, [name for name, _ in named])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim",
        description="servesim: simulate LLM inference serving on a request trace.",
    )
    parser.add_argument("--version", action="version", version=f"servesim {servesim_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="simulate one configuration on a trace",
        description="Replay TRACE through a serving configuration and report TTFT, TPOT, "
        "ITL, E2E latency, throughput and KV memory use.",
    )
    add_run_arguments(run)
    run.set_defaults(func=run_command)
    compare = commands.add_parser(
        "compare",
        help="simulate several policies / memory models on one trace",
        description="Run TRACE once per --policies item (policy[:memory[:reservation]]), "
        "writing one sub-folder per run under --out and one report comparing them.",
    )
    add_run_arguments(compare)
    compare.add_argument(
        "--policies",
        required=True,
        help="comma-separated policy[:memory[:reservation]] items, e.g. "
        "'static,continuous,chunked' or 'continuous:contiguous:max,continuous:paged'",
    )
    # compare takes --policies; --policy (shared with run) is refused there, not ignored.
    compare.set_defaults(func=compare_command, policy=None)
    add_sweep_commands(commands)
    report = commands.add_parser(
        "report", help="render saved runs (--out folders) as one HTML report"
    )
    add_report_arguments(report)
    report.set_defaults(func=run_report)
    calibrate = commands.add_parser(
        "calibrate",
        help="time the real engine's parts and write a cost-model profile",
        description="Time the real engine (torch) over a grid of sizes: linear layers, "
        "elementwise ops, paged decode and prefill attention, the KV store, block copies, "
        "swaps, LM head + sampling, input preparation, and whole steps as check points. "
        "Writes a profile that --profile reads (docs/profile_format.md).",
    )
    add_calibrate_arguments(calibrate)
    calibrate.set_defaults(func=run_calibrate)
    validate = commands.add_parser(
        "validate",
        help="replay a trace on the real engine and measure the simulator's error",
        description="Replay TRACE on the real engine (or read --replay ENGINE_RUN_DIR), "
        "calibrate if no --profile, simulate the same trace and configuration with the profile "
        "and with the analytic roofline, and compare per request (TTFT, TPOT, ITL, E2E), per "
        "step (the cost model on the engine's own batches) and in aggregate. Writes "
        "validation.json under --out.",
    )
    add_validate_arguments(validate)
    validate.set_defaults(func=run_validate)
    add_measured_commands(commands, add_run_arguments, config_from_args)
    add_costmodel_commands(commands)
    trace = commands.add_parser("trace", help="generate or inspect traces")
    trace_commands = trace.add_subparsers(dest="trace_command", required=True)
    generate = trace_commands.add_parser("generate", help="write a synthetic trace as our CSV")
    traces_cli.add_generate_arguments(generate)
    generate.set_defaults(func=traces_cli.run_generate)
    info = trace_commands.add_parser("info", help="summarise a trace file of any format")
    traces_cli.add_info_arguments(info)
    info.set_defaults(func=traces_cli.run_info)
    return parser


def add_sweep_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``sweep`` and ``capacity`` live in sim/sweep.py and sim/capacity.py."""
    from sim import capacity, sweep

    sweep_parser = commands.add_parser(
        "sweep",
        help="run a grid of configurations (a TOML spec) and tabulate them",
        description="Run every point of SPEC (docs/sweep.md) as an ordinary run, each in its own "
        "folder under --out, and write sweep.csv with one row per point. Points already "
        "complete under --out are not run again.",
    )
    sweep.add_sweep_arguments(sweep_parser)
    sweep_parser.set_defaults(func=sweep.sweep_command)
    capacity_parser = commands.add_parser(
        "capacity",
        help="find the highest arrival rate that meets the SLOs",
        description="Bracket, then bisect, the arrival rate (time-scaling TRACE's arrivals) to "
        "the highest rate at which at least --goodput of requests meet both SLOs.",
    )
    capacity.add_capacity_arguments(capacity_parser)
    capacity_parser.set_defaults(func=capacity.capacity_command)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        given = list(sys.argv[1:] if argv is None else argv)
        # `validate --measured RUN_DIR` is `measured validate RUN_DIR` (issue 16's spelling).
        args = build_parser().parse_args(measured_spelling(given) or given)
        args.argv = given
        return int(args.func(args))
    except (ValueError, OSError) as error:
        # Bad input (trace rows, configs, files) is reported, never a traceback.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report it
