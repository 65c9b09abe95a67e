"""The engine reads models as the simulator does (``core.model``) and refuses, naming the
config field, what its torch model cannot run; a name gives both executors the same
description."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import PRESETS_DIR, load_model_spec, preset_names
from core.model.spec import ModelSpec
from core.settings import build
from engine.model.support import UnsupportedModelError, engine_model_spec, unsupported_field

ROOT = Path(__file__).resolve().parents[2]
# The presets the engine runs (the Llama family); the others it refuses.
RUNNABLE = {
    "Llama-2-7B",
    "Llama-2-13B",
    "Llama-2-70B",
    "Llama-3-8B",
    "Llama-3-70B",
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Mistral-7B",
    "Qwen2.5-7B",
    "tiny-llama",
}
LLAMA31_8B = json.loads((PRESETS_DIR / "Llama-3.1-8B.json").read_text())


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("name", preset_names())
def test_a_preset_name_gives_both_sides_one_description(name: str) -> None:
    sim_side = load_model_spec(name.upper())
    if name in RUNNABLE:
        assert engine_model_spec(name.lower()) == sim_side
        return
    with pytest.raises(UnsupportedModelError, match=rf"model preset '{name}': field '\w+'"):
        engine_model_spec(name)


def test_the_simulators_cost_model_and_the_engines_model_share_the_description() -> None:
    """Through each executor's own entry: the roofline `sim.run.simulate` builds, and the torch
    model `LLMEngine` loads, for the same --model value."""
    pytest.importorskip("torch")
    from engine.llm_engine import EngineConfig, LLMEngine
    from sim.run import RunConfig, simulate
    from traces.loaders import load_trace

    trace = load_trace(ROOT / "traces" / "data" / "example.csv")
    trace = replace(trace, requests=trace.requests[:2])
    priced: list[ModelSpec] = []

    def keep(executor: Any) -> Any:
        priced.append(executor.cost_model.model)
        return executor

    simulate(trace, RunConfig(model="Tiny-Llama", hardware="CPU-1T"), wrap_executor=keep)
    engine = LLMEngine(build(EngineConfig, model="tiny-llama", weights="random", num_blocks=8))
    assert priced and all(spec == engine.model.config for spec in priced)
    assert engine.model.config.dtype_bytes == 4 and engine.model.config.num_kv_heads == 2


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures", "'GPT2LMHeadModel'"),
        ({"architectures": None, "model_type": "gpt2"}, "model_type", "'gpt2'"),
        ({"architectures": None, "model_type": None}, "architectures", "no 'model_type'"),
        ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "architectures", "Qwen3"),
        (
            {"num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512},
            "num_experts",
            "mixture of experts",
        ),
        ({"hidden_act": "gelu"}, "hidden_act", "'gelu'"),
        ({"rms_norm_eps": None}, "rms_norm_eps", "missing"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type", "yarn"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor", "full rotary"),
        ({"torch_dtype": "float8_e4m3fn"}, "torch_dtype", "'float8_e4m3fn'"),
    ],
)
def test_what_the_engine_cannot_run_is_refused_naming_file_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, why: str
) -> None:
    _write(tmp_path, {**LLAMA31_8B, **change})
    load_model_spec(tmp_path)  # the simulator reads it
    with pytest.raises(UnsupportedModelError, match=rf"field '{field}': .*{why}") as error:
        engine_model_spec(tmp_path)
    assert str(error.value).startswith(f"{tmp_path / 'config.json'}: ")


def test_the_llama_family_runs() -> None:
    spec = load_model_spec("Llama-3.1-8B")
    assert unsupported_field(spec) is None
    assert unsupported_field(replace(spec, architecture="", model_type="qwen2")) is None
    assert unsupported_field(replace(spec, dtype=None)) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"config\.json: cannot read a JSON config \("),
        (b"\x00\x01binary", r"config\.json: model config is a binary file"),
    ],
)
@pytest.mark.parametrize("side", ["sim", "engine"])
def test_unreadable_files_fail_alike_on_both_sides(
    tmp_path: Path, side: str, content: bytes, message: str
) -> None:
    read = load_model_spec if side == "sim" else engine_model_spec
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read(tmp_path)
    with pytest.raises(ValueError, match=r"'no-such-model': no such file.*tiny-llama"):
        read("no-such-model")


def test_the_engine_cli_refuses_a_model_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from engine.cli import main

    trace = str(ROOT / "traces" / "data" / "example.csv")
    assert main(["run", trace, "--model", "OPT-13B", "--weights", "random"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model preset 'OPT-13B': field 'architectures'")
    assert "OPTForCausalLM" in err


def test_linear_rope_scaling_runs_the_scaled_context(tmp_path: Path) -> None:
    """Linear scaling multiplies the context (vLLM's rule): the engine's RoPE table and its
    length limit cover it, where a sliding window would cap the limit instead."""
    pytest.importorskip("torch")
    from engine.llm_engine import EngineConfig, LLMEngine

    tiny = json.loads((PRESETS_DIR / "tiny-llama.json").read_text())
    linear = {"rope_type": "linear", "factor": 2.0}
    _write(tmp_path, tiny | {"max_position_embeddings": 256, "rope_scaling": linear})
    engine = LLMEngine(build(EngineConfig, model=str(tmp_path), weights="random", num_blocks=64))
    assert engine.model.cos_sin_cache.shape[0] == engine.cache_config.max_model_len == 512
    with pytest.raises(ValueError, match=r"exceeds .*'s context of 512 tokens"):
        LLMEngine(build(EngineConfig, model=str(tmp_path), weights="random", max_model_len=513))
