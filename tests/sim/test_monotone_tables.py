"""A GPU profile's growing ops priced monotone in their size (``calibrated.monotone``): a timing
round's slow first call cannot make a smaller call dearer than a larger one. A CPU profile's
tables stay as timed (its joint fit was chosen on them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.model.presets import get_model_preset
from sim.costmodel.base import make_cost_model
from sim.costmodel.calibrated import monotone
from sim.costmodel.profile import Table1D
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import HARDWARE_PRESETS

PROFILE = Path(__file__).parent / "data" / "llama2_7b_a100_tp1.json"


def test_monotone_takes_the_least_time_of_any_larger_size() -> None:
    table = Table1D((1, 2, 4, 8), (187e-6, 123e-6, 130e-6, 125e-6))
    assert monotone(table).times_s == (123e-6, 123e-6, 125e-6, 125e-6)
    assert monotone(table).xs == table.xs
    steady = Table1D((1, 2), (1e-6, 2e-6))
    assert monotone(steady) == steady


@pytest.mark.parametrize("device", ["NVIDIA A100-SXM4-80GB", "cpu (x86_64)"])
def test_a_slow_first_point_is_repaired_on_a_gpu_only(tmp_path: Path, device: str) -> None:
    data = json.loads(PROFILE.read_text())
    linear = data["ops"]["linear"]
    linear["time_s"][0] = 4 * linear["time_s"][1]  # the first call of a round, slow
    data["device"]["name"] = device
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    model = make_cost_model(
        get_model_preset("Llama-2-7B"), HARDWARE_PRESETS["A100-80GB"], 1, path, block_size=16
    )
    one = model.step_breakdown(StepShape(decode_context_tokens=(100,)))["linear"]
    layers = 32
    if device.startswith("cpu"):
        assert one == pytest.approx(layers * linear["time_s"][0])
    else:
        assert one == pytest.approx(layers * linear["time_s"][1])
