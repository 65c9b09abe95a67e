"""vLLM's host time is priced by one model wherever a step is priced: the roofline, a profile
of kernel tables that timed no step (an imported LLMServingSim bundle), and a data-parallel
group's step all hand the step's GPU time to the run's ``HostTimeModel``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import get_model_preset, load_model_spec
from sim.costmodel.base import CostModelConfig, StepShape, make_cost_model
from sim.costmodel.expert_parallel import ExpertParallelCost
from sim.costmodel.host_time import SERVESIM_EAGER_HOST, VLLM_HOST, HostTimeModel
from sim.costmodel.llmservingsim_import import llmservingsim_profile
from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import HARDWARE_PRESETS
from tests.sim.llmservingsim_bundle import write_bundle

TINY = get_model_preset("tiny-llama")
GPU = HARDWARE_PRESETS["A100-80GB"]
SHAPES = (
    StepShape(decode_context_tokens=(257,) * 16),
    StepShape(prefill_chunks=((200, 64),), decode_context_tokens=(100, 900)),
)


def _imported(tmp_path: Path, **changes: Any) -> Path:
    profile = llmservingsim_profile(write_bundle(tmp_path / "bundle"), 1, "cmd")
    for key, value in changes.items():
        if isinstance(value, dict):
            profile[key] = {**profile.get(key, {}), **value}
        else:
            profile[key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    return path


def _model(path: Path, **config: Any) -> Any:
    return make_cost_model(TINY, GPU, 1, path, CostModelConfig(**config), block_size=16)


def _device_s(terms: dict[str, float]) -> float:
    return sum(v for k, v in terms.items() if k != "overhead")


def test_the_importer_says_its_kernels_are_vllms(tmp_path: Path) -> None:
    profile = llmservingsim_profile(write_bundle(tmp_path / "bundle"), 1, "cmd")
    assert profile["engine"]["kind"] == "vllm"


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_an_imported_profile_prices_the_host_with_the_runs_host_model(
    tmp_path: Path, async_scheduling: bool
) -> None:
    config = {"step_overhead_s": 0.5, "async_scheduling": async_scheduling}
    model = _model(_imported(tmp_path), **config)
    assert model.host is not None and model.host.gpu_clock == "tables"
    assert model.host.model.params == CostModelConfig(**config).host_params()
    host = HostTimeModel(CostModelConfig(**config).host_params(), TINY.num_layers, 4)
    for shape in SHAPES:
        terms = model.step_breakdown(shape)
        device = _device_s(terms)
        assert terms["overhead"] == host.step_overhead_s(shape, 16, device)
        wanted = 0.5 + shape.num_seqs * 1e-5 - (device if async_scheduling else 0.0)
        assert terms["overhead"] == pytest.approx(wanted)


def test_vllms_documented_set_is_the_default(tmp_path: Path) -> None:
    model = _model(_imported(tmp_path))
    assert model.host.model.params == VLLM_HOST


def test_a_profile_naming_another_engine_prices_that_engines_host(tmp_path: Path) -> None:
    path = _imported(tmp_path, engine={"kind": "servesim-eager"})
    model = _model(path)
    assert model.host.model.params == SERVESIM_EAGER_HOST
    shape = SHAPES[0]
    # An eager host launches every layer's kernels: at least layer_s per layer of host time.
    host = model.host.model.host_time(0, 16, 257, 16 * 17)
    assert host.launch_s >= TINY.num_layers * SERVESIM_EAGER_HOST.layer_s
    terms = model.step_breakdown(shape)
    assert terms["overhead"] == model.host.model.step_overhead_s(shape, 16, _device_s(terms))


def test_a_stepless_profile_of_any_timer_overlaps_the_host_as_the_run_does(
    tmp_path: Path,
) -> None:
    overlapped = _model(_imported(tmp_path, timer="cuda_events"), step_overhead_s=0.5)
    terms = overlapped.step_breakdown(SHAPES[0])
    assert terms["overhead"] == pytest.approx(0.5 + 16e-5 - _device_s(terms))


def test_a_gpu_profile_with_too_few_steps_keeps_the_fitted_overhead() -> None:
    # Two whole steps (a version 1 file): too few to fit a host set, so the step overhead is
    # fitted to them as before version 5 (the median residual, plus the per-sequence term).
    path = Path(__file__).parent / "data" / "llama2_7b_a100_tp1.json"
    model = make_cost_model(
        load_model_spec("Llama-2-7B"), GPU, 1, str(path), CostModelConfig(), block_size=16
    )
    assert model.host is None
    fixed = model.fitted["fixed_overhead_s"]
    assert fixed > 0
    terms = model.step_breakdown(StepShape(decode_context_tokens=(300,) * 3))
    assert terms["overhead"] == pytest.approx(fixed + 3 * 1e-5)


def test_a_data_parallel_step_prices_its_host_with_the_roofline_host_model() -> None:
    moe = load_model_spec("Qwen3-30B-A3B")
    shapes = [StepShape(decode_context_tokens=(700,) * 8), StepShape()]
    for config in (CostModelConfig(), CostModelConfig(engine="servesim-eager")):
        roofline = RooflineCostModel(moe, HARDWARE_PRESETS["H100-SXM"], 1, config, block_size=16)
        step = ExpertParallelCost(roofline, dp=2).group_step(shapes)
        for shape, terms in zip(shapes, step.per_rank, strict=True):
            device = sum(v for k, v in terms.items() if k not in ("overhead", "experts"))
            assert terms["overhead"] == roofline.host.step_overhead_s(shape, 16, device)
        if config.engine == "servesim-eager":  # its host launches layers: more than vLLM's
            assert step.per_rank[0]["overhead"] > VLLM_HOST.step_s
