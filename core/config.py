"""Frozen configuration of the KV cache and the scheduler, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MemoryModel = Literal["paged", "contiguous"]
ReservationRule = Literal["max", "pow2", "oracle"]
PreemptionMode = Literal["recompute", "swap"]
ParallelSampling = Literal["fan_out", "fork"]

MEMORY_MODELS: tuple[MemoryModel, ...] = ("paged", "contiguous")
RESERVATION_RULES: tuple[ReservationRule, ...] = ("max", "pow2", "oracle")
PREEMPTION_MODES: tuple[PreemptionMode, ...] = ("recompute", "swap")
PARALLEL_SAMPLING: tuple[ParallelSampling, ...] = ("fan_out", "fork")
"""How a request with n > 1 samples runs: ``fan_out``, as vLLM v1 runs it, n child requests
scheduled each on its own that share only through the prefix cache; ``fork``, as the vLLM paper
and vLLM v0 run it, the prompt computed once and its blocks shared copy-on-write by n
sequences that decode together (``core.parallel_sampling``)."""


def _require_positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How KV memory is laid out and handed out.

    ``paged`` memory is vLLM's PagedAttention: ``num_blocks`` blocks of ``block_size`` token
    slots, counted as vLLM's ``num_gpu_blocks``: one of them is vLLM's null block (a
    placeholder never handed to a request), so ``num_blocks - 1`` are usable.
    ``contiguous`` memory is the pre-paging baseline: ``num_blocks * block_size`` slots (it
    has no null block), but each sequence reserves one contiguous range sized by
    ``reservation`` (Orca's Max / Pow2 / Oracle).
    """

    num_blocks: int
    block_size: int = 16
    memory_model: MemoryModel = "paged"
    reservation: ReservationRule = "max"
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = False
    # Fraction of blocks kept free when admitting new work while something runs, so running
    # requests can grow (vLLM's ``watermark``, default 0.0 as there).
    watermark: float = 0.0
    max_model_len: int = 4096

    def __post_init__(self) -> None:
        _require_positive("num_blocks", self.num_blocks)
        _require_positive("block_size", self.block_size)
        _require_positive("max_model_len", self.max_model_len)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size!r}")
        if self.memory_model not in MEMORY_MODELS:
            raise ValueError(
                f"memory_model must be one of {MEMORY_MODELS}, got {self.memory_model!r}"
            )
        if self.reservation not in RESERVATION_RULES:
            raise ValueError(
                f"reservation must be one of {RESERVATION_RULES}, got {self.reservation!r}"
            )
        if self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if self.memory_model == "paged" and self.num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 for paged memory (one is the null block), "
                f"got {self.num_blocks!r}"
            )
        if self.enable_prefix_caching and self.memory_model != "paged":
            raise ValueError("enable_prefix_caching needs memory_model='paged'")

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: paged memory keeps one back as vLLM's null block."""
        return self.num_blocks - 1 if self.memory_model == "paged" else self.num_blocks

    @property
    def num_slots(self) -> int:
        """Token slots requests can use."""
        return self.num_usable_blocks * self.block_size

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Budgets and knobs of the scheduler and its policy.

    ``max_num_batched_tokens`` is the per-step token budget (the chunk budget for ``chunked``);
    ``max_num_seqs`` caps the requests in one step. ``batch_size`` and ``max_wait_s`` are the
    static/dynamic batching parameters. ``parallel_sampling`` says how n > 1 runs
    (PARALLEL_SAMPLING; vLLM v1's fan-out by default).
    """

    policy: str = "continuous"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    preemption_mode: PreemptionMode = "recompute"
    batch_size: int = 8
    max_wait_s: float = 1.0
    parallel_sampling: ParallelSampling = "fan_out"

    def __post_init__(self) -> None:
        _require_positive("max_num_seqs", self.max_num_seqs)
        _require_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _require_positive("batch_size", self.batch_size)
        if not 0 <= self.max_wait_s < float("inf"):  # also refuses NaN
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {self.max_wait_s!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )
        if self.parallel_sampling not in PARALLEL_SAMPLING:
            raise ValueError(
                f"parallel_sampling must be one of {PARALLEL_SAMPLING}, "
                f"got {self.parallel_sampling!r}"
            )
