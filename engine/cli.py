"""Command line: ``python -m engine run TRACE`` replays a trace on the real engine and writes
the simulator's run records (``requests.csv``, ``steps.csv``, ``summary.json``), so
``python -m sim report`` and ``compare`` read engine runs beside simulated ones."""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.config import LAYOUT_SETTINGS, CacheConfig, SchedulerConfig
from core.decode_split import SPLIT_MODES
from core.flags import add_setting_flags, given_settings, unused_settings
from core.settings import build
from engine.llm_engine import CLOCKS, EngineConfig
from engine.mixed_graphs import MIXED_GRAPH_MODES, MIXED_MAX_TOKENS
from records.run_options import (
    add_out_argument,
    add_report_and_quiet_arguments,
    add_slo_arguments,
    slo_s,
)
from traces.options import add_trace_arguments, non_negative_float, non_negative_int

DEFAULTS = EngineConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine",
        description="servesim's real engine: a Llama-family model on our kernels, driven by "
        "the same scheduling core as the simulator.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_run_command(commands)
    add_gpu_check_command(commands)
    return parser


def add_run_command(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="replay a trace on the real engine",
        description="Replay TRACE on a real clock (arrivals at trace times x --time-scale); "
        "each request generates exactly its trace output length. Writes the simulator's run "
        "records with measured step times.",
    )
    add_trace_arguments(run, check_format=False)
    settings = run.add_argument_group(
        "KV cache and scheduling (the settings python -m sim run takes too)"
    )
    add_setting_flags(settings, (CacheConfig, SchedulerConfig), skip=LAYOUT_SETTINGS)
    _add_model_arguments(run)
    _add_replay_arguments(run)
    add_slo_arguments(run)
    add_out_argument(run)
    add_report_and_quiet_arguments(run)
    run.set_defaults(func=run_command)


def _add_model_arguments(run: argparse.ArgumentParser) -> None:
    """The model, where it runs, its dtype, weights and kernels, and CUDA graphs."""
    run.add_argument(
        "--model",
        default=DEFAULTS.model,
        help="model preset (tiny-llama) or a local Hugging Face directory (default: %(default)s)",
    )
    run.add_argument("--device", default=DEFAULTS.device, help="cpu or cuda (default: %(default)s)")
    run.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float16", "bfloat16"],
        help="weights and KV dtype (default: fp32 on CPU, bf16 on CUDA)",
    )
    run.add_argument(
        "--weights",
        default=DEFAULTS.weights,
        choices=["auto", "random"],
        help="load the directory's safetensors, or seeded random weights",
    )
    run.add_argument(
        "--backend",
        default=DEFAULTS.backend,
        choices=["auto", "triton", "torch"],
        help="kernels: Triton on CUDA (auto), or the torch references",
    )
    run.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly: no CUDA graphs for decode (as vLLM's flag; CPU never "
        "uses them)",
    )
    run.add_argument(
        "--decode-split",
        default=DEFAULTS.decode_split,
        choices=list(SPLIT_MODES),
        help="how the Triton decode kernel shares each sequence's context among its KV splits: "
        "per_sequence (each its own share) or fixed (every split the planned length, the "
        "engine until commit 39ba127 of 2026-11-27; for A/B runs)",
    )
    run.add_argument(
        "--mixed-graphs",
        default=DEFAULTS.mixed_graphs,
        choices=list(MIXED_GRAPH_MODES),
        help="steps with a prompt chunk (and decode batches past the decode graphs) of up to "
        f"{MIXED_MAX_TOKENS} tokens: eager (off) or on piecewise CUDA graphs, every op but the "
        "attention captured per padded token count (as vLLM's default); CUDA only",
    )


def _add_replay_arguments(run: argparse.ArgumentParser) -> None:
    """How the trace is replayed: its arrival times' stretch, sampling, threads, the clock."""
    run.add_argument(
        "--time-scale",
        type=non_negative_float,
        default=1.0,
        help="multiply trace arrival times by this (default: %(default)s)",
    )
    run.add_argument(
        "--warm-up",
        choices=("short", "shapes"),
        default="short",
        help="before the trace: one short request, or also every decode batch size over short "
        "and long prompts (engine.warm_up; its effect on a GPU is not measured yet) "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--temperature",
        type=non_negative_float,
        default=0.0,
        help="sampling temperature, 0 = greedy (default: %(default)s)",
    )
    run.add_argument(
        "--cpu-threads",
        type=non_negative_int,
        default=DEFAULTS.cpu_threads,
        help="torch threads on CPU, 0 = torch's default (default: %(default)s)",
    )
    run.add_argument(
        "--clock",
        default=DEFAULTS.clock,
        choices=CLOCKS,
        help="the run's timeline: wall = the real clock (arrivals are waited for; on a loaded "
        "machine steps also wait for a core); cpu = a virtual clock advanced by each step's "
        "measured thread-CPU time, jumping idle gaps to the next arrival: execution cost is "
        "measured, queueing is on the virtual clock (CPU device, --cpu-threads 1 only). "
        "steps.csv records both wall_s and cpu_s either way (default: %(default)s)",
    )
    run.add_argument("--seed", type=int, default=DEFAULTS.seed, help="weights and sampling seed")
    run.add_argument(
        "--cpu-cores",
        default=None,
        help="run the engine's process on these CPU cores only, e.g. 2,3 or 2-5 (Linux; "
        "engine.affinity: an A/B of the host's speed, whose slow stretches an eager engine's "
        "steps follow) (default: every core the process may use)",
    )


def add_gpu_check_command(commands: Any) -> None:
    check = commands.add_parser(
        "gpu-check",
        help="measure everything a GPU should: tests, kernels, engine, calibrate, validate",
        description="On a CUDA machine, run in turn, each in its own process: the gpu tests, "
        "kernels.bench, benchmarks/bench_engine.py (with and without CUDA graphs where the "
        "engine has them), torch.profiler over decode steps, sim calibrate, sim validate on "
        "the bundled traces, and the engine twice on example.csv. A part that fails or runs "
        "past its limit is recorded and the next one runs; parts that no longer fit the time "
        "budget are skipped and named. Writes DIR/<part>/ and DIR/summary.md, summary.json.",
    )
    check.add_argument("--out", required=True, help="folder for the parts and the summary")
    check.add_argument(
        "--dry-run",
        action="store_true",
        help="list the parts and check their commands' flags; runs nothing, needs no GPU",
    )
    check.add_argument(
        "--budget-s",
        type=non_negative_float,
        default=480.0,
        help="seconds for the whole check (default: %(default)s)",
    )
    check.add_argument("--only", default=None, help="run only these parts (comma-separated)")
    check.add_argument("--skip", default=None, help="leave out these parts (comma-separated)")
    check.add_argument("--model", default="llama-3-8b", help="model (default: %(default)s)")
    check.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["float32", "float16", "bfloat16"],
        help="weights and KV dtype (default: %(default)s)",
    )
    check.add_argument(
        "--hardware",
        default=None,
        help="the roofline's hardware preset (default: from the device, H200 or H100-SXM)",
    )
    check.set_defaults(func=run_gpu_check)


def run_gpu_check(args: argparse.Namespace) -> int:
    from engine.gpu_check.command import run_gpu_check as check

    return check(args)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return build(
        EngineConfig,
        {
            **given_settings(args),
            "model": args.model,
            "device": args.device,
            "dtype": args.dtype,
            "weights": args.weights,
            "seed": args.seed,
            "backend": args.backend,
            "cpu_threads": args.cpu_threads,
            "clock": args.clock,
            "enforce_eager": args.enforce_eager,
            "decode_split": args.decode_split,
            "mixed_graphs": args.mixed_graphs,
        },
    )


def run_command(args: argparse.Namespace) -> int:
    if args.cpu_cores is not None:  # first: the threads started later inherit the mask
        from engine.affinity import parse_cores, pin_to_cores

        pin_to_cores(parse_cores(args.cpu_cores))
    from tqdm import tqdm

    from engine.replay import ReplayConfig, replay
    from records.run_dir import load_run
    from reports.html import write_report
    from traces.loaders import load_trace

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out: {args.out} exists and is not a directory")
    trace = load_trace(args.trace, format=args.format, on_error=args.on_error)
    for line in trace.load_notes():
        print(line, file=sys.stderr)
    engine = config_from_args(args)
    scheduler = engine.scheduler
    for unused in unused_settings(
        given_settings(args), scheduler.policy, scheduler.preemption_mode
    ):
        print(f"note: {unused}; it has no effect on this run", file=sys.stderr)
    triton = args.backend == "triton" or (args.backend == "auto" and engine.device != "cpu")
    if args.decode_split != DEFAULTS.decode_split and not triton:
        note = "--decode-split: the Triton decode kernel's, and this run's kernels are torch's"
        print(f"note: {note}; it has no effect on this run", file=sys.stderr)
    config = ReplayConfig(
        engine=engine,
        time_scale=args.time_scale,
        warm_up_shapes=args.warm_up == "shapes",
        temperature=args.temperature,
        slo_ttft_s=slo_s(args.slo_ttft),
        slo_tpot_s=slo_s(args.slo_tpot),
    )
    bar = tqdm(total=len(trace), unit="req", disable=args.quiet or not sys.stderr.isatty())

    def progress(num_done: int) -> None:
        bar.update(num_done - bar.n)

    # This process ends when the replay is written, and what it has imported (torch above all)
    # lives until then: move it out of the cyclic collector's reach, so no collection during the
    # replay walks it again, nor the interpreter's exit (about 0.4 s of a CPU run's exit was that
    # walk). Only this command does it: a library caller's process may keep running.
    gc.collect()
    gc.freeze()
    result = replay(trace, config, on_progress=progress)
    bar.close()
    result.command = " ".join(shlex.quote(a) for a in ["python", "-m", "engine", *sys.argv[1:]])
    if not args.quiet:
        print_summary(result)
    if args.out:
        result.write(args.out)
        if not args.quiet:
            print(f"wrote {args.out}/requests.csv, steps.csv, summary.json")
    if args.report:
        if not args.out:
            raise ValueError("--report needs --out (the report reads the written run)")
        path = write_report(
            [load_run(args.out, label=f"engine / {config.engine.scheduler.policy}")],
            Path(args.report),
        )
        if not args.quiet:
            print(f"wrote report {path}")
    return 0


def print_summary(result: object) -> None:
    s = result.summary  # type: ignore[attr-defined]

    def ms(key: str) -> str:
        value = s.get(key)
        return "-" if value is None else f"{value:.1f} ms"

    print(
        f"engine on {result.device_name}: {s['completed']}/{s['num_requests']} finished, "  # type: ignore[attr-defined]
        f"{s['rejected']} rejected, {result.wall_s:.1f} s wall"  # type: ignore[attr-defined]
    )
    if result.config.engine.clock == "cpu":  # type: ignore[attr-defined]
        print("  times below are on the virtual CPU-time clock (--clock cpu), not the wall")
    print(
        f"  TTFT median {ms('median_ttft_ms')} p99 {ms('p99_ttft_ms')} | "
        f"TPOT median {ms('median_tpot_ms')} | E2E median {ms('median_e2el_ms')}"
    )
    rejected = [r for r in result.requests if r.reject_reason]  # type: ignore[attr-defined]
    if rejected:
        print(f"  rejected, e.g. request {rejected[0].request_id}: {rejected[0].reject_reason}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
