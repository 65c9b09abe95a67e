"""What ``python -m sim validate`` replays with (`ValidateConfig`), kept apart from the
validation itself so that the command line can show its defaults without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from fidelity.clocks import CLOCK_CHOICES, resolve_clock

VALIDATION_FILE = "validation.json"
ENGINE_POLICIES = ("static", "dynamic", "continuous", "chunked")


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """The engine configuration to replay with (the simulator copies it) and the trace's
    stretch and subset. Defaults equal the engine's."""

    policy: str = "chunked"
    model: str = "tiny-llama"
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    batch_size: int = 8
    max_wait_s: float = 1.0
    preemption_mode: str = "recompute"
    enable_prefix_caching: bool = False
    time_scale: float = 1.0
    max_requests: int | None = None
    hardware: str | None = None  # the roofline's; None: CPU-1T on cpu, H100-SXM on cuda
    cpu_threads: int = 1
    clock: str = "auto"  # the engine's and calibration's clock; see fidelity.calibrate.CLOCK_HELP
    enforce_eager: bool = False  # the engine without CUDA graphs (where it has them)

    def __post_init__(self) -> None:
        if self.policy not in ENGINE_POLICIES:
            raise ValueError(f"policy must be one of {ENGINE_POLICIES}, got {self.policy!r}")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests!r}")
        if not 0 <= self.time_scale < float("inf"):
            raise ValueError(f"time_scale must be finite and >= 0, got {self.time_scale!r}")
        if self.clock not in CLOCK_CHOICES:
            raise ValueError(f"clock must be one of {CLOCK_CHOICES}, got {self.clock!r}")

    def engine_clock(self) -> str:
        """``wall`` or ``cpu``: ``auto`` is ``cpu`` on a CPU device with one torch thread."""
        return resolve_clock(self.clock, self.device, self.cpu_threads)

    def roofline_hardware(self) -> str:
        if self.hardware is not None:
            return self.hardware
        return "CPU-1T" if self.device == "cpu" else "H100-SXM"
