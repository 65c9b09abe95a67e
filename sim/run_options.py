"""The options every single-configuration command of ``python -m sim`` takes (``run``,
``compare``, ``validate --measured``, ``capacity``, a sweep's points) and the `RunConfig` they
build."""

from __future__ import annotations

import argparse

from engine.core.config import MEMORY_MODELS, PREEMPTION_MODES, RESERVATION_RULES
from engine.core.policies import POLICIES
from sim.deployment import ROUTERS
from sim.hardware_spec import HARDWARE_PRESETS
from sim.model_spec import MODEL_PRESETS
from sim.run import POLICY_CHOICES, RunConfig
from traces.loaders import FORMATS
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
    config = base_config_from_args(args)
    if args.reservation is not None and config.resolved_memory_model() == "paged":
        raise ValueError(
            f"--reservation {args.reservation}: applies to contiguous memory only, but "
            f"--policy {config.policy} runs paged memory here (add --memory contiguous)"
        )
    return config


def base_config_from_args(args: argparse.Namespace) -> RunConfig:
    """The `RunConfig` of the options as given, without `config_from_args`'s cross-option
    checks (``compare`` checks each --policies item itself)."""
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
