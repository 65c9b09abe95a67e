"""How a calibrated profile prices the host's clock: which clock gives a step's GPU time (the
profile's tables, or the roofline where the tables are CUDA-event spans that hold the host's
kernel launches too), and the host parameters, stored in the profile (version 5) or fitted to
its whole steps (``sim.costmodel.host_fit``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sim.costmodel.host_fit import HostFit, StepSample, fit_host
from sim.costmodel.host_time import (
    ENGINE_KINDS,
    MIN_FIT_STEPS,
    SERVESIM_EAGER_HOST,
    HostParams,
    HostTimeModel,
    host_args,
    host_params,
)
from sim.costmodel.profile import Profile, StepTiming
from sim.costmodel.profile_v5 import GPU_CLOCKS
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.step_fit import prepare_table
from sim.costmodel.step_shape import StepShape


@dataclass(frozen=True, slots=True)
class CalibratedHost:
    """The host clock of one calibrated model: the clock its GPU time comes from (GPU_CLOCKS:
    ``tables``, the profile's op tables, each timing the device alone, or on a CPU the
    processor that runs both clocks in turn; ``roofline``, the analytic kernels, when the tables
    are spans from a GPU engine's first launch to its last kernel, which an eager host's
    launching fills as much as the kernels do), the host model, the scale on the GPU time, and
    the fit that made them (None when the profile stores them)."""

    gpu_clock: str
    model: HostTimeModel
    device_scale: float = 1.0
    fit: HostFit | None = None

    def __post_init__(self) -> None:
        if self.gpu_clock not in GPU_CLOCKS:
            raise ValueError(f"gpu_clock must be one of {GPU_CLOCKS}, got {self.gpu_clock!r}")


def is_cpu_profile(profile: Profile) -> bool:
    return profile.device.get("name", "").lower().startswith("cpu")


def gpu_clock_of(profile: Profile) -> str:
    """``roofline`` for a GPU profile whose tables are CUDA-event spans (every profile before
    version 5, and version 5's ``tables_time: span``); ``tables`` otherwise."""
    if profile.gpu_clock is not None:
        return profile.gpu_clock
    if is_cpu_profile(profile) or profile.tables_time == "device":
        return "tables"
    return "roofline" if profile.timer == "cuda_events" else "tables"


def engine_kind_of(profile: Profile) -> str:
    """The engine kind the profile names (``engine.kind``); before version 5, servesim's eager
    engine (the only one there was)."""
    kind = (profile.engine or {}).get("kind", "servesim-eager")
    if kind not in ENGINE_KINDS:
        raise ValueError(
            f"{profile.path}: field 'engine.kind': must be one of {ENGINE_KINDS}, got {kind!r}"
        )
    return kind


def start_params(profile: Profile, fallback: RooflineCostModel) -> HostParams:
    """The documented host set of the profile's engine, as a fit's starting point: the decode
    kernel's split rule where the engine ran the Triton kernels on a GPU (two programs per SM),
    a CPU's host and kernels in series (overlap loss 1)."""
    kind = engine_kind_of(profile)
    params = SERVESIM_EAGER_HOST if kind == "vllm" else host_params(kind)
    triton = (profile.engine or {}).get("backend") == "triton"
    if is_cpu_profile(profile):
        return replace(params, overlap_loss=1.0, split_programs=0)
    split = 2 * fallback.hardware.num_sms if triton else 0
    return replace(params, split_programs=split)


def step_shape(step: StepTiming) -> StepShape:
    """A profile step as a shape (decodes at their mean context when the file gives no list)."""
    contexts = step.decode_context_tokens
    if contexts is None:
        mean = step.sum_decode_context_tokens / step.num_decode_seqs if step.num_decode_seqs else 0
        contexts = (max(1, round(mean)),) * step.num_decode_seqs
    return StepShape(prefill_chunks=step.prefill_chunks, decode_context_tokens=contexts)


def run_host_params(profile: Profile, fallback: RooflineCostModel) -> HostParams:
    """The host set of a profile that measured no host: that of the engine it names
    (``engine.kind``) when that is not the run's, else the run's own (``CostModelConfig.
    host_params()``: vLLM's by default, with the run's async scheduling and overrides)."""
    config = fallback.config
    kind = (profile.engine or {}).get("kind")
    if kind is None or kind == config.engine:
        return config.host_params()
    return host_params(engine_kind_of(profile)).at_speed(config.host_slowdown)


def roofline_device_s(fallback: RooflineCostModel, shape: StepShape) -> float:
    """The roofline's GPU time of ``shape``: its terms but the host's."""
    return sum(fallback.step_terms(shape)[:-1])


def calibrated_host(
    profile: Profile, fallback: RooflineCostModel, tables_device_s: Callable[[StepShape], float]
) -> CalibratedHost | None:
    """The host clock of a GPU profile: its stored host set, or one fitted to its whole steps,
    with the GPU time of each from the roofline or from ``tables_device_s`` (the profile's
    tables) as ``gpu_clock_of`` says; for a profile that timed no step (an imported table of
    kernels), the run's host set (``run_host_params``) on the tables' GPU time. None for a CPU
    profile (the joint fit of ``CalibratedCostModel`` fits its one clock), and for a profile
    with a measured ``prepare`` table and no steps, or too few steps to fit a host set (both
    keep the step overhead of version 4 and before)."""
    clock = gpu_clock_of(profile)
    layers, heads = fallback.model.num_layers, fallback.model.kv_heads_per_shard(fallback.tp)
    slowdown = fallback.config.host_slowdown  # (what the profile's host measured is at 1)
    if profile.host is not None:
        model = HostTimeModel(profile.host.at_speed(slowdown), layers, heads)
        return CalibratedHost(clock, model, profile.host_device_scale)
    if is_cpu_profile(profile):
        return None
    timed = [step for step in profile.steps if step.measured_s > 0]
    if not profile.steps and "prepare" not in profile.ops:
        params = run_host_params(profile, fallback)
        return CalibratedHost("tables", HostTimeModel(params, layers, heads))
    if len(timed) < MIN_FIT_STEPS:
        return None
    samples = []
    for step in timed:
        shape = step_shape(step)
        device = (
            roofline_device_s(fallback, shape) if clock == "roofline" else tables_device_s(shape)
        )
        tokens = len(shape.decode_context_tokens) + sum(n for n, _ in shape.prefill_chunks)
        args = host_args(shape, profile.block_size)
        samples.append(StepSample(*args, device, step.measured_s, step.host_s, tokens))
    fit = fit_host(samples, start_params(profile, fallback), layers, heads)
    model = HostTimeModel(fit.params.at_speed(slowdown), layers, heads)
    return CalibratedHost(clock, model, fit.device_scale, fit)


def measured_prepare(profile: Profile) -> tuple[tuple[int, float], ...] | None:
    """The input preparation of the profile's decode-only whole steps by batch size
    (``step_fit.prepare_table``), where each step stores it on the steps' own clock (profiles
    since 2026-11-28); None otherwise.

    Why measured and not fitted: the preparation is not linear in the batch. On the CPU engine
    it jumps from 224 to 654 us between 8 and 9 decodes (past
    ``kernels.torch_attention.ROW_PATH_MAX_SEQS`` the attention's gather plan is built in it),
    and a fixed and a per-sequence cost fitted over batches of 1-64 priced the CPU runs' decode
    steps of 9 or more 8-12% fast (sets 8 and 9 of
    ``benchmarks/results/cpu-calibrations-2026-11-28``)."""
    engine = profile.engine or {}
    if engine.get("prepare_clock", "wall") != engine.get("clock", "wall"):
        return None
    decode = [s for s in profile.steps if s.num_decode_seqs and not s.prefill_chunks]
    if not decode or any(not s.prepare_s for s in decode):
        return None
    return prepare_table(
        [s.num_decode_seqs for s in decode], [float(s.prepare_s or 0.0) for s in decode]
    )
