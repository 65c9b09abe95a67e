"""What a calibrated profile says of itself and of another: its model fitted to its own whole
steps (the host set to store, each step's residual), and how far two or more profiles' predictions
of the same step grid differ (``compare_profiles``: ``sim calibrate --repeat N``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.model.presets import load_model_spec
from fidelity import host_speed
from fidelity.profile_diff import profile_differences, with_predictions
from fidelity.replay_inputs import hardware_of
from sim.costmodel.base import CostModel, CostModelConfig, make_cost_model
from sim.costmodel.calibrated_host import step_shape
from sim.costmodel.profile import Profile, load_profile
from sim.specs.hardware import get_hardware_preset

DEFAULT_GPU_HARDWARE = "H100-SXM"


@dataclass
class ProfileModel:
    """A profile and the calibrated cost model it makes (servesim's engine as it ran)."""

    profile: Profile
    cost: CostModel

    def predictions(self, profile: Profile | None = None) -> np.ndarray:
        """This model's time of each whole step of ``profile`` (its own by default)."""
        steps = (profile or self.profile).steps
        return np.array([self.cost.step_time_s(step_shape(s)) for s in steps])

    def residuals(self) -> list[float]:
        """(measured - predicted) / predicted of each of the profile's own whole steps."""
        predicted = self.predictions()
        measured = np.array([s.measured_s for s in self.profile.steps])
        return [float(r) for r in (measured - predicted) / predicted]


def hardware_for(profile: Profile) -> str:
    """The roofline preset behind a profile: CPU-1T on a CPU, else its device's preset."""
    name = profile.device.get("name", "")
    if name.lower().startswith("cpu"):
        return "CPU-1T"
    return hardware_of(name) or DEFAULT_GPU_HARDWARE


def load_model(
    path: str | Path, model: str | None = None, host_slowdown: float = 1.0
) -> ProfileModel:
    """The calibrated cost model of the profile at ``path`` (its model preset, or ``model``),
    on a host ``host_slowdown`` times slower than the calibration's."""
    profile = load_profile(path)
    spec = load_model_spec(model or profile.model)
    hardware = get_hardware_preset(hardware_for(profile))
    config = CostModelConfig(
        async_scheduling=False,
        price_padding=False,
        engine="servesim-eager",
        host_slowdown=host_slowdown,
    )
    cost = make_cost_model(spec, hardware, profile.tp, path, config, block_size=profile.block_size)
    return ProfileModel(profile, cost)


def fitted_model(path: Path, device: str, model: str | None = None) -> tuple[ProfileModel, Any]:
    """The profile's model, and on a GPU the host set fitted to its steps, as stored."""
    loaded = load_model(path, model)
    host = getattr(loaded.cost, "host", None)
    if device == "cpu" or host is None:
        return loaded, None
    stored = {k: v for k, v in asdict(host.model.params).items()}
    stored["device_scale"] = host.device_scale
    return loaded, stored


def _fitted(model: ProfileModel) -> dict[str, float]:
    """The coefficients fitted to the profile's whole steps: a CPU profile's joint fit, or a
    GPU profile's host set (empty when it has neither)."""
    fitted = getattr(model.cost, "fitted", None)
    host = getattr(model.cost, "host", None)
    if host is not None:
        return {k: float(v) for k, v in asdict(host.model.params).items() if isinstance(v, float)}
    return dict(fitted) if isinstance(fitted, dict) else {}


def compare_profiles(paths: list[Path], model: str | None = None) -> dict[str, Any]:
    """How far each profile's predictions of the first profile's step grid (and the first's of
    each one's) differ from the first's: the median and p90 of |p - p0| / p0 in percent, both
    ways; where the two differ (``where``: their raw tables and whole steps, and the cause,
    ``fidelity.profile_diff``); and each profile's own step spread."""
    models = [load_model(p, model) for p in paths]
    first = models[0]
    out: dict[str, Any] = {"profiles": [str(p) for p in paths], "pairs": []}
    spreads = [
        100 * float(np.median(np.abs(m.residuals()))) if m.profile.steps else None for m in models
    ]
    for index, (other, path) in enumerate(zip(models[1:], paths[1:], strict=True), start=1):
        median, p90 = _apart(first, other)
        fitted = (_fitted(first), _fitted(other))
        pair = (spreads[0], spreads[index])
        where = profile_differences(first.profile, other.profile)
        where = with_predictions(where, median, fitted, pair)
        out["pairs"].append(
            {
                "profile": str(path),
                "median_pct": median,
                "p90_pct": p90,
                "where": where,
                "one_host": _on_one_host(first, other, path, model, where["steps"].get("prepare")),
            }
        )
    out["step_spread_pct"] = spreads
    return out


def _apart(first: ProfileModel, other: ProfileModel) -> tuple[float, float]:
    """The median and p90 of |other - first| / first in percent over both step grids."""
    ratios = []
    for grid in (first.profile, other.profile):
        base, alt = first.predictions(grid), other.predictions(grid)
        ratios.extend((np.abs(alt - base) / base).tolist())
    values = 100 * np.array(ratios)
    return float(np.median(values)), float(np.percentile(values, 90))


def _on_one_host(
    first: ProfileModel, other: ProfileModel, path: Path, model: str | None, prepare: Any
) -> dict[str, Any]:
    """The two calibrations once the host's speed is taken out: how much slower the second's
    host ran (the median ratio of the same whole steps' input preparation, ``prepare`` from
    ``profile_differences``: both ran one step grid), and the two models' predictions apart
    with the second priced back on the first's host (``CostModelConfig.host_slowdown``); or why
    the hosts cannot be compared (``error``)."""
    problem = host_speed.clocks_problem(
        (str(first.profile.path), host_speed.profile_clocks(first.profile)),
        (str(path), host_speed.profile_clocks(other.profile)),
    )
    if problem:
        return {"error": problem}
    if not prepare or prepare["n"] < host_speed.MIN_STEPS:
        count = prepare["n"] if prepare else 0
        return {
            "error": f"{path}: {count} steps of the first's shapes with a preparation time in "
            f"both; a host speed needs >= {host_speed.MIN_STEPS}"
        }
    slowdown = 1 + prepare["median_pct"] / 100
    median, p90 = _apart(first, load_model(path, model, host_slowdown=1 / slowdown))
    return {"host_slowdown": slowdown, "num_steps": prepare["n"], "median_pct": median,
            "p90_pct": p90}  # fmt: skip
