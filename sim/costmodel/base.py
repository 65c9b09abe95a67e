"""The per-step cost model the simulator is coded against: the `CostModel` protocol, the
`StepShape` it prices, and `make_cost_model` choosing roofline or calibrated."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from core.model.spec import ModelSpec
from sim.costmodel.calibrated import CalibratedCostModel
from sim.costmodel.config import CostModelConfig
from sim.costmodel.profile import Profile, load_profile
from sim.costmodel.roofline import TERMS, RooflineCostModel
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import HardwareSpec

__all__ = [
    "TERMS",
    "CalibratedCostModel",
    "CostModel",
    "CostModelConfig",
    "Profile",
    "RooflineCostModel",
    "StepShape",
    "load_profile",
    "make_cost_model",
]


class CostModel(Protocol):
    """Prices engine steps and KV transfers, in seconds, for KV blocks of ``block_size``
    tokens (the deployment's, given when the model is built)."""

    @property
    def block_size(self) -> int: ...

    @property
    def async_scheduling(self) -> bool:
        """Whether the engine priced schedules each step while the one before runs."""
        ...

    def step_time_s(self, shape: StepShape) -> float: ...

    def step_breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per term (keys: TERMS); the values sum to step_time_s(shape)."""
        ...

    def kv_transfer_time_s(
        self, num_tokens: int, link_bandwidth_bytes_per_s: float, link_latency_s: float
    ) -> float: ...


def make_cost_model(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int = 1,
    profile_path: str | Path | None = None,
    config: CostModelConfig | None = None,
    *,
    block_size: int,
) -> CostModel:
    """The analytic roofline for KV blocks of ``block_size`` tokens, or, given a profile file,
    its tables over the roofline (a profile measured at another block size is refused)."""
    roofline = RooflineCostModel(model, hardware, tp, config, block_size=block_size)
    if profile_path is None:
        return roofline
    return CalibratedCostModel(load_profile(profile_path), roofline)
