"""What ``python -m sim validate`` replays with (`ValidateConfig`), kept apart from the
validation itself so that the command line can show its defaults without loading torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import CacheConfig, SchedulerConfig, check_serving
from core.policies import check_budgets, check_policy
from fidelity.clocks import CLOCK_CHOICES, resolve_clock

VALIDATION_FILE = "validation.json"


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """The engine configuration to replay with (the simulator copies it): the core's KV cache
    and scheduler settings, as the engine's `EngineConfig` holds them, the model, device and
    clock; and the trace's stretch and subset. Defaults equal the engine's."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    model: str = "tiny-llama"
    device: str = "cpu"
    time_scale: float = 1.0
    max_requests: int | None = None
    hardware: str | None = None  # the roofline's; None: CPU-1T on cpu, H100-SXM on cuda
    cpu_threads: int = 1
    clock: str = "auto"  # the engine's and calibration's clock; see fidelity.calibrate.CLOCK_HELP
    enforce_eager: bool = False  # the engine without CUDA graphs (where it has them)
    mixed_graphs: str = "off"  # its steps with a prompt chunk on piecewise graphs (CUDA only)
    # The engine's host against the calibration's: how many times slower (CostModelConfig.
    # host_slowdown; fidelity.host_speed measures it from the runs' input preparation).
    host_slowdown: float = 1.0
    # Measure it instead: the engine run's input preparation against the calibration's.
    measure_host_slowdown: bool = False

    def __post_init__(self) -> None:
        check_policy(self.scheduler.policy)
        check_serving(self.cache, self.scheduler)
        check_budgets(self.scheduler)
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests!r}")
        if not 0 <= self.time_scale < float("inf"):
            raise ValueError(f"time_scale must be finite and >= 0, got {self.time_scale!r}")
        if not 0 < self.host_slowdown < float("inf"):
            raise ValueError(f"host_slowdown must be finite and > 0, got {self.host_slowdown!r}")
        if self.clock not in CLOCK_CHOICES:
            raise ValueError(f"clock must be one of {CLOCK_CHOICES}, got {self.clock!r}")

    def engine_clock(self) -> str:
        """``wall`` or ``cpu``: ``auto`` is ``cpu`` on a CPU device with one torch thread."""
        return resolve_clock(self.clock, self.device, self.cpu_threads)

    def roofline_hardware(self) -> str:
        if self.hardware is not None:
            return self.hardware
        return "CPU-1T" if self.device == "cpu" else "H100-SXM"
