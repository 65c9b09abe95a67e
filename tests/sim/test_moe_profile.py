"""A mixture of experts priced from an LLMServingSim bundle's MoE table (``moe.csv``): the
import, the experts its tokens activate, the table read for one GPU or for its share of the
experts under data parallelism, and the simulator running such a group on the profile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.model.presets import get_model_preset
from sim.costmodel.base import CostModelConfig, make_cost_model
from sim.costmodel.calibrated import CalibratedCostModel
from sim.costmodel.expert_parallel import ExpertParallelCost
from sim.costmodel.layer_ops import experts_touched as activated_experts
from sim.costmodel.llmservingsim_import import (
    ProfileBundleError,
    llmservingsim_profile,
    write_profile,
)
from sim.costmodel.moe_table import experts_from_table
from sim.costmodel.profile import Table2D, load_profile
from sim.costmodel.step_shape import StepShape
from sim.run import RunConfig, simulate
from sim.specs.hardware import HARDWARE_PRESETS
from tests.sim.llmservingsim_bundle import (
    ACTIVATED,
    TOKENS,
    dense_us,
    moe_us,
    write_bundle,
    write_moe_bundle,
)
from traces.schema import Trace, TraceRequest

MOE = get_model_preset("Qwen3-30B-A3B")
GPU = HARDWARE_PRESETS["RTX-PRO-6000-Server"]


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    out = tmp_path / "moe.json"
    write_profile(llmservingsim_profile(write_moe_bundle(tmp_path / "b"), 1, "cmd"), out)
    return out


def test_the_moe_table_imports_as_a_grid_of_tokens_by_activated_experts(tmp_path: Path) -> None:
    profile = llmservingsim_profile(write_moe_bundle(tmp_path / "b"), 1, "cmd")
    ops = profile["ops"]
    experts = ops["experts"]
    assert experts["num_tokens"] == list(TOKENS)
    assert experts["activated_experts"] == list(ACTIVATED)
    for i, t in enumerate(TOKENS):
        for j, a in enumerate(ACTIVATED):
            # Past 8 experts a token the profiler times nothing: the row's last timed count.
            timed = min(a, 8 * t)
            assert experts["time_s"][i][j] == pytest.approx(moe_us(t, timed) * 1e-6)
    # The dense table holds the attention projections alone: the MLP is the MoE layer.
    linear = [(dense_us("qkv_proj", t) + dense_us("o_proj", t)) * 1e-6 for t in TOKENS]
    assert ops["linear"]["time_s"] == pytest.approx(linear)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop", r"moe\.csv: missing; Qwen3-30B-A3B is a mixture of experts"),
        ("1,8,", r"moe\.csv:2: tokens 1, activated_experts 200: needs tokens >= 1"),
        ("4,16,", r"moe\.csv: tokens 4 has activated_experts \[8, 32\], a gap below 32"),
        ("2,8,", r"moe\.csv:\d+: point \[2, 16\] measured twice"),
    ],
)
def test_a_bad_moe_table_is_refused_naming_the_file(
    tmp_path: Path, change: str, message: str
) -> None:
    root = write_moe_bundle(tmp_path / "b")
    moe = root / "tp1" / "moe.csv"
    lines = moe.read_text().splitlines()
    if change == "drop":
        moe.unlink()
    elif change == "1,8,":
        moe.write_text(moe.read_text().replace("\n1,8,", "\n1,200,", 1))
    elif change == "4,16,":
        moe.write_text("\n".join(line for line in lines if not line.startswith("4,16,")) + "\n")
    else:
        moe.write_text(moe.read_text().replace("\n2,8,", "\n2,16,", 1))
    with pytest.raises(ProfileBundleError, match=message):
        llmservingsim_profile(root, 1, "cmd")


def test_a_dense_models_bundle_with_a_moe_table_is_refused(tmp_path: Path) -> None:
    root = write_bundle(tmp_path / "b")
    (root / "tp1" / "moe.csv").write_text("tokens,activated_experts,time_us\n1,8,5\n")
    with pytest.raises(ProfileBundleError, match=r"moe\.csv: tiny-llama has no experts"):
        llmservingsim_profile(root, 1, "cmd")


def test_tokens_activate_the_experts_uniform_routing_expects() -> None:
    assert activated_experts(MOE, 0) == 0.0
    assert activated_experts(MOE, 1) == pytest.approx(8.0)
    assert activated_experts(MOE, 16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert 127.9 < activated_experts(MOE, 1024) <= 128


def test_a_gpus_share_reads_the_table_at_its_pairs_and_its_experts(profile_path: Path) -> None:
    table = load_profile(profile_path).ops["experts"]
    assert isinstance(table, Table2D)
    # One GPU with every expert: 64 tokens over the experts they activate.
    assert experts_from_table(table, MOE, 64) == pytest.approx(
        table(64, activated_experts(MOE, 64))
    )
    # Two GPUs with 64 experts each: half the pairs (as 32 tokens) over half the experts.
    assert experts_from_table(table, MOE, 64, 2) == pytest.approx(
        table(32, activated_experts(MOE, 64) / 2)
    )
    # A share smaller than one token reads the table's first row.
    assert experts_from_table(table, MOE, 1, 2) == pytest.approx(table(1, 4.0))
    assert experts_from_table(table, MOE, 0) == 0.0


def test_a_step_prices_the_moe_layer_from_the_table(profile_path: Path) -> None:
    model = make_cost_model(MOE, GPU, 1, profile_path, CostModelConfig(), block_size=16)
    assert isinstance(model, CalibratedCostModel)
    table = model.profile.ops["experts"]
    assert isinstance(table, Table2D)
    shape = StepShape(decode_context_tokens=(200,) * 16)
    linear = (dense_us("qkv_proj", 16) + dense_us("o_proj", 16)) * 1e-6
    experts = table(16, activated_experts(MOE, 16))
    assert model.step_breakdown(shape)["linear"] == pytest.approx(
        MOE.num_layers * (linear + experts)
    )


def test_a_data_parallel_group_takes_its_experts_share_from_the_table(
    profile_path: Path,
) -> None:
    model = make_cost_model(MOE, GPU, 1, profile_path, CostModelConfig(), block_size=16)
    assert isinstance(model, CalibratedCostModel)
    cost = ExpertParallelCost(model.fallback, 2, model)
    shapes = [StepShape(decode_context_tokens=(300,) * 20), StepShape()]
    step = cost.group_step(shapes)
    table = model.profile.ops["experts"]
    assert isinstance(table, Table2D)
    share = MOE.num_layers * table(20, activated_experts(MOE, 40) / 2)
    assert step.per_rank[0]["experts"] == pytest.approx(share)
    # The rank's own step priced its 20 tokens over every expert; the group swaps in its share.
    own = model.step_breakdown(StepShape(decode_context_tokens=(300,) * 20))["linear"]
    whole = MOE.num_layers * table(20, activated_experts(MOE, 20))
    assert step.per_rank[0]["linear"] == pytest.approx(own - whole + share)


def test_the_simulator_runs_a_data_parallel_moe_on_the_profile(
    profile_path: Path, tmp_path: Path
) -> None:
    trace = Trace("moe", tuple(TraceRequest(f"r{i}", 0.01 * i, 64, 8) for i in range(12)))
    config = RunConfig(
        model="Qwen3-30B-A3B",
        hardware="RTX-PRO-6000-Server",
        profile=str(profile_path),
        data_parallel_size=2,
        enable_expert_parallel=True,
    )
    result = simulate(trace, config)
    assert result.summary["completed"] == 12
    roofline = simulate(trace, dataclasses.replace(config, profile=None))
    assert result.summary != roofline.summary  # the profile priced the steps
    json.dumps(result.summary)  # the summary stays JSON-ready


def test_only_a_version_5_profile_may_carry_the_moe_table(profile_path: Path) -> None:
    data = {**json.loads(profile_path.read_text()), "format_version": 4}
    del data["ops"]["attention"], data["decode_skew"]  # (version-5 fields as well)
    path = profile_path.with_name("v4.json")
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"field 'ops\.experts': unknown op"):
        load_profile(path)


def test_the_import_command_says_it_took_the_moe_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.cli.main import main

    bundle, out = write_moe_bundle(tmp_path / "b"), tmp_path / "p.json"
    assert (
        main(["profile", "import-llmservingsim", str(bundle), "--tp", "1", "--out", str(out)]) == 0
    )
    assert "lm_head, the MoE layer and" in capsys.readouterr().out
    assert isinstance(load_profile(out).ops["experts"], Table2D)
