"""One simulation run: its configuration (``RunConfig``), the wiring from specs to the shared
core and the cost model (``simulate``), and its results and files (``RunResult``)."""

from __future__ import annotations

import gc
import importlib.metadata
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import simpy
from tqdm import tqdm

from core.config import CacheConfig, MemoryModel, SchedulerConfig, check_serving
from core.model.presets import load_model_spec
from core.model.spec import ModelSpec
from core.policies import POLICIES, check_budgets, check_policy
from core.request import Request
from core.scheduler import Scheduler
from core.settings import flat_settings
from records.metrics import by_priority, summarize
from records.overload import Overload, request_overload
from records.run_dir import write_run_dir
from records.schema import StepRecorder, request_frame
from sim.costmodel.base import CostModel, CostModelConfig, make_cost_model
from sim.costmodel.calibrated import CalibratedCostModel
from sim.costmodel.expert_parallel import (
    ExpertParallelCost,
    check_data_parallel,
    weight_bytes_per_gpu,
)
from sim.costmodel.roofline import RooflineCostModel
from sim.data_parallel import LockstepGroup, run_lockstep
from sim.deployment import ROUTERS, DeploymentOutput, KvLink, Transfer, run_deployment
from sim.executor import CostModelExecutor
from sim.simulator import Replica
from sim.specs.hardware import HardwareSpec
from sim.specs.hardware_file import hardware_is_file, load_hardware
from sim.specs.kv_capacity import derive_num_blocks
from traces.schema import Trace

POLICY_CHOICES = (*POLICIES, "disagg")
"""What ``--policy`` offers: the core's policies, and ``disagg`` (prefill and decode pools of
replicas, each running ``pool_policy``, joined by a KV link)."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything that defines a simulated deployment: the core's KV cache and scheduler
    settings (``cache``, ``scheduler``; its ``policy`` may also be ``disagg``) and the
    simulator's own fields. Its settings read and write as one flat dict
    (`core.settings.build`, `flat_settings`); the CLI's defaults are these."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    model: str = "Llama-3-8B"
    hardware: str = "H100-SXM"
    tp: int = 1
    profile: str | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    seed: int = 0
    # Skip over runs of identical decode steps in one go (results are identical).
    fast_forward: bool = True
    # Price each step as max(GPU work, host work) as vLLM >= 0.14 does by default; False adds
    # them, as older vLLM and servesim's own engine do (see `CostModelConfig.async_scheduling`).
    async_scheduling: bool = True
    # With async scheduling, vLLM schedules each step before the one before it ends: a request
    # that arrives while a step runs joins the step after next (sim.async_admission), and a
    # finished request keeps its slot and KV blocks through the next step's scheduling
    # (Scheduler's release_finished_late). False: as a synchronous engine, and as Vidur and
    # LLMServingSim model vLLM.
    scheduling_lag: bool = True
    # The host against the one the cost model's host set was measured on: how many times
    # slower (`CostModelConfig.host_slowdown`: the host's clock only, not the GPU's).
    host_slowdown: float = 1.0
    # Data parallelism as vLLM's: ranks with their own scheduler and KV cache behind vLLM's
    # balancer; a mixture of experts steps them in lockstep, its experts over all their GPUs.
    data_parallel_size: int = 1
    # vLLM's --enable-expert-parallel: whole experts per GPU rather than shards of each; the
    # same work and bytes per GPU in expectation, so it prices the same (recorded as given).
    enable_expert_parallel: bool = False
    # Deployment: colocated replicas behind a router, or (policy "disagg") two pools.
    num_replicas: int = 1
    router: str = "round_robin"
    num_prefill: int = 1
    num_decode: int = 1
    pool_policy: str = "continuous"  # the batching policy inside each disagg pool
    link_bandwidth_gbps: float = 400.0  # one 400 Gb/s InfiniBand NDR port
    link_latency_us: float = 10.0
    link_parallel_transfers: int = 1

    def __post_init__(self) -> None:
        check_policy(self.scheduler.policy, also=("disagg",))
        check_policy(self.pool_policy, field="pool_policy")
        check_serving(self.cache, self.scheduler)
        check_budgets(self.scheduler, self.pools_policy)
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        for name in (
            "num_replicas",
            "num_prefill",
            "num_decode",
            "link_parallel_transfers",
            "data_parallel_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        # ``not x > 0`` (rather than ``x <= 0``) is also true for NaN.
        for name in ("link_bandwidth_gbps", "slo_ttft_s", "slo_tpot_s", "host_slowdown"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not 0 <= self.link_latency_us < math.inf:
            raise ValueError(
                f"link_latency_us must be a finite number >= 0, got {self.link_latency_us!r}"
            )
        policy = self.scheduler.policy
        if self.data_parallel_size > 1 and (policy == "disagg" or self.num_replicas > 1):
            raise ValueError(
                "data_parallel_size > 1 is one deployment of its own: not with policy 'disagg' "
                f"or num_replicas > 1 (got policy {policy!r}, {self.num_replicas} replicas)"
            )

    @property
    def pools_policy(self) -> str:
        """The policy every replica's scheduler runs: ``pool_policy`` under ``disagg``."""
        return replica_policy(self.scheduler.policy, self.pool_policy)

    def resolved_memory_model(self) -> MemoryModel:
        """``memory_model``, or, left None, the default of the policy the replicas run."""
        return self.cache.memory_model or POLICIES[self.pools_policy].default_memory_model


def replica_policy(policy: str, pool_policy: str) -> str:
    """The policy a run of ``policy`` gives every replica's scheduler: ``pool_policy`` under
    ``disagg``, whose pools are replicas of their own."""
    return pool_policy if policy == "disagg" else policy


def servesim_version() -> str:
    try:
        return importlib.metadata.version("servesim")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class RunResult:
    config: RunConfig
    trace_name: str
    memory_model: MemoryModel
    num_blocks: int
    requests: list[Request]
    steps: StepRecorder
    summary: dict[str, float | int | None]
    num_skipped_rows: int = 0
    notes: list[str] = field(default_factory=list)
    trace_stats: dict[str, float] = field(default_factory=dict)
    command: str | None = None
    transfers: list[Transfer] = field(default_factory=list)
    # A hardware file's own ``name`` (None for a preset, whose name is ``config.hardware``).
    hardware_name: str | None = None
    # Set when more load was offered than the deployment served (records.overload).
    overload: Overload | None = None
    # Each priority class's summary, where the trace has more than one (records.metrics).
    priority_summary: dict[str, dict[str, float | int | None]] = field(default_factory=dict)

    @property
    def mean_real_token_share(self) -> float | None:
        """Share of allocated KV slots (real + internal + reserved) holding real tokens, over
        all steps (the vLLM paper's Figure 2 metric); None if nothing was ever allocated."""
        c = self.steps.columns
        real = sum(c["real_token_slots"])
        used = real + sum(c["internal_fragmentation_slots"]) + sum(c["reservation_waste_slots"])
        return real / used if used else None

    def write(self, out: Path) -> None:
        write_run_dir(out, self.requests_frame(), self.steps.to_frame(), self.payload())

    def payload(self) -> dict[str, Any]:
        """What ``summary.json`` holds for this run (``hardware_name`` only where a hardware
        file named the GPU, ``overload`` only where the run was overloaded)."""
        named: dict[str, Any] = {"hardware_name": self.hardware_name} if self.hardware_name else {}
        if self.overload is not None:  # (only a run that went wrong gains the key)
            named["overload"] = self.overload.as_dict()
        if self.priority_summary:  # (only a trace with priority classes)
            named["by_priority"] = self.priority_summary
        return named | {
            "trace": self.trace_name,
            "config": flat_settings(self.config),
            "memory_model": self.memory_model,
            "num_blocks": self.num_blocks,
            "num_skipped_rows": self.num_skipped_rows,
            "notes": self.notes,
            "mean_real_token_share": self.mean_real_token_share,
            "summary": self.summary,
            "trace_stats": self.trace_stats,
            "command": self.command,
            "servesim_version": servesim_version(),
        }

    def requests_frame(self) -> pd.DataFrame:
        return request_frame(self.requests, self.transfers)


# The cyclic garbage collector's first generation runs after this many net allocations of
# container objects while a simulation runs, instead of Python's 700. A simulation allocates
# millions of short-lived objects that reference counting frees, and keeps every request it has
# seen; each full collection walks them all. At 100k requests of bench_vidur (2026-11-26):
# 8 full collections took 0.72-0.85 s of 15-33 s, 2 take 0.05 s, with the same peak memory.
# 100,000 rather than 20,000 (later, the compiled build): 6 collections instead of 30 while
# simulating, 0.07 s instead of 0.13-0.14 s of 5 s, the same peak memory (both policies).
_GC_THRESHOLD = 100_000


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect cyclic garbage less often while a simulation runs (a higher setting is kept)."""
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], _GC_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def _derived_num_blocks(
    model: ModelSpec, hardware: HardwareSpec, config: RunConfig, lockstep: bool
) -> int:
    """vLLM's KV blocks per rank for ``config``; a lockstep data-parallel MoE's GPU holds
    its share of every rank's experts. A model that does not fit names the hardware file
    where one describes the GPU (its name may be the preset it starts from)."""
    try:
        return derive_num_blocks(
            model,
            hardware,
            config.tp,
            config.cache.block_size,
            config.cache.gpu_memory_utilization,
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
            max_num_seqs=config.scheduler.max_num_seqs,
            weight_bytes=weight_bytes_per_gpu(model, config.tp, config.data_parallel_size)
            if lockstep
            else None,
        )
    except ValueError as error:
        if not hardware_is_file(config.hardware):
            raise
        raise ValueError(f"{config.hardware}: {error}") from None


def _run_lockstep(
    trace: Trace,
    config: RunConfig,
    configs: tuple[CacheConfig, SchedulerConfig],
    cost_model: Any,
    recorder: StepRecorder,
    on_done: Callable[[int], None] | None,
) -> DeploymentOutput:
    """A mixture of experts on ``data_parallel_size`` ranks stepping together (vLLM's
    data-parallel attention with its experts over every rank's GPUs)."""
    if isinstance(cost_model, RooflineCostModel):
        cost = ExpertParallelCost(cost_model, config.data_parallel_size)
    elif isinstance(cost_model, CalibratedCostModel):  # its tables price each rank's step
        cost = ExpertParallelCost(cost_model.fallback, config.data_parallel_size, cost_model)
    else:
        raise ValueError(
            "data_parallel_size > 1 with a mixture of experts is priced by the roofline or a "
            f"--profile, not by {type(cost_model).__name__}"
        )
    env = simpy.Environment()
    lag = config.scheduling_lag and cost_model.async_scheduling
    schedulers = [
        Scheduler(*configs, release_finished_late=lag) for _ in range(config.data_parallel_size)
    ]
    group = LockstepGroup(
        env,
        schedulers,
        cost,
        recorder,
        config.cache.block_size,
        on_done,
        async_scheduling=lag,
    )
    requests, end_s = run_lockstep(trace, group, on_done)
    return DeploymentOutput(requests=requests, end_s=end_s, transfers=[])


def simulate(
    trace: Trace,
    config: RunConfig,
    progress: bool = False,
    wrap_executor: Callable[[CostModelExecutor], Any] | None = None,
    cost_config: CostModelConfig | None = None,
) -> RunResult:
    """Run ``trace`` through the deployment ``config`` describes. ``wrap_executor``, if given,
    wraps each replica's executor (validation records the batches it prices this way);
    ``cost_config`` replaces the roofline's default efficiencies (for what-if studies), its
    own ``async_scheduling`` included; without it, ``config.async_scheduling`` chooses."""
    model = load_model_spec(config.model)
    hardware = load_hardware(config.hardware)
    dp = config.data_parallel_size
    check_data_parallel(model, config.tp, dp)
    lockstep = dp > 1 and model.is_moe
    scheduler_config = replace(config.scheduler, policy=config.pools_policy)
    cache = _resolved_cache(model, hardware, config, scheduler_config, lockstep)
    if cost_config is None:
        cost_config = CostModelConfig(
            async_scheduling=config.async_scheduling, host_slowdown=config.host_slowdown
        )
    cost_model = make_cost_model(
        model, hardware, config.tp, config.profile, cost_config, block_size=config.cache.block_size
    )
    # Progress counts requests that finished or were rejected, so it reaches 100% only once
    # the backlog has drained (not when the last request arrives).
    bar = tqdm(
        total=len(trace.requests),
        unit="req",
        desc="requests done",
        disable=not (progress and sys.stderr.isatty()),
    )
    recorder = StepRecorder()
    try:
        with _fewer_collections():
            on_done = None if bar.disable else bar.update
            configs = (cache, scheduler_config)
            if lockstep:
                output = _run_lockstep(trace, config, configs, cost_model, recorder, on_done)
            else:
                output = _run_replicas(
                    trace, config, configs, model, cost_model, recorder, wrap_executor, on_done
                )
    finally:
        bar.close()
    return _run_result(trace, config, hardware, cache, recorder, output)


def _resolved_cache(
    model: ModelSpec,
    hardware: HardwareSpec,
    config: RunConfig,
    scheduler_config: SchedulerConfig,
    lockstep: bool,
) -> CacheConfig:
    """``config.cache`` resolved for this model and GPU: its KV blocks sized as vLLM sizes
    them unless given, its memory model and its maximum length."""
    return config.cache.resolve(
        scheduler_config,
        size_blocks=lambda: _derived_num_blocks(model, hardware, config, lockstep),
        block_bytes=model.kv_bytes_per_block(config.cache.block_size, config.tp),
        memory_model=config.resolved_memory_model(),
        model=(config.model, model.max_model_len),
    )


def _run_replicas(
    trace: Trace,
    config: RunConfig,
    configs: tuple[CacheConfig, SchedulerConfig],
    model: ModelSpec,
    cost_model: CostModel,
    recorder: StepRecorder,
    wrap_executor: Callable[[CostModelExecutor], Any] | None,
    on_done: Callable[[int], None] | None,
) -> DeploymentOutput:
    """Replicas that each step on their own: colocated behind the router, data-parallel ranks
    of a dense model, or disaggregated prefill and decode pools joined by a KV link; each
    replica's steps priced by ``cost_model``."""
    cache, scheduler_config = configs
    dp = config.data_parallel_size

    def make_replica(env: simpy.Environment, index: int, pool: str, steps: StepRecorder) -> Replica:
        executor: Any = CostModelExecutor(cost_model)
        if wrap_executor is not None:
            executor = wrap_executor(executor)
        lag = config.scheduling_lag and cost_model.async_scheduling
        scheduler = Scheduler(cache, scheduler_config, release_finished_late=lag)
        return Replica(
            env,
            index,
            pool,
            scheduler,
            executor,
            steps,
            config.fast_forward,
            lag,
        )

    bandwidth = config.link_bandwidth_gbps * 1e9 / 8
    latency = config.link_latency_us * 1e-6

    def make_link(env: simpy.Environment) -> KvLink:
        return KvLink(
            env,
            bandwidth,
            latency,
            lambda tokens: cost_model.kv_transfer_time_s(tokens, bandwidth, latency),
            model.kv_bytes_per_token(),
            config.link_parallel_transfers,
        )

    return run_deployment(
        trace,
        make_replica,
        recorder,
        num_replicas=dp if dp > 1 else config.num_replicas,
        router="data_parallel" if dp > 1 else config.router,
        disagg=(config.num_prefill, config.num_decode)
        if config.scheduler.policy == "disagg"
        else None,
        link=make_link,
        on_done=on_done,
    )


def _run_result(
    trace: Trace,
    config: RunConfig,
    hardware: HardwareSpec,
    cache: CacheConfig,
    recorder: StepRecorder,
    output: DeploymentOutput,
) -> RunResult:
    """The run's summary and everything its files record."""
    summary = summarize(output.requests, output.end_s, config.slo_ttft_s, config.slo_tpot_s)
    if config.scheduler.policy == "disagg":
        summary["kv_transfer_bytes"] = sum(t.num_bytes for t in output.transfers)
        summary["num_kv_transfers"] = len(output.transfers)
    return RunResult(
        config=config,
        trace_name=trace.name,
        memory_model=cache.resolved_memory_model,
        num_blocks=cache.resolved_num_blocks,
        requests=output.requests,
        steps=recorder,
        summary=summary,
        num_skipped_rows=trace.num_skipped,
        notes=[*trace.skipped_rows(), *trace.notes],
        trace_stats=trace.length_stats(),
        transfers=output.transfers,
        hardware_name=hardware.name if hardware_is_file(config.hardware) else None,
        overload=request_overload(output.requests, output.end_s),
        priority_summary=by_priority(output.requests, output.end_s),
    )
