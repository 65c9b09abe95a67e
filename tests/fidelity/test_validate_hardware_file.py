"""``validate --hardware`` takes a hardware file as ``sim run`` does, not only a preset: the
roofline the validation prices with is the file's GPU."""

from __future__ import annotations

from pathlib import Path

from core.settings import build
from fidelity.validate import cost_models
from sim.costmodel.roofline import RooflineCostModel
from sim.run import RunConfig


def test_a_hardware_file_prices_the_roofline(tmp_path: Path) -> None:
    hardware = tmp_path / "slow.toml"
    hardware.write_text(
        'base = "H100-SXM"\nname = "half an H100"\nhbm_bandwidth_bytes_per_s = 1.675e12\n'
    )
    step = {"model": "llama-3-8b", "policy": "chunked"}
    preset = cost_models(build(RunConfig, **step, hardware="H100-SXM"), "servesim-eager")
    from_file = cost_models(build(RunConfig, **step, hardware=str(hardware)), "servesim-eager")
    assert set(preset) == set(from_file) == {"roofline"}
    roofline = from_file["roofline"]
    assert isinstance(roofline, RooflineCostModel)
    assert roofline.hardware.name == "half an H100"
    assert roofline.hardware.hbm_bandwidth_bytes_per_s == 1.675e12
