"""Profile format version 5: one 4-D attention table for a step's whole attention layer (the
KV write included), the skew fit for uneven decode contexts, tables extended past their sizes
by the roofline's shape, and kernel-trace timings whose host work overlaps as vLLM's does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import get_model_preset
from sim.costmodel.base import CostModelConfig, StepShape, make_cost_model
from sim.costmodel.host_time import HostParams
from sim.costmodel.llmservingsim_import import llmservingsim_profile
from sim.costmodel.profile import load_profile
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.step_attention import build_step_attention, equivalent_chunk
from sim.specs.hardware import HARDWARE_PRESETS
from tests.sim.llmservingsim_bundle import attention_us, write_bundle

TINY = get_model_preset("tiny-llama")
GPU = HARDWARE_PRESETS["A100-80GB"]
LAYERS = TINY.num_layers


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    profile = llmservingsim_profile(write_bundle(tmp_path / "bundle"), 1, "cmd")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    return path


def _model(path: Path, **config: Any) -> Any:
    return make_cost_model(TINY, GPU, 1, path, CostModelConfig(**config), block_size=16)


def test_attention_is_exact_on_the_grid_and_linear_between(profile_path: Path) -> None:
    table = load_profile(profile_path).attention
    assert table is not None
    for point in [(0, 0, 4, 256), (64, 256, 1, 16), (256, 1024, 16, 1024), (16, 0, 0, 0)]:
        assert table(*point) == pytest.approx(attention_us(*point) * 1e-6)
    # attention_us is bilinear in each axis, so blending neighbours reproduces it between them.
    for point in [(0, 0, 2, 100), (40, 500, 3, 700), (200, 30, 10, 40), (100, 0, 0, 0)]:
        assert table(*point) == pytest.approx(attention_us(*point) * 1e-6)


def test_a_missing_corner_takes_the_nearest_measured_pair() -> None:
    points = {(16, 0, 0, 0): 1.0, (0, 0, 1, 16): 2.0, (0, 0, 4, 16): 4.0}
    table = build_step_attention(points)
    # (16, 1) and (16, 4) were never measured: the nearest measured pair is (16, 0).
    assert table(16, 0, 4, 16) == pytest.approx(1.0)
    assert table(0, 0, 2, 16) == pytest.approx(2.0 + (2 - 1) / 3 * 2.0)


def test_equivalent_chunk_keeps_new_tokens_and_causal_pairs() -> None:
    assert equivalent_chunk([]) == (0, 0)
    assert equivalent_chunk([(300, 1000)]) == (300, 1000)

    def pairs(q: int, k: int) -> int:
        return q * k + q * (q + 1) // 2

    new, context = equivalent_chunk([(310, 2048), (1738, 0)])
    assert new == 2048
    assert pairs(new, context) == pytest.approx(pairs(310, 2048) + pairs(1738, 0), rel=1e-3)
    # Four fresh prompts do less work than one fresh prompt of their length: the fresh chunk
    # of as many pairs stands for them.
    new, context = equivalent_chunk([(512, 0)] * 4)
    assert context == 0 and new < 2048
    assert pairs(new, 0) == pytest.approx(4 * pairs(512, 0), rel=1e-2)


def test_uneven_decodes_move_toward_the_longest_by_the_bucket_alpha(profile_path: Path) -> None:
    model = _model(profile_path)
    table = load_profile(profile_path).attention
    assert table is not None
    # Histories 100, 100, 100, 1000: mean 325, skew rate 0.25 (bucket sr<=40%), n<=4,
    # kvB<=1k, no prefill -> the fitted alpha 0.5 of the handmade skew_fit.csv.
    shape = StepShape(decode_context_tokens=(101, 101, 101, 1001))
    mean, longest = table(0, 0, 4, 325), table(0, 0, 4, 1000)
    expected = mean + 0.5 * (longest - mean)
    assert model.step_breakdown(shape)["decode_attention"] == pytest.approx(LAYERS * expected)
    # Another bucket (8 decodes) takes the default alpha, 0.1.
    shape = StepShape(decode_context_tokens=(101,) * 7 + (1001,))
    mean8 = (7 * 100 + 1000) // 8
    expected = table(0, 0, 8, mean8) + 0.1 * (table(0, 0, 8, 1000) - table(0, 0, 8, mean8))
    assert model.step_breakdown(shape)["decode_attention"] == pytest.approx(LAYERS * expected)
    # Even contexts: no correction.
    shape = StepShape(decode_context_tokens=(501,) * 4)
    assert model.step_breakdown(shape)["decode_attention"] == pytest.approx(
        LAYERS * table(0, 0, 4, 500)
    )


def test_the_attention_layer_writes_the_kv_cache_itself(profile_path: Path) -> None:
    terms = _model(profile_path).step_breakdown(StepShape(prefill_chunks=((64, 0),)))
    assert terms["store_kv"] == 0.0
    assert terms["prefill_attention"] == pytest.approx(LAYERS * attention_us(64, 0, 0, 0) * 1e-6)


def test_past_the_tables_time_follows_the_roofline_never_flat(profile_path: Path) -> None:
    model = _model(profile_path)
    roof = RooflineCostModel(TINY, GPU, 1, block_size=16)
    profile = load_profile(profile_path)
    linear = profile.ops["linear"]
    edge = linear.xs[-1]  # 256 tokens
    for tokens in (300, 1000, 4000):
        expected = LAYERS * linear.within(edge) * roof.linear_s(tokens) / roof.linear_s(int(edge))
        step = StepShape(prefill_chunks=((tokens, 0),))
        assert model.step_breakdown(step)["linear"] == pytest.approx(expected)
        assert expected > LAYERS * linear.within(edge)
    # The attention table past its largest decode count (16) and context (1024).
    table = profile.attention
    assert table is not None
    shape = StepShape(decode_context_tokens=(4001,) * 40)
    at_edge = table(0, 0, 16, 1024)
    ratio = roof.decode_attention_s(40, 40 * 4001, 40 * 4016) / roof.decode_attention_s(
        16, 16 * 1025, 16 * 1040
    )
    assert model.step_breakdown(shape)["decode_attention"] == pytest.approx(
        LAYERS * at_edge * ratio
    )


def test_kernel_times_let_the_host_work_overlap_as_vllm_does(profile_path: Path) -> None:
    shape = StepShape(decode_context_tokens=(257,) * 16)
    overlapped = _model(profile_path, step_overhead_s=0.5).step_breakdown(shape)
    serial = _model(profile_path, step_overhead_s=0.5, async_scheduling=False).step_breakdown(shape)
    device = sum(v for k, v in serial.items() if k != "overhead")
    assert serial["overhead"] == pytest.approx(0.5 + 16 * 1e-5)
    assert overlapped["overhead"] == pytest.approx(0.5 + 16 * 1e-5 - device)
    hidden = _model(profile_path, step_overhead_s=1e-6).step_breakdown(shape)
    assert hidden["overhead"] == 0.0


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ops.attention.time_s": [1.0]}, r"ops\.attention': columns must be non-empty and of one"),
        ({"ops.attention.kv_decode": "x"}, r"ops\.attention\.kv_decode': missing, or not a list"),
        ({"decode_skew.alpha_default": "a"}, r"decode_skew\.alpha_default': expected a finite"),
        ({"decode_skew.bucket_axes.n_bins": [4, 2]}, r"n_bins': must be strictly increasing"),
        ({"extrapolation": "flat"}, r"'extrapolation': must be one of"),
    ],
)
def test_bad_version_5_fields_are_named(
    profile_path: Path, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    data = json.loads(profile_path.read_text())
    for dotted, value in change.items():
        *parents, key = dotted.split(".")
        target = data
        for part in parents:
            target = target[part]
        target[key] = value
    with pytest.raises(ValueError, match=message):
        load_profile(_write(tmp_path, data))


def test_a_version_4_file_ignores_version_5_keys(profile_path: Path, tmp_path: Path) -> None:
    data = json.loads(profile_path.read_text())
    data["format_version"] = 4
    del data["ops"]["attention"]
    data["timer"] = "cuda_events"
    profile = load_profile(_write(tmp_path, data))
    assert profile.decode_skew is None and profile.extrapolation == "proportional"
    data["timer"] = "kernel_trace"
    with pytest.raises(ValueError, match=r"'timer': must be one of .* in version 4"):
        load_profile(_write(tmp_path, data))


def test_the_two_dimensional_tables_follow_the_roofline_past_their_grid(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "format_version": 5,
        "device": {"name": "handmade", "driver": "none"},
        "software": {"torch": "none", "triton": "none", "cuda": "none"},
        "command": "handmade",
        "model": "tiny-llama",
        "tp": 1,
        "block_size": 16,
        "extrapolation": "roofline",
        "ops": {
            "decode_attention": {
                "num_seqs": [1, 8],
                "context_tokens": [16, 256],
                "time_s": [[1e-5, 2e-5], [3e-5, 9e-5]],
            },
            "prefill_attention": {
                "num_query_tokens": [16, 256],
                "num_context_tokens": [0, 256],
                "time_s": [[1e-5, 2e-5], [5e-5, 9e-5]],
            },
        },
    }
    model = _model(_write(tmp_path, data))
    roof = RooflineCostModel(TINY, GPU, 1, block_size=16)
    decode = model.step_breakdown(StepShape(decode_context_tokens=(1000,) * 20))
    ratio = roof.decode_attention_s(20, 20 * 1000, 20 * 1008) / roof.decode_attention_s(
        8, 8 * 256, 8 * 256
    )
    assert decode["decode_attention"] == pytest.approx(LAYERS * 9e-5 * ratio)
    prefill = model.step_breakdown(StepShape(prefill_chunks=((1024, 512),)))
    ratio = roof.prefill_attention_s(((1024, 512),)) / roof.prefill_attention_s(((256, 256),))
    assert prefill["prefill_attention"] == pytest.approx(LAYERS * 9e-5 * ratio)
    # Inside the grid the tables read as before.
    inside = model.step_breakdown(StepShape(decode_context_tokens=(256,) * 8))
    assert inside["decode_attention"] == pytest.approx(LAYERS * 9e-5)


def test_every_host_field_that_calibrate_stores_loads_back() -> None:
    # `sim calibrate` on a GPU stores ``asdict`` of the fitted HostParams; a field the loader
    # did not know (the piecewise graphs' three) made every new GPU profile unloadable.
    from dataclasses import asdict, fields, replace

    from sim.costmodel.host_time import SERVESIM_PIECEWISE_HOST
    from sim.costmodel.profile_v5 import HOST_COUNTS, HOST_FLAGS, HOST_NUMBERS, read_host

    assert {f.name for f in fields(HostParams)} == {*HOST_NUMBERS, *HOST_COUNTS, *HOST_FLAGS}
    params = replace(SERVESIM_PIECEWISE_HOST, piece_replay_s=2.5e-5, piecewise_max_tokens=256)

    def fail(field: str, why: str) -> ValueError:
        return ValueError(f"{field}: {why}")

    assert read_host({**asdict(params), "device_scale": 1.1}, fail) == (params, 1.1)
