"""What a user sets about the host side of a step's price: the host's clock (``host_time``),
its copies over PCIe, and whether padding is priced. The device's constants live in
`HardwareSpec`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.decode_split import DEFAULT_SPLIT, check_split_mode
from sim.costmodel.host_time import ENGINE_KINDS, HostParams, host_params


@dataclass(frozen=True, slots=True)
class CostModelConfig:
    """The CPU's share of a step. How close kernels come to the datasheet is the hardware's
    business: those constants live in `HardwareSpec`.

    The host's clock is ``host_params()`` (``sim.costmodel.host_time``): ``host`` when given,
    else the documented set of ``engine``; for vLLM its per-step and per-sequence seconds and
    its async scheduling are the three fields below."""

    # Pinned-memory copies over PCIe reach ~25 of 32 GB/s (gen4).
    host_link_efficiency: float = 0.8
    # Scheduling, input preparation and the sampler's host sync per step: 1-3 ms in vLLM with
    # CUDA graphs on decode; 2 ms makes a batch-1 Llama-2-7B decode ~11 ms, as measured there.
    step_overhead_s: float = 2e-3
    # Per-sequence host work (block tables, sampling params) grows with the batch.
    per_sequence_overhead_s: float = 1e-5
    # vLLM overlaps that host work with the GPU's previous step by default since 0.14.0
    # ("async scheduling", its release notes): a step then lasts the longer of the two, not
    # their sum. False prices older engines (and ours), where the GPU waits for the host.
    async_scheduling: bool = True
    # A static batch's padding (prompts padded to the longest, finished members riding along)
    # is computed by engines that run a padded rectangle. False prices one that packs the
    # batch's real rows and computes no padding, as servesim's own engine does.
    price_padding: bool = True
    # Whose host clock a step pays (``host_time.ENGINE_KINDS``), or that exact set.
    engine: str = "vllm"
    host: HostParams | None = None
    # What sizes servesim's decode plan (``sim.costmodel.decode_chain``): the scheduler's
    # ``max_num_seqs`` (the largest decode graph) and the cache's ``max_model_len`` (each
    # graph's split plan; None: the model's).
    max_num_seqs: int = 256
    max_model_len: int | None = None
    # How the engine's decode kernel shares a context among its splits
    # (``core.decode_split.SPLIT_MODES``): the engine's own since 39ba127 (2026-11-27) by default;
    # ``sim validate`` reads it from the run (``"fixed"`` for runs recorded before).
    decode_split: str = DEFAULT_SPLIT
    # How many times longer this host takes over its work than the host the host set was
    # measured on (1.5: a host 1.5x slower; 0.8: faster). It stretches every second of the
    # host's clock (``HostParams.at_speed``), never the GPU's; on a CPU profile, whose one
    # processor runs both clocks, the whole step. ``sim validate`` can measure it from a run's
    # input preparation (``fidelity.host_speed``).
    host_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_KINDS:
            raise ValueError(
                f"CostModelConfig.engine must be one of {ENGINE_KINDS}, got {self.engine!r}"
            )
        if not 0 < self.host_link_efficiency <= 1:
            raise ValueError(
                "CostModelConfig.host_link_efficiency must be in (0, 1], "
                f"got {self.host_link_efficiency!r}"
            )
        check_split_mode(self.decode_split, "CostModelConfig.decode_split")
        if self.max_num_seqs < 1:
            raise ValueError(
                f"CostModelConfig.max_num_seqs must be >= 1, got {self.max_num_seqs!r}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(
                f"CostModelConfig.max_model_len must be >= 1 or None, got {self.max_model_len!r}"
            )
        if not (isinstance(self.host_slowdown, int | float) and 0 < self.host_slowdown < math.inf):
            raise ValueError(
                f"CostModelConfig.host_slowdown must be finite and > 0, got {self.host_slowdown!r}"
            )
        for field in ("step_overhead_s", "per_sequence_overhead_s"):
            value = getattr(self, field)
            if not value >= 0:
                raise ValueError(f"CostModelConfig.{field} must be >= 0, got {value!r}")

    def host_params(self) -> HostParams:
        """The host parameter set a step pays (see the class docstring), at
        ``host_slowdown``."""
        if self.host is not None:
            params = self.host
        elif self.engine == "vllm":
            params = HostParams(
                step_s=self.step_overhead_s,
                seq_s=self.per_sequence_overhead_s,
                async_scheduling=self.async_scheduling,
            )
        else:
            params = host_params(self.engine)
        return params.at_speed(self.host_slowdown)
