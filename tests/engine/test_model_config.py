"""ModelConfig from Hugging Face config.json files: the supported families and RoPE styles, the
bundled tiny-llama (the same model as the simulator's preset), and errors naming file and field."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.model.config import (
    ModelConfig,
    RopeScaling,
    bundled_config_names,
    load_model_config,
    model_config_from_hf,
)
from sim.specs.hf_config import model_spec_from_hf_config
from sim.specs.model import MODEL_PRESETS

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED = REPO_ROOT / "engine" / "model" / "configs"

# Published Llama-3.1-8B config.json (HF v4 key style), the fields we read.
LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_tiny_llama_is_bundled_and_matches_the_simulator_preset() -> None:
    assert "tiny-llama" in bundled_config_names()
    config = load_model_config("Tiny-Llama")
    spec = MODEL_PRESETS["tiny-llama"]
    assert (
        config.num_layers,
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
        config.vocab_size,
        config.max_model_len,
        config.tie_word_embeddings,
    ) == (
        spec.num_layers,
        spec.hidden_size,
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.intermediate_size,
        spec.vocab_size,
        spec.max_model_len,
        spec.tie_word_embeddings,
    )
    assert config.torch_dtype == "float32" and spec.dtype_bytes == 4
    # The simulator's own reader of the bundled file gives the preset too.
    from_file = model_spec_from_hf_config(BUNDLED / "tiny-llama.json", name="tiny-llama")
    assert from_file == spec
    assert config.num_kv_heads < config.num_heads  # GQA


def test_llama31_v4_keys() -> None:
    config = model_config_from_hf(LLAMA31_8B, name="Llama-3.1-8B")
    assert config.architecture == "llama"
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (32, 8, 128)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert config.torch_dtype == "bfloat16"
    assert not (config.qkv_bias or config.o_bias or config.mlp_bias or config.tie_word_embeddings)


def test_v5_rope_parameters_and_legacy_type_key() -> None:
    v5 = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = {**LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert model_config_from_hf(v5) == model_config_from_hf(LLAMA31_8B)
    legacy = {**LLAMA31_8B, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert model_config_from_hf(legacy).rope_scaling == RopeScaling("linear", 2.0)
    plain = {**LLAMA31_8B, "rope_scaling": None, "rope_theta": 10000.0}
    config = model_config_from_hf(plain)
    assert config.rope_scaling is None and config.rope_theta == 10000.0
    default = {**v5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert model_config_from_hf(default).rope_theta == 1e6


def test_qwen2_biases_tying_and_mistral_window() -> None:
    qwen = {
        **LLAMA31_8B,
        "architectures": ["Qwen2ForCausalLM"],
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "sliding_window": 131072,
        "use_sliding_window": False,
    }
    config = model_config_from_hf(qwen)
    assert config.architecture == "qwen2"
    assert config.qkv_bias and not config.o_bias and config.tie_word_embeddings
    assert config.sliding_window is None
    mistral = {k: v for k, v in qwen.items() if k != "architectures"}
    mistral |= {"model_type": "mistral", "sliding_window": 4096, "tie_word_embeddings": False}
    config = model_config_from_hf(mistral)
    assert config.architecture == "mistral" and not config.qkv_bias
    assert config.max_model_len == 4096  # full attention is exact only up to the window


def test_explicit_head_dim_and_default_kv_heads() -> None:
    raw = {**LLAMA31_8B, "head_dim": 64, "num_key_value_heads": None}
    config = model_config_from_hf(raw)
    assert config.head_dim == 64 and config.num_kv_heads == 32
    assert config.q_size == 32 * 64


def test_directory_and_file_paths(tmp_path: Path) -> None:
    directory = write_config(tmp_path, LLAMA31_8B)
    by_dir = load_model_config(directory)
    assert by_dir.name == tmp_path.name
    assert replace(load_model_config(directory / "config.json"), name="x") == replace(
        by_dir, name="x"
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"architectures": None, "model_type": "gpt2"}, "model_type"),
        ({"architectures": None, "model_type": None}, "architectures"),
        ({"hidden_size": None}, "hidden_size"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"vocab_size": None}, "vocab_size"),
        ({"rms_norm_eps": None}, "rms_norm_eps"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -1.0}}, "factor"),
        ({"hidden_size": "4096"}, "hidden_size.*positive int"),
        ({"intermediate_size": 1.5}, "intermediate_size"),
        ({"num_key_value_heads": 5}, "num_kv_heads"),
        ({"head_dim": None, "hidden_size": 4097}, "head_dim"),
    ],
)
def test_bad_config_errors_name_file_and_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    path = write_config(tmp_path, {**LLAMA31_8B, **change}) / "config.json"
    with pytest.raises(ValueError, match=field) as error:
        load_model_config(tmp_path)
    assert str(path) in str(error.value)


def test_unreadable_files_and_unknown_names(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: cannot read a JSON config"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_model_config(tmp_path)
    with pytest.raises(ValueError, match=r"'no-such-model'.*tiny-llama"):
        load_model_config("no-such-model")


def test_validation_names_the_field() -> None:
    config = load_model_config("tiny-llama")
    with pytest.raises(ValueError, match=r"ModelConfig\.num_layers.*0"):
        replace(config, num_layers=0)
    with pytest.raises(ValueError, match=r"ModelConfig\.architecture.*'gpt2'"):
        replace(config, architecture="gpt2")
    with pytest.raises(ValueError, match=r"ModelConfig\.sliding_window"):
        replace(config, sliding_window=-4)
    with pytest.raises(ValueError, match=r"RopeScaling\.high_freq_factor"):
        RopeScaling("llama3", 8.0, low_freq_factor=4.0, high_freq_factor=1.0)
    assert isinstance(config, ModelConfig)


def test_both_readers_take_dtype_over_torch_dtype(tmp_path: Path) -> None:
    # A config written by a newer transformers may carry both keys; both readers take "dtype".
    write_config(tmp_path, {**LLAMA31_8B, "torch_dtype": "bfloat16", "dtype": "float32"})
    assert load_model_config(tmp_path).torch_dtype == "float32"
    assert model_spec_from_hf_config(tmp_path).dtype_bytes == 4


def test_both_readers_reject_a_fractional_head_dim(tmp_path: Path) -> None:
    write_config(tmp_path, {**LLAMA31_8B, "head_dim": None, "hidden_size": 4097})
    with pytest.raises(ValueError, match="head_dim"):
        load_model_config(tmp_path)
    with pytest.raises(ValueError, match=r"config\.json: head_dim is missing"):
        model_spec_from_hf_config(tmp_path)
