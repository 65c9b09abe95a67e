"""Profile files: loading, interpolation, malformed-file errors, and the calibrated model."""

from __future__ import annotations

import copy
import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import get_model_preset
from sim.costmodel.base import CalibratedCostModel, RooflineCostModel, StepShape, make_cost_model
from sim.costmodel.profile import Table1D, Table2D, load_profile
from sim.specs.hardware import HARDWARE_PRESETS

PROFILE = Path(__file__).parent / "data" / "llama2_7b_a100_tp1.json"
LLAMA = get_model_preset("Llama-2-7B")
A100 = HARDWARE_PRESETS["A100-80GB"]


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(PROFILE.read_text())
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def test_load_example_profile() -> None:
    profile = load_profile(PROFILE)
    assert profile.model == "Llama-2-7B"
    assert profile.tp == 1
    assert profile.device["name"] == "NVIDIA A100-SXM4-80GB"
    assert set(profile.ops) == {
        "linear",
        "decode_attention",
        "prefill_attention",
        "store_kv",
        "copy_blocks",
    }
    assert isinstance(profile.ops["decode_attention"], Table2D)
    assert len(profile.steps) == 2


def test_table1d_interpolates_clamps_and_extrapolates_by_throughput() -> None:
    table = Table1D(xs=(10.0, 20.0), times_s=(1.0, 3.0))
    assert table(15) == pytest.approx(2.0)
    assert table(1) == 1.0  # below the table: the smallest measured time
    assert table(40) == pytest.approx(6.0)  # past it: throughput at the edge
    assert table(0) == 0.0


def test_table2d_bilinear() -> None:
    grid = Table2D(xs=(1.0, 3.0), ys=(10.0, 20.0), times_s=((1.0, 2.0), (3.0, 4.0)))
    assert grid(1, 10) == 1.0
    assert grid(2, 15) == pytest.approx(2.5)
    assert grid(6, 20) == pytest.approx(8.0)
    assert grid(3, 40) == pytest.approx(8.0)


def _break(path: list[str | int], value: Any = None, delete: bool = False) -> dict[str, Any]:
    data = copy.deepcopy(_raw())
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "delete", "field", "problem"),
    [
        (["format_version"], 6, False, "format_version", "knows 1, 2, 3, 4 and 5"),
        (["ops", "prepare"], {"num_seqs": [1], "time_s": [1e-5]}, False, "ops.prepare",
         "unknown op"),
        (["model"], None, True, "model", "missing"),
        (["device", "driver"], None, True, "device.driver", "missing"),
        (["software", "torch"], 2.4, False, "software.torch", "expected str"),
        (["ops", "linear", "num_tokens"], [1, 64, 64, 2048], False, "ops.linear.num_tokens",
         "strictly increasing"),
        (["ops", "linear", "time_s"], [1e-4], False, "ops.linear.time_s", "needs 4 values"),
        (["ops", "decode_attention", "time_s", 1], [1e-5], False,
         "ops.decode_attention.time_s[1]", "list of 3"),
        (["ops", "store_kv", "time_s"], [1e-6, -1.0], False, "ops.store_kv.time_s",
         "non-negative"),
        (["ops", "prefill_attention", "num_context_tokens"], None, True,
         "ops.prefill_attention.num_context_tokens", "missing"),
        (["ops", "conv2d"], {}, False, "ops.conv2d", "unknown op"),
        (["steps", 0, "measured_s"], None, True, "steps[0].measured_s", "missing"),
    ],
)  # fmt: skip
def test_malformed_profile_names_file_and_field(
    tmp_path: Path, path: list[str | int], value: Any, delete: bool, field: str, problem: str
) -> None:
    bad = _write(tmp_path, _break(path, value, delete))
    with pytest.raises(ValueError) as error:
        load_profile(bad)
    message = str(error.value)
    assert str(bad) in message
    assert repr(field) in message
    assert problem in message


def test_unreadable_profile(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read a JSON profile"):
        load_profile(path)


def test_calibrated_uses_tables_and_falls_back() -> None:
    model = make_cost_model(LLAMA, A100, profile_path=PROFILE)
    assert isinstance(model, CalibratedCostModel)
    roofline = RooflineCostModel(LLAMA, A100)
    shape = StepShape(decode_context_tokens=(1024,), num_swap_in_blocks=2)
    calibrated, analytic = model.step_breakdown(shape), roofline.step_breakdown(shape)
    assert calibrated["linear"] == pytest.approx(32 * 2.6e-4)  # table at 1 token, per layer
    assert calibrated["decode_attention"] == pytest.approx(32 * 2.5e-5)
    for term in ("elementwise", "lm_head", "swap"):  # not in the profile
        assert calibrated[term] == analytic[term]
    assert sum(calibrated.values()) == pytest.approx(model.step_time_s(shape), rel=1e-12)


def test_calibrated_overhead_fitted_to_steps() -> None:
    model = make_cost_model(LLAMA, A100, profile_path=PROFILE)
    profile = load_profile(PROFILE)
    residuals = []
    for step in profile.steps:
        shape = StepShape(
            prefill_chunks=step.prefill_chunks,
            decode_context_tokens=(step.sum_decode_context_tokens // step.num_decode_seqs,)
            * step.num_decode_seqs,
        )
        residuals.append(step.measured_s - model.step_time_s(shape))
    # With the fitted overhead the two steps straddle their measurements.
    assert min(residuals) <= 0 <= max(residuals)


def test_calibrated_monotone_in_decode_batch() -> None:
    model = make_cost_model(LLAMA, A100, profile_path=PROFILE)
    times = [model.step_time_s(StepShape(decode_context_tokens=(900,) * n)) for n in range(1, 300)]
    assert all(b >= a for a, b in pairwise(times))


def test_calibrated_refuses_other_model_or_tp() -> None:
    profile = load_profile(PROFILE)
    with pytest.raises(ValueError, match=r"field 'tp'"):
        CalibratedCostModel(profile, RooflineCostModel(LLAMA, A100, tp=2))
    with pytest.raises(ValueError, match=r"field 'model'.*Llama-2-13B"):
        CalibratedCostModel(profile, RooflineCostModel(get_model_preset("Llama-2-13B"), A100))


def test_docs_example_is_the_test_profile() -> None:
    docs = Path(__file__).parents[2] / "docs" / "profile_format.md"
    example = docs.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(example) == _raw()
