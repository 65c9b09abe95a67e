"""Profile format version 2: per-direction swaps, input preparation, decode attention priced at
the batch's longest context, listed check-point contexts; and profiles for another model or
block size refused with an error naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import get_model_preset
from sim.cli.main import main as sim_main
from sim.costmodel.base import StepShape, make_cost_model
from sim.costmodel.profile import load_profile
from sim.specs.hardware import HARDWARE_PRESETS
from tests.sim.profile_header import cpu_profile_header

ROOT = Path(__file__).resolve().parents[2]
TINY = get_model_preset("tiny-llama")
CPU = HARDWARE_PRESETS["CPU-1T"]


def _v2(rule: str = "max") -> dict[str, Any]:
    return {
        **cpu_profile_header(2),
        "decode_attention_context": rule,
        "ops": {
            "decode_attention": {
                "num_seqs": [1, 2],
                "context_tokens": [100, 1000],
                "time_s": [[1e-3, 1e-2], [2e-3, 2e-2]],
            },
            "swap_out": {"num_bytes": [1, 1e9], "time_s": [1e-3, 1.0]},
            "swap_in": {"num_bytes": [1, 1e9], "time_s": [2e-3, 2.0]},
            "prepare": {"num_seqs": [1, 100], "time_s": [1e-4, 1e-2]},
        },
        "steps": [
            {
                "prefill_chunks": [],
                "num_decode_seqs": 2,
                "sum_decode_context_tokens": 1100,
                "decode_context_tokens": [100, 1000],
                "measured_s": 1.0,
            }
        ],
    }


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def _terms(path: Path, shape: StepShape) -> dict[str, float]:
    cost = make_cost_model(TINY, CPU, profile_path=path, block_size=16)
    return cost.step_breakdown(shape)


def test_decode_attention_at_the_longest_or_the_mean_context(tmp_path: Path) -> None:
    shape = StepShape(decode_context_tokens=(100, 1000))
    longest = _terms(_write(tmp_path, _v2("max")), shape)["decode_attention"]
    assert longest == pytest.approx(TINY.num_layers * 2e-2)
    mean = _terms(_write(tmp_path, _v2("mean")), shape)["decode_attention"]
    # Mean context 550: halfway between 100 and 1000 on the 2-sequence row.
    assert mean == pytest.approx(TINY.num_layers * 1.1e-2)


def test_swaps_each_way_and_preparation(tmp_path: Path) -> None:
    path = _write(tmp_path, _v2())
    block_bytes = TINY.kv_bytes_per_block(16)
    terms = _terms(path, StepShape(decode_context_tokens=(100,), num_swap_out_blocks=4))
    out_only = 1e-3 + (1.0 - 1e-3) * (4 * block_bytes - 1) / (1e9 - 1)
    assert terms["swap"] == pytest.approx(out_only)
    terms = _terms(path, StepShape(decode_context_tokens=(100,), num_swap_in_blocks=4))
    assert terms["swap"] == pytest.approx(2 * out_only)
    # The check-point step is priced exactly by the tables, so its residual is the overhead.
    profile = load_profile(path)
    assert profile.steps[0].decode_context_tokens == (100, 1000)
    two = _terms(path, StepShape(decode_context_tokens=(100, 1000)))
    assert sum(two.values()) == pytest.approx(1.0)


def test_check_point_contexts_must_agree_with_their_sum(tmp_path: Path) -> None:
    data = _v2()
    data["steps"][0]["decode_context_tokens"] = [100, 999]
    with pytest.raises(ValueError, match=r"steps\[0\].decode_context_tokens"):
        load_profile(_write(tmp_path, data))
    data = _v2("median")
    with pytest.raises(ValueError, match="decode_attention_context"):
        load_profile(_write(tmp_path, data))


def test_a_profile_for_another_model_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, _v2())
    llama = get_model_preset("Llama-2-7B")
    with pytest.raises(ValueError, match="field 'model': profile is for 'tiny-llama'"):
        make_cost_model(llama, HARDWARE_PRESETS["A100-80GB"], profile_path=path, block_size=16)


def test_a_profile_for_another_block_size_is_refused_on_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, _v2())
    trace = ROOT / "traces" / "data" / "example.csv"
    argv = ["run", str(trace), "--model", "tiny-llama", "--hardware", "CPU-1T", "--quiet"]
    code = sim_main([*argv, "--profile", str(path), "--block-size", "32", "--num-blocks", "999"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ")
    assert "field 'block_size': profile measured at block size 16, the run uses 32" in err
