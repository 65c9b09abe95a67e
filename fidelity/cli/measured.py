"""``python -m sim measured import`` (a measured run into our run directory and replay trace)
and ``python -m sim measured validate RUN_DIR`` (replay it, print the per-request error)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.model.presets import load_model_spec
from core.settings import build, setting_names
from fidelity.measured import HARDWARE_FILE, TRACE_FILE, write_measured_run
from fidelity.measured_importers import IMPORTERS
from records.compare import Comparison, compare_requests, format_comparison
from records.run_dir import load_run, records_from_result
from reports.html import write_report
from sim.cli.options import (
    add_run_arguments,
    checked_options,
    leave_defaults_to_the_run,
    run_settings,
    vllm_default_settings,
)
from sim.costmodel.base import CostModelConfig
from sim.costmodel.expert_parallel import weight_bytes_per_gpu
from sim.run import RunConfig, RunResult, simulate
from sim.specs.hardware_file import load_hardware
from sim.specs.kv_capacity import vllm_kv_capacity
from traces.loaders import load_trace

_SETTINGS = frozenset(setting_names(RunConfig))


def add_measured_commands(commands: Any) -> None:
    """Register ``measured import`` and ``measured validate`` on the ``python -m sim`` subparsers
    (``python -m sim validate`` is the validation against the real engine)."""
    measured = commands.add_parser("measured", help="measured runs of a real engine as inputs")
    measured_commands = measured.add_subparsers(dest="measured_command", required=True)
    importer = measured_commands.add_parser(
        "import",
        help="turn a measured run into our run directory and a replay trace",
        description="Read a measured run (an LLMServingSim run folder, or a `vllm bench serve` "
        "result JSON saved with --save-detailed) and write requests.csv (measured timestamps), "
        "summary.json (vLLM benchmark metrics), trace.csv (arrivals, lengths, token ids) and, "
        "when the run names its GPU, hardware.json into --out.",
    )
    importer.add_argument("source", help="run folder (llmservingsim) or result JSON (vllm-bench)")
    importer.add_argument(
        "--format",
        required=True,
        choices=sorted(IMPORTERS),
        help="llmservingsim: an LLMServingSim run folder; vllm-bench: a vllm bench result JSON",
    )
    importer.add_argument(
        "--workload",
        default=None,
        help="workload JSONL (input_toks, output_toks, arrival_time_ns, input_tok_ids); "
        "llmservingsim: default is meta.json's dataset_path",
    )
    importer.add_argument(
        "--vllm-log",
        default=None,
        help="the vLLM server's log of the run: its 'GPU KV cache size: N tokens' (v1) or "
        "'# GPU blocks: N' (v0) line gives the replay's KV capacity (default: a block count in "
        "the run's metadata, else vLLM's rule derives one when replaying)",
    )
    importer.add_argument("--out", required=True, help="run directory to write")
    importer.set_defaults(func=import_command)

    validate = measured_commands.add_parser(
        "validate",
        help="replay a measured run and print the per-request error",
        description="Simulate RUN_DIR/trace.csv (from `measured import`) with the measured run's "
        "own settings and print the median and p90 absolute error and the bias of TTFT, TPOT, "
        "ITL and E2E, request by request. Run options you give replace the recorded settings; "
        "those you leave out take the recorded values (else the defaults --help names). --out "
        "writes the simulated run; --report an HTML report of the measured and simulated runs "
        "side by side.",
    )
    validate.add_argument("measured", metavar="RUN_DIR", help="run directory from measured import")
    validate.add_argument("--json", default=None, help="also write the error table as JSON here")
    add_run_arguments(validate, with_trace=False)
    leave_defaults_to_the_run(validate)
    validate.set_defaults(func=validate_command)


def import_command(args: argparse.Namespace) -> int:
    run = IMPORTERS[args.format](args.source, args.workload, args.vllm_log)
    root = write_measured_run(run, args.out)
    print(f"wrote {root}/requests.csv, summary.json, {TRACE_FILE} ({len(run.requests)} requests)")
    if run.kv_capacity is not None:
        blocks, source = run.kv_capacity.num_gpu_blocks, run.kv_capacity.source
        print(f"KV capacity: {blocks} GPU blocks, from {source}")
    return 0


def replay_config(
    run_dir: str | Path, given: Mapping[str, Any], vllm_defaults: str | None = None
) -> RunConfig:
    """The measured run's recorded settings (summary.json ``config``), with the ``given`` ones
    (by field name) in their place; a recorded hardware file is resolved against the run
    directory. One config is built from the two, so its checks see what is replayed. With
    ``vllm_defaults`` (a usage), budgets neither given nor recorded are vLLM's for it."""
    root = Path(run_dir)
    recorded = {k: v for k, v in load_run(root).config.items() if k in _SETTINGS}
    if recorded.get("hardware") == HARDWARE_FILE:
        recorded["hardware"] = str(root / HARDWARE_FILE)
    settings = {**recorded, **given}
    if vllm_defaults is not None:
        settings |= vllm_default_settings(settings, vllm_defaults)
    return build(RunConfig, settings)


def unreplayed_settings(recorded: Mapping[str, Any]) -> list[str]:
    """The recorded settings (summary.json ``config``) that are not the simulator's, which
    `replay_config` leaves out: said, not dropped in silence."""
    return sorted(set(recorded) - _SETTINGS)


def validate_run(
    run_dir: str | Path, config: RunConfig, cost_config: CostModelConfig | None = None
) -> tuple[Comparison, RunResult]:
    """Simulate the measured run's trace under ``config`` and compare request by request."""
    root = Path(run_dir)
    measured = load_run(root)
    trace = load_trace(root / TRACE_FILE, format="servesim")
    result = simulate(trace, config, cost_config=cost_config)
    return compare_requests(measured.requests, result.requests_frame()), result


def kv_capacity_line(run_dir: str | Path, config: RunConfig) -> str:
    """Where the replay's KV capacity comes from: the run's own record (its log or metadata),
    a --num-blocks given, or vLLM's rule on the run's memory settings, term by term."""
    records = load_run(run_dir)
    source = _measured_payload(run_dir).get("kv_capacity_source")
    num_blocks = config.cache.num_blocks
    if num_blocks is not None:
        if source is not None and num_blocks == records.num_blocks:
            return f"KV cache: {num_blocks} GPU blocks/rank, as the run recorded ({source})"
        return f"KV cache: {num_blocks} GPU blocks/rank, as given (--num-blocks)"
    model = load_model_spec(config.model)
    dp = config.data_parallel_size
    capacity = vllm_kv_capacity(
        model,
        load_hardware(config.hardware),
        config.tp,
        config.cache.block_size,
        config.cache.gpu_memory_utilization,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_num_seqs=config.scheduler.max_num_seqs,
        weight_bytes=weight_bytes_per_gpu(model, config.tp, dp) if model.is_moe else None,
    )
    return (
        f"KV cache: {capacity.num_gpu_blocks} GPU blocks/rank, derived as vLLM does (the run "
        f"records none): {capacity.describe(config.cache.gpu_memory_utilization)}"
    )


def _measured_payload(run_dir: str | Path) -> dict[str, Any]:
    payload = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    measured = payload.get("measured") if isinstance(payload, dict) else None
    return measured if isinstance(measured, dict) else {}


def validate_command(args: argparse.Namespace) -> int:
    given = run_settings(args)
    config = checked_options(replay_config(args.measured, given, args.vllm_defaults), args)
    comparison, result = validate_run(args.measured, config)
    run = load_run(args.measured)
    measured = run.summary
    if not args.quiet:
        dp = (
            f", data parallel x{config.data_parallel_size}" if config.data_parallel_size > 1 else ""
        )
        print(
            f"{config.model} on {config.hardware} x{config.tp}{dp}, {config.scheduler.policy}, "
            f"max_num_seqs {config.scheduler.max_num_seqs}, "
            f"budget {config.scheduler.max_num_batched_tokens}, "
            f"prefix caching {'on' if config.cache.enable_prefix_caching else 'off'}"
        )
        print(kv_capacity_line(args.measured, config))
        left = unreplayed_settings(run.config)
        if left:
            print(
                f"recorded in {Path(args.measured) / 'summary.json'} but not settings of the "
                f"simulator, so not replayed: {', '.join(left)}"
            )
    print(format_comparison(comparison))
    sim = result.summary
    print(
        f"makespan     measured {measured['duration_s']:.1f} s, simulated {sim['duration_s']:.1f} s"
        f"\noutput tok/s measured {measured['output_throughput']:.0f}, "
        f"simulated {sim['output_throughput']:.0f}"
    )
    if args.json:
        rows = [dataclasses.asdict(e) for e in comparison.errors]
        Path(args.json).write_text(json.dumps({"errors": rows}, indent=2) + "\n")
    if args.out:
        result.write(Path(args.out))
    if args.report:
        runs = [
            load_run(args.measured, label="measured"),
            records_from_result(result, label="simulated", command=None),
        ]
        print(f"wrote report {write_report(runs, Path(args.report))}")
    return 0
