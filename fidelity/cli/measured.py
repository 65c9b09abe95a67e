"""``python -m sim measured import`` (a measured run into our run directory and replay trace)
and ``python -m sim measured validate RUN_DIR`` (replay it, print the per-request error)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
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
    workload = importer.add_mutually_exclusive_group()
    workload.add_argument(
        "--workload",
        default=None,
        metavar="FILE",
        help="workload JSONL (input_toks, output_toks, arrival_time_ns, input_tok_ids): the "
        "prompt token ids the replay's prefix caching hits on; llmservingsim: default is the "
        "file meta.json's dataset_path names, looked for from the run folder's parent upwards "
        "(an error when it is not found)",
    )
    workload.add_argument(
        "--no-workload",
        action="store_true",
        help="import the measured lengths and arrivals alone, without the workload the run "
        "names: the trace then has no prompt token ids, so prefix caching has nothing to hit on",
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
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a directory")
    importer = IMPORTERS[args.format]
    run = importer(args.source, args.workload, args.vllm_log, without_workload=args.no_workload)
    for warning in run.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    root = write_measured_run(run, args.out)
    print(f"wrote {root}/requests.csv, summary.json, {TRACE_FILE} ({len(run.requests)} requests)")
    if run.workload is not None:
        print(f"prompt token ids: from {run.workload}")
    else:
        print("prompt token ids: none (no workload read): prefix caching has nothing to hit on")
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
    run = load_run(root)
    require_measured_run(root)
    recorded = {k: v for k, v in run.config.items() if k in _SETTINGS}
    if recorded.get("hardware") == HARDWARE_FILE:
        recorded["hardware"] = str(root / HARDWARE_FILE)
    settings = {**recorded, **given}
    if vllm_defaults is not None:
        settings |= vllm_default_settings(settings, vllm_defaults)
    _check_recorded_prefix_caching(settings, recorded, given, root)
    return build(RunConfig, settings)


def require_measured_run(run_dir: str | Path) -> None:
    """Refuse a run directory that `measured import` did not write (a simulator's run, say),
    naming what it lacks: the ``measured`` record in summary.json and the trace to replay."""
    root = Path(run_dir)
    lacks = []
    if not _measured_payload(root):
        lacks.append("its summary.json has no 'measured' record")
    if not (root / TRACE_FILE).is_file():
        lacks.append(f"it has no {TRACE_FILE} to replay")
    if lacks:
        raise ValueError(
            f"{root} is not a measured run: {' and '.join(lacks)} (a simulator run's "
            "directory?). A measured run is what `python -m sim measured import SOURCE --format "
            "llmservingsim|vllm-bench --out RUN_DIR` writes from a real engine's run"
        )


def _check_recorded_prefix_caching(
    settings: Mapping[str, Any],
    recorded: Mapping[str, Any],
    given: Mapping[str, Any],
    root: Path,
) -> None:
    """Refuse, saying where it came from, prefix caching that the run's record turns on (vLLM's
    default) but the replay's memory cannot hold: a policy given (static, dynamic batching)
    whose default is contiguous memory, or a contiguous memory model. (The core's own error
    would blame a flag the user never gave.)"""
    if "enable_prefix_caching" in given or not recorded.get("enable_prefix_caching"):
        return
    try:
        config = build(RunConfig, {**settings, "enable_prefix_caching": False})
    except ValueError:
        return  # another problem, which building the replay's config reports
    if config.resolved_memory_model() != "contiguous":
        return
    if "memory_model" in given:
        memory = "--memory-model contiguous"
    elif config.cache.memory_model is not None:
        memory = "the recorded memory_model 'contiguous'"
    else:
        memory = f"policy {config.pools_policy!r}, which runs contiguous memory by default,"
    raise ValueError(
        f"enable_prefix_caching is on in the run's record ({root / 'summary.json'}: config), "
        f"not given here, and {memory} has no prefix cache: add --memory-model paged to replay "
        "it with prefix caching, or --no-enable-prefix-caching to replay it without"
    )


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
    """The ``measured`` record of the run's summary.json (empty where it has none)."""
    path = Path(run_dir) / "summary.json"
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a JSON object ({error})") from error
    measured = payload.get("measured") if isinstance(payload, dict) else None
    return measured if isinstance(measured, dict) else {}


def _no_prompt_contents_note(run_dir: str | Path, config: RunConfig) -> str | None:
    """Where the replay caches prefixes but the import read no workload: nothing to hit on."""
    measured = _measured_payload(run_dir)
    if not config.cache.enable_prefix_caching or measured.get("workload", "") is not None:
        return None
    return (
        f"{Path(run_dir) / TRACE_FILE} has no prompt token ids (imported without a workload), "
        "so prefix caching has no prompt contents to hit on; import again with --workload FILE"
    )


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
        note = _no_prompt_contents_note(args.measured, config)
        if note is not None:
            print(f"note: {note}", file=sys.stderr)
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
