"""The options every single-configuration command of ``python -m sim`` takes (``run``,
``compare``, ``validate --measured``, ``capacity``, a sweep's points) and the `RunConfig` they
build."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from core.config import CacheConfig, SchedulerConfig
from core.flags import add_setting_flags, given_settings, unused_settings
from core.model.presets import load_model_spec, preset_names
from core.policies import POLICIES
from core.settings import build
from records.run_options import (
    add_out_argument,
    add_report_and_quiet_arguments,
    add_slo_arguments,
    slo_s,
)
from sim.deployment import ROUTERS
from sim.run import POLICY_CHOICES, RunConfig, replica_policy
from sim.specs.hardware import HARDWARE_PRESETS
from sim.specs.hardware_file import load_hardware
from sim.specs.vllm_defaults import USAGES, vllm_batch_defaults
from traces.options import (
    add_trace_arguments,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

DEFAULTS = RunConfig()


def add_run_arguments(parser: argparse.ArgumentParser, with_trace: bool = True) -> None:
    """The trace (unless ``with_trace`` is False), the serving settings, the model and its
    hardware, the run's switches and the deployment, in the order ``--help`` lists them."""
    if with_trace:
        add_trace_arguments(parser)
    _add_setting_arguments(parser)
    _add_model_arguments(parser)
    add_slo_arguments(parser)
    _add_run_switches(parser)
    deployment = parser.add_argument_group("deployment")
    _add_replica_arguments(deployment)
    _add_disagg_arguments(deployment)
    add_report_and_quiet_arguments(parser)


def _add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """The core's cache and scheduler settings, from their one table (``core.flags``)."""
    settings = parser.add_argument_group(
        "KV cache and scheduling (the settings python -m engine run takes too)"
    )
    add_setting_flags(
        settings,
        (CacheConfig, SchedulerConfig),
        choices={"policy": POLICY_CHOICES},
        help_extra={
            "policy": "; or disagg: separate prefill and decode replicas, each running "
            "--pool-policy, joined by a KV link"
        },
    )
    settings.add_argument(
        "--vllm-defaults",
        choices=USAGES,
        default=None,
        help="take --max-num-batched-tokens and --max-num-seqs, where not given, as vLLM picks "
        "them on this GPU: serve (vllm serve) or offline (its LLM class); H100/H200-class GPUs "
        "get 8192 (offline 16384) tokens and 1024 sequences, A100s and smaller 2048 (8192) and "
        "256, continuous batching a budget of max_model_len (docs/vllm_conformance.md); "
        f"default: servesim's own {DEFAULTS.scheduler.max_num_batched_tokens} and "
        f"{DEFAULTS.scheduler.max_num_seqs} everywhere",
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """What is simulated: the model, the GPU, the tensor-parallel degree and the cost model."""
    parser.add_argument(
        "--model",
        default=DEFAULTS.model,
        help=f"model preset ({', '.join(preset_names())}) or a Hugging Face config.json path "
        f"(default: {DEFAULTS.model})",
    )
    parser.add_argument(
        "--hardware",
        default=DEFAULTS.hardware,
        help=f"GPU preset ({', '.join(HARDWARE_PRESETS)}) or a hardware file (.json or .toml, "
        f"see docs/hardware_format.md) (default: {DEFAULTS.hardware})",
    )
    parser.add_argument(
        "--tp",
        type=positive_int,
        default=DEFAULTS.tp,
        help=f"tensor-parallel degree (default: {DEFAULTS.tp})",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="calibrated cost-model profile (JSON); default: analytic roofline",
    )


def _add_run_switches(parser: argparse.ArgumentParser) -> None:
    """The seed, the output folder, and how the simulation runs (results never differ)."""
    parser.add_argument(
        "--seed",
        type=non_negative_int,
        default=DEFAULTS.seed,
        help="recorded with the run (the simulation itself is deterministic)",
    )
    add_out_argument(parser)
    parser.add_argument(
        "--no-fast-forward",
        action="store_true",
        help="simulate every decode step one by one (slower; results are identical)",
    )
    parser.add_argument(
        "--no-async-scheduling",
        action="store_true",
        help="add the host's per-step work to the GPU's instead of overlapping them (vLLM "
        "before 0.14, and servesim's own engine); by default a step lasts the longer of the two",
    )
    parser.add_argument(
        "--host-slowdown",
        type=positive_float,
        default=DEFAULTS.host_slowdown,
        metavar="X",
        help="a host X times slower than the one the cost model's host set was measured on "
        "(0.8: faster); it stretches the host's clock, not the GPU's "
        f"(default: {DEFAULTS.host_slowdown})",
    )
    parser.add_argument(
        "--no-scheduling-lag",
        action="store_true",
        help="with async scheduling, schedule each step after the one before has ended, as a "
        "synchronous engine does; by default, as vLLM's engine core, a request arriving during "
        "a step joins the step after next, and a finished request holds its slot and KV "
        "through the next step's scheduling",
    )


def _add_replica_arguments(deployment: argparse._ArgumentGroup) -> None:
    """Colocated replicas, their router, and vLLM's data and expert parallelism."""
    deployment.add_argument(
        "--replicas",
        type=positive_int,
        default=DEFAULTS.num_replicas,
        help=f"colocated replicas behind the router (default: {DEFAULTS.num_replicas})",
    )
    deployment.add_argument(
        "--router",
        choices=ROUTERS,
        default=DEFAULTS.router,
        help=f"how arrivals are spread over replicas (default: {DEFAULTS.router})",
    )
    deployment.add_argument(
        "--data-parallel-size",
        type=positive_int,
        default=DEFAULTS.data_parallel_size,
        help="vLLM's data parallelism: ranks with their own scheduler and KV cache behind vLLM's "
        "balancer; a mixture of experts steps them together, its experts over all their GPUs "
        f"(default: {DEFAULTS.data_parallel_size})",
    )
    deployment.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="vLLM's expert parallelism (whole experts per GPU); recorded, priced as the same "
        "share of expert work per GPU",
    )


def _add_disagg_arguments(deployment: argparse._ArgumentGroup) -> None:
    """``--policy disagg``: the prefill and decode pools and the KV link between them."""
    deployment.add_argument(
        "--prefill-replicas",
        type=positive_int,
        default=DEFAULTS.num_prefill,
        help=f"--policy disagg: prefill pool size (default: {DEFAULTS.num_prefill})",
    )
    deployment.add_argument(
        "--decode-replicas",
        type=positive_int,
        default=DEFAULTS.num_decode,
        help=f"--policy disagg: decode pool size (default: {DEFAULTS.num_decode})",
    )
    deployment.add_argument(
        "--pool-policy",
        choices=tuple(POLICIES),
        default=DEFAULTS.pool_policy,
        help=f"--policy disagg: batching inside each pool (default: {DEFAULTS.pool_policy})",
    )
    deployment.add_argument(
        "--link-gbps",
        type=positive_float,
        default=DEFAULTS.link_bandwidth_gbps,
        help="--policy disagg: KV link bandwidth in Gb/s "
        f"(default: {DEFAULTS.link_bandwidth_gbps})",
    )
    deployment.add_argument(
        "--link-latency-us",
        type=non_negative_float,
        default=DEFAULTS.link_latency_us,
        help=f"--policy disagg: KV link latency in us (default: {DEFAULTS.link_latency_us})",
    )
    deployment.add_argument(
        "--link-parallel",
        type=positive_int,
        default=DEFAULTS.link_parallel_transfers,
        help="--policy disagg: transfers the link carries at once; the "
        f"rest queue (default: {DEFAULTS.link_parallel_transfers})",
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return checked_options(build(RunConfig, with_vllm_defaults(run_settings(args), args)), args)


def with_vllm_defaults(settings: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``settings``, and under ``--vllm-defaults`` the budgets vLLM would pick where they lack
    them (`vllm_default_settings`)."""
    usage = getattr(args, "vllm_defaults", None)
    extra = vllm_default_settings(settings, usage) if usage is not None else {}
    return {**settings, **extra}


def checked_options(config: RunConfig, args: argparse.Namespace) -> RunConfig:
    """``config``, once the options that apply to only some configs are known to apply."""
    if args.reservation is not None and config.resolved_memory_model() == "paged":
        raise ValueError(
            f"--reservation {args.reservation}: applies to contiguous memory only, but "
            f"--policy {config.scheduler.policy} runs paged memory here "
            "(add --memory-model contiguous)"
        )
    return config


def unused_options(config: RunConfig, args: argparse.Namespace) -> list[str]:
    """The options given that ``config``'s policy or deployment never reads, each with why:
    for a command to say so rather than run as if they had been heard."""
    scheduler = config.scheduler
    unused = unused_settings(given_settings(args), config.pools_policy, scheduler.preemption_mode)
    if getattr(args, "vllm_defaults", None) and config.pools_policy in ("static", "dynamic"):
        unused.append(f"--vllm-defaults: vLLM has no {config.pools_policy} batching")
    disagg = config.scheduler.policy == "disagg"
    if not disagg:
        for flag, name in _DISAGG_OPTIONS:
            if getattr(config, name) != getattr(DEFAULTS, name):
                unused.append(f"{flag}: applies to --policy disagg only")
    elif config.num_replicas != DEFAULTS.num_replicas:
        unused.append(
            "--replicas: counts colocated replicas; --policy disagg sizes its pools with "
            "--prefill-replicas and --decode-replicas"
        )
    if config.enable_expert_parallel and not load_model_spec(config.model).is_moe:
        unused.append(f"--enable-expert-parallel: {config.model} has no experts")
    routed = config.num_prefill if disagg else config.num_replicas
    if config.router != DEFAULTS.router and (routed == 1 or config.data_parallel_size > 1):
        unused.append(
            "--router: one replica takes every arrival"
            if config.data_parallel_size == 1
            else "--router: data-parallel ranks take their arrivals from vLLM's balancer"
        )
    if not config.scheduling_lag and not config.async_scheduling:
        unused.append("--no-scheduling-lag: the lag is async scheduling's (--no-async-scheduling)")
    return unused


_DISAGG_OPTIONS = (
    ("--prefill-replicas", "num_prefill"),
    ("--decode-replicas", "num_decode"),
    ("--pool-policy", "pool_policy"),
    ("--link-gbps", "link_bandwidth_gbps"),
    ("--link-latency-us", "link_latency_us"),
    ("--link-parallel", "link_parallel_transfers"),
)


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `RunConfig` settings the options give, by field name. An option whose value is None
    gives none: left out where its default is None (the core's settings always;
    every option after `leave_defaults_to_the_run`)."""
    values = {
        "model": args.model,
        "hardware": args.hardware,
        "tp": args.tp,
        "profile": args.profile,
        "slo_ttft_s": slo_s(args.slo_ttft),
        "slo_tpot_s": slo_s(args.slo_tpot),
        "seed": args.seed,
        "fast_forward": _unless(args.no_fast_forward),
        "async_scheduling": _unless(args.no_async_scheduling),
        "host_slowdown": args.host_slowdown,
        "scheduling_lag": _unless(args.no_scheduling_lag),
        "data_parallel_size": args.data_parallel_size,
        "enable_expert_parallel": args.enable_expert_parallel,
        "num_replicas": args.replicas,
        "router": args.router,
        "num_prefill": args.prefill_replicas,
        "num_decode": args.decode_replicas,
        "pool_policy": args.pool_policy,
        "link_bandwidth_gbps": args.link_gbps,
        "link_latency_us": args.link_latency_us,
        "link_parallel_transfers": args.link_parallel,
    }
    return {**given_settings(args), **{k: v for k, v in values.items() if v is not None}}


def leave_defaults_to_the_run(parser: argparse.ArgumentParser) -> None:
    """Every run option of ``parser`` left out reads None, so that `run_settings` gives only
    what the command line said (``measured validate`` fills the rest from the run's record).
    The help still names the defaults: they are written into it, not read from the parser."""
    parser.set_defaults(**dict.fromkeys(_RUN_OPTION_DESTS))


_RUN_OPTION_DESTS = (
    "model",
    "hardware",
    "tp",
    "seed",
    "no_fast_forward",
    "no_async_scheduling",
    "host_slowdown",
    "no_scheduling_lag",
    "replicas",
    "router",
    "data_parallel_size",
    "enable_expert_parallel",
    "prefill_replicas",
    "decode_replicas",
    "pool_policy",
    "link_gbps",
    "link_latency_us",
    "link_parallel",
)


def _unless(switch: bool | None) -> bool | None:
    """A ``--no-X`` switch's setting: None where the switch reads None (left to the run)."""
    return None if switch is None else not switch


def vllm_default_settings(settings: Mapping[str, Any], usage: str) -> dict[str, int]:
    """The budgets vLLM would pick for the run ``settings`` describe (RunConfig settings by
    name; those absent take RunConfig's defaults), as settings: only those ``settings`` lack.
    None for a policy vLLM does not have (static, dynamic batching)."""
    defaults = DEFAULTS
    policy = replica_policy(
        settings.get("policy", defaults.scheduler.policy),
        settings.get("pool_policy", defaults.pool_policy),
    )
    if policy not in ("continuous", "chunked"):
        return {}
    hardware = load_hardware(str(settings.get("hardware", defaults.hardware)))
    max_model_len = settings.get("max_model_len")
    if max_model_len is None:
        max_model_len = load_model_spec(str(settings.get("model", defaults.model))).max_model_len
    budget, seqs = vllm_batch_defaults(hardware, usage, policy == "chunked", int(max_model_len))
    budget = int(settings.get("max_num_batched_tokens", budget))
    chosen = {"max_num_batched_tokens": budget, "max_num_seqs": min(seqs, budget)}
    return {name: value for name, value in chosen.items() if name not in settings}
