"""Hardware files (JSON/TOML) and the datasheet presets: loading, errors that name the field."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from core.model.presets import get_model_preset
from core.settings import build
from sim.cli.main import main
from sim.costmodel.roofline import RooflineCostModel
from sim.run import RunConfig, simulate
from sim.specs.hardware import HARDWARE_PRESETS, HardwareSpec
from sim.specs.hardware_file import load_hardware, load_hardware_file
from traces.loaders import load_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "data" / "example.csv"

FULL = {
    "name": "test-gpu",
    "peak_fp16_flops": 200e12,
    "peak_fp32_flops": 100e12,
    "peak_fp8_flops": 400e12,
    "hbm_bandwidth_bytes_per_s": 1.5e12,
    "hbm_capacity_bytes": 34359738368,
    "nvlink_domain_size": 1,
    "interconnect_bandwidth_bytes_per_s": 64e9,
    "interconnect_latency_s": 8e-6,
    "host_link_bandwidth_bytes_per_s": 64e9,
    "scale_out_bandwidth_bytes_per_s": 64e9,
}


def _write(tmp_path: Path, table: dict[str, object], name: str = "gpu.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(table, indent=2))
    return path


def test_json_file_gives_every_field(tmp_path: Path) -> None:
    spec = load_hardware_file(_write(tmp_path, FULL))
    assert spec == HardwareSpec(**FULL)  # type: ignore[arg-type]
    assert isinstance(spec.hbm_capacity_bytes, int)


def test_toml_file_over_a_base_preset(tmp_path: Path) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text('base = "H100-SXM"\nname = "slow"\nhbm_bandwidth_bytes_per_s = 2.01e12\n')
    spec = load_hardware(str(path))
    expected = dataclasses.replace(
        HARDWARE_PRESETS["H100-SXM"], name="slow", hbm_bandwidth_bytes_per_s=2.01e12
    )
    assert spec == expected


def test_absent_optional_fp8_means_none(tmp_path: Path) -> None:
    table = {k: v for k, v in FULL.items() if k != "peak_fp8_flops"}
    assert load_hardware_file(_write(tmp_path, table)).peak_fp8_flops is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hbm_bandwidth_bytes_per_s", "fast", r"line 6\).*hbm_bandwidth_bytes_per_s must be a num"),
        ("hbm_capacity_bytes", 1.5, r"hbm_capacity_bytes must be an integer, got 1\.5"),
        ("peak_fp16_flops", -1.0, r"line 3\).*HardwareSpec\.peak_fp16_flops must be positive"),
        ("nvlink_domain_size", 0, r"HardwareSpec\.nvlink_domain_size must be positive"),
        ("nvlink_domain_size", 1.5, r"nvlink_domain_size must be an integer, got 1\.5"),
        ("memory_bw", 1e12, r"unknown key 'memory_bw'"),
    ],
)
def test_bad_field_is_named_with_file_and_line(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    table = dict(FULL)
    table[key] = value
    path = _write(tmp_path, table)
    with pytest.raises(ValueError, match=message) as error:
        load_hardware_file(path)
    assert str(path) in str(error.value)


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    table = {k: v for k, v in FULL.items() if k != "hbm_capacity_bytes"}
    with pytest.raises(ValueError, match=r"missing key\(s\) hbm_capacity_bytes"):
        load_hardware_file(_write(tmp_path, table))


def test_unknown_base_and_bad_syntax(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"line 2\).*unknown hardware 'TPU'"):
        load_hardware_file(_write(tmp_path, {"base": "TPU"}))
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(ValueError, match=r"broken\.toml: not valid TOML"):
        load_hardware_file(broken)


def test_cli_reports_a_bad_hardware_file_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens,num_samples\nr0,0.0,8,2,1\n")
    path = _write(tmp_path, {**FULL, "peak_fp16_flops": "lots"})
    code = main(["run", str(trace), "--hardware", str(path), "--quiet"])
    assert code == 2
    assert "peak_fp16_flops must be a number" in capsys.readouterr().err


def test_cli_runs_on_a_hardware_file(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens,num_samples\nr0,0.0,8,2,1\n")
    path = _write(tmp_path, FULL)
    out = tmp_path / "run"
    assert main(["run", str(trace), "--hardware", str(path), "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["hardware"] == str(path)


def test_datasheet_presets_exist_and_are_sane() -> None:
    for name in ("A40", "L40S", "RTX-4090", "RTX-PRO-6000", "RTX-A6000", "H20", "B200", "MI300X"):
        spec = HARDWARE_PRESETS[name]
        assert spec.nvlink_domain_size in (1, 2, 8)
        # FLOP per byte of memory: 37 on the H20, 150-420 elsewhere; a unit slip (TFLOPS
        # written as 1e9, GB/s as 1e12) lands far outside.
        assert 20 < spec.peak_fp16_flops / spec.hbm_bandwidth_bytes_per_s < 1000
        assert 16 * 2**30 <= spec.hbm_capacity_bytes <= 200 * 2**30


def test_nvlink_bridge_joins_pairs_only() -> None:
    a40 = HARDWARE_PRESETS["A40"]
    assert (a40.nvlink_domain_size, a40.scale_out_bandwidth_bytes_per_s) == (2, 32e9)
    llama = get_model_preset("Llama-2-7B")
    pair, quad = (
        RooflineCostModel(llama, a40, tp=2, block_size=16),
        RooflineCostModel(llama, a40, tp=4, block_size=16),
    )
    call, hop, bus = a40.allreduce_call_latency_s, 2e-6, a40.interconnect_bus_efficiency
    # 1 MiB over 2 ranks on the bridge vs 4 ranks over PCIe gen4 (32 GB/s): alpha-beta ring,
    # the PCIe ring with PCIe's own hop latency and bus efficiency.
    assert pair.allreduce_call_s(2**20) == pytest.approx(call + 2 * hop + 2**20 / (56.25e9 * bus))
    pcie_hop, pcie_bus = a40.scale_out_latency_s, a40.scale_out_bus_efficiency
    assert (pcie_hop, pcie_bus) == (4e-6, 0.75)
    assert quad.allreduce_call_s(2**20) == pytest.approx(
        call + 6 * pcie_hop + 6 / 4 * 2**20 / (32e9 * pcie_bus)
    )


def test_pcie_only_cards_all_reduce_over_pcie() -> None:
    for name in ("L40S", "RTX-4090", "RTX-PRO-6000", "RTX-PRO-6000-Server"):
        spec = HARDWARE_PRESETS[name]
        assert spec.nvlink_domain_size == 1
        assert spec.scale_out_bandwidth_bytes_per_s == spec.host_link_bandwidth_bytes_per_s


def test_a_hardware_files_name_appears_in_the_summary_files_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/hardware_format.md: `name` is "shown in summaries and reports".
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens,num_samples\nr0,0.0,8,2,1\n")
    path = _write(tmp_path, FULL)
    out, report = tmp_path / "run", tmp_path / "r.html"
    assert main(["run", str(trace), "--hardware", str(path), "--out", str(out)]) == 0
    config_line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("config"))
    assert f"on test-gpu ({path})" in config_line
    assert json.loads((out / "summary.json").read_text())["hardware_name"] == "test-gpu"
    from reports.cli import main as report_main

    assert report_main([str(out), "-o", str(report)]) == 0
    assert f"<td>test-gpu ({path})</td>" in report.read_text()
    # A preset's summary.json gains nothing: its name is already the config's hardware.
    assert main(["run", str(trace), "--out", str(tmp_path / "p"), "--quiet"]) == 0
    assert "hardware_name" not in json.loads((tmp_path / "p" / "summary.json").read_text())


def test_a_model_too_large_for_a_hardware_file_names_the_file(tmp_path: Path) -> None:
    small = tmp_path / "small.toml"
    small.write_text('base = "H100-SXM"\nhbm_capacity_bytes = 1000000\n')
    config = build(RunConfig, hardware=str(small), model="Llama-3-8B")
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(small))}: Llama-3-8B at tp=1 does not fit"
    ):
        simulate(load_trace(str(EXAMPLE)), config)
