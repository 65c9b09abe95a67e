"""The one ``config.json`` reader: the families people run today (Llama-2/3/3.1, Mistral,
Qwen2/2.5, Qwen3, OPT, Mixtral, Qwen2/3-MoE), the v4 and v5 RoPE keys, the numerics the engine
needs, gzip and directories, and errors that name the file and the key."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from core.model.hf_config import config_json_path, model_spec_from_hf_config, read_config_json
from core.model.presets import get_model_preset
from core.model.spec import RopeScaling

# Keys as in the published config.json files (trimmed of keys the reader ignores).
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
LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
}
OPT_13B = {
    "model_type": "opt",
    "hidden_size": 5120,
    "ffn_dim": 20480,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "torch_dtype": "float16",
}
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _shapes_only(spec: Any, name: str) -> Any:
    """The spec with the numerics a trimmed test config leaves out set as the preset's, so
    that the two compare on what the trimmed config states."""
    preset = get_model_preset(name)
    return replace(
        spec,
        name=name,
        architecture=preset.architecture,
        rms_norm_eps=preset.rms_norm_eps,
        rope_theta=preset.rope_theta,
        eos_token_ids=preset.eos_token_ids,
        hidden_act=preset.hidden_act,
        sliding_window=preset.sliding_window,
    )


def test_llama2_and_opt_configs_match_their_presets(tmp_path: Path) -> None:
    llama = model_spec_from_hf_config(_write(tmp_path, LLAMA2_7B), name="Llama-2-7B")
    assert _shapes_only(llama, "Llama-2-7B") == get_model_preset("Llama-2-7B")
    opt = model_spec_from_hf_config(_write(tmp_path, OPT_13B))
    assert not (opt.gated_mlp or opt.uses_rope) and opt.tie_word_embeddings
    assert _shapes_only(opt, "OPT-13B") == get_model_preset("OPT-13B")


def test_llama31_v4_keys(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, LLAMA31_8B), name="Llama-3.1-8B")
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (32, 32, 8, 128)
    assert spec.max_model_len == 131072  # llama3 scaling is already in max_position_embeddings
    assert spec.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert spec.rope_theta == 500000.0 and spec.rms_norm_eps == 1e-05
    assert spec.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2  # 128 KiB
    assert spec.dtype == "bfloat16" and spec.architecture == "LlamaForCausalLM"
    assert not (spec.qkv_bias or spec.o_bias or spec.mlp_bias or spec.tie_word_embeddings)
    assert replace(spec, eos_token_ids=(128001,)) == get_model_preset("Llama-3.1-8B")


def test_v5_rope_parameters_and_legacy_type_key() -> None:
    v5 = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = {**LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert model_spec_from_hf_config(v5) == model_spec_from_hf_config(LLAMA31_8B)
    legacy = {**LLAMA31_8B, "rope_scaling": {"type": "linear", "factor": 2.0}}
    linear = model_spec_from_hf_config(legacy)
    assert linear.rope_scaling == RopeScaling("linear", 2.0)
    assert linear.max_model_len == 2 * 131072  # linear multiplies the positions (vLLM's rule)
    plain = {**LLAMA31_8B, "rope_scaling": None, "rope_theta": 10000.0}
    spec = model_spec_from_hf_config(plain)
    assert spec.rope_scaling is None and spec.rope_theta == 10000.0
    default = {**v5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert model_spec_from_hf_config(default).rope_theta == 1e6
    assert model_spec_from_hf_config(default).rope_scaling is None
    v5_yarn = {**v5, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}
    assert model_spec_from_hf_config(v5_yarn).max_model_len == 4 * 131072


def test_qwen3_config_has_explicit_head_dim_and_qk_norm(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, QWEN3_32B), name="Qwen3-32B")
    # 64 heads x 128 = 8192 is not hidden_size 5120: head_dim must come from the config.
    assert spec.head_dim == 128 and spec.q_size == 8192 and spec.kv_size == 1024
    assert spec.qk_norm and spec.max_model_len == 40960
    assert _shapes_only(spec, "Qwen3-32B") == get_model_preset("Qwen3-32B")
    # Published size: 32.8B parameters.
    assert spec.num_params / 1e9 == pytest.approx(32.76, abs=0.01)


def test_qwen3_moe_config_matches_preset_and_active_size(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, QWEN3_30B_A3B), name="Qwen3-30B-A3B")
    assert _shapes_only(spec, "Qwen3-30B-A3B") == get_model_preset("Qwen3-30B-A3B")
    assert spec.num_params / 1e9 == pytest.approx(30.53, abs=0.01)  # "30B"
    active = spec.num_layers * spec.active_params_per_layer + spec.embedding_params
    assert active / 1e9 == pytest.approx(3.35, abs=0.01)  # "A3B"


def test_yarn_scaling_multiplies_the_original_context(tmp_path: Path) -> None:
    config = {
        **QWEN3_32B,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    }
    spec = model_spec_from_hf_config(_write(tmp_path, config))
    assert spec.max_model_len == 131072
    assert spec.rope_scaling is not None and spec.rope_scaling.rope_type == "yarn"


def test_mixtral_and_shared_experts(tmp_path: Path) -> None:
    mixtral = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }
    spec = model_spec_from_hf_config(_write(tmp_path, mixtral))
    experts = (spec.num_experts, spec.num_experts_per_token, spec.moe_intermediate_size)
    assert experts == (8, 2, 14336)
    assert spec.num_params / 1e9 == pytest.approx(46.7, abs=0.05)  # Mixtral-8x7B: 46.7B
    shared = {**QWEN3_30B_A3B, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 5632}
    del shared["architectures"]
    with_shared = model_spec_from_hf_config(_write(tmp_path, shared))
    extra = (
        with_shared.active_params_per_layer
        - get_model_preset("Qwen3-30B-A3B").active_params_per_layer
    )
    assert extra == 3 * 2048 * 5632
    assert not with_shared.qk_norm


def test_qwen2_biases_tying_and_mistral_window() -> None:
    qwen = {
        **LLAMA31_8B,
        "architectures": ["Qwen2ForCausalLM"],
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "sliding_window": 131072,
        "use_sliding_window": False,
    }
    spec = model_spec_from_hf_config(qwen)
    assert spec.qkv_bias and not spec.o_bias and spec.tie_word_embeddings
    assert spec.sliding_window is None  # Qwen2's window applies only with use_sliding_window
    mistral = {k: v for k, v in qwen.items() if k != "architectures"}
    mistral |= {"model_type": "mistral", "sliding_window": 4096, "tie_word_embeddings": False}
    spec = model_spec_from_hf_config(mistral)
    assert spec.model_type == "mistral" and not spec.qkv_bias
    assert spec.sliding_window == 4096 and spec.full_attention_len == 4096


def test_explicit_head_dim_default_kv_heads_and_eos_lists() -> None:
    raw = {**LLAMA31_8B, "head_dim": 64, "num_key_value_heads": None, "eos_token_id": [1, 9]}
    spec = model_spec_from_hf_config(raw)
    assert spec.head_dim == 64 and spec.num_kv_heads == 32 and spec.q_size == 32 * 64
    assert spec.eos_token_ids == (1, 9)
    assert model_spec_from_hf_config({**raw, "eos_token_id": 7}).eos_token_ids == (7,)


def test_dtype_wins_over_torch_dtype_and_aliases_read(tmp_path: Path) -> None:
    # A config written by a newer transformers may carry both keys; "dtype" is the newer.
    _write(tmp_path, {**LLAMA31_8B, "torch_dtype": "bfloat16", "dtype": "float32"})
    assert model_spec_from_hf_config(tmp_path).dtype_bytes == 4
    assert model_spec_from_hf_config({**LLAMA31_8B, "torch_dtype": "half"}).dtype == "float16"
    fp8 = model_spec_from_hf_config({**LLAMA31_8B, "torch_dtype": "float8_e4m3fn"})
    assert fp8.dtype_bytes == 1
    silent = {k: v for k, v in LLAMA31_8B.items() if k != "torch_dtype"}
    assert model_spec_from_hf_config(silent).dtype is None


def test_names_a_directory_and_a_file(tmp_path: Path) -> None:
    _write(tmp_path, LLAMA31_8B)
    assert model_spec_from_hf_config(tmp_path).name == tmp_path.name
    assert model_spec_from_hf_config(tmp_path / "config.json").name == tmp_path.name
    _write(tmp_path, {**LLAMA31_8B, "_name_or_path": "meta-llama/Llama-3.1-8B"})
    assert model_spec_from_hf_config(tmp_path).name == "meta-llama/Llama-3.1-8B"
    assert model_spec_from_hf_config(tmp_path, name="mine").name == "mine"


def test_a_directory_means_its_config_json_and_gzip_reads(tmp_path: Path) -> None:
    _write(tmp_path, LLAMA31_8B)
    assert config_json_path(tmp_path) == tmp_path / "config.json"
    assert config_json_path(tmp_path / "config.json") == tmp_path / "config.json"
    assert read_config_json(tmp_path) == (tmp_path / "config.json", LLAMA31_8B)
    plain = model_spec_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_bytes(gzip.compress(json.dumps(LLAMA31_8B).encode()))
    assert model_spec_from_hf_config(tmp_path) == plain


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, r"field 'hidden_size': missing \(ModelSpec\.hidden_size"),
        ({"num_hidden_layers": None}, "'num_hidden_layers': missing"),
        ({"vocab_size": None}, "'vocab_size': missing"),
        ({"intermediate_size": None}, "'intermediate_size': missing"),
        ({"torch_dtype": "int8"}, r"field 'torch_dtype': unknown dtype 'int8'"),
        ({"dtype": "int4"}, r"field 'dtype': unknown dtype 'int4'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"rope_scaling.*low_freq"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -1.0}}, r"rope_scaling.*factor"),
        ({"rope_scaling": [1, 2]}, r"field 'rope_scaling': must be an object or null"),
        ({"hidden_size": "4096"}, r"ModelSpec\.hidden_size must be a positive int, got '4096'"),
        ({"intermediate_size": 1.5}, r"ModelSpec\.intermediate_size.*1\.5"),
        ({"num_key_value_heads": 5}, "num_kv_heads=5 must divide"),
        ({"head_dim": None, "hidden_size": 4097}, r"field 'head_dim': missing, and hidden"),
        ({"eos_token_id": "2"}, r"field 'eos_token_id': must be an int or a list of ints"),
        ({"architectures": "LlamaForCausalLM"}, r"field 'architectures': must be a list"),
        ({"num_experts": 4, "num_experts_per_tok": 2}, r"'moe_intermediate_size': missing"),
        ({"num_experts": 4}, r"'num_experts_per_tok': missing"),
    ],
)
def test_bad_configs_name_the_file_and_the_key(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path, {**LLAMA31_8B, **change})
    with pytest.raises(ValueError, match=message) as error:
        model_spec_from_hf_config(tmp_path)
    assert str(error.value).startswith(f"{path}: ")


def test_another_familys_config_is_refused_by_its_class(tmp_path: Path) -> None:
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768}
    path = _write(tmp_path, gpt2 | {"n_layer": 12, "n_head": 12, "vocab_size": 50257})
    message = r"field 'architectures': unsupported architecture 'GPT2LMHeadModel': .*'hidden_size'"
    with pytest.raises(ValueError, match=message) as error:
        model_spec_from_hf_config(tmp_path)
    assert str(error.value).startswith(f"{path}: ")
    # An unknown class with every key a Llama has is read as one.
    other = model_spec_from_hf_config({**LLAMA31_8B, "architectures": ["MyLlamaForCausalLM"]})
    assert other.architecture == "MyLlamaForCausalLM" and other.num_layers == 32


def test_moe_configs_we_cannot_model_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]})
    with pytest.raises(ValueError, match=r"config\.json: .*dense layers between MoE layers"):
        model_spec_from_hf_config(path)
    path = _write(tmp_path, {**QWEN3_30B_A3B, "num_experts_per_tok": 200})
    with pytest.raises(ValueError, match=r"config\.json: .*num_experts_per_token.*200"):
        model_spec_from_hf_config(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"config\.json: cannot read a JSON config \("),
        (b"[1, 2]", r"config\.json: expected a JSON object at the top level"),
        (b"\x00\x01binary", r"config\.json: model config is a binary file"),
        (b'{"a": "\xff\xfe"}', r"config\.json: model config is not UTF-8 text"),
    ],
)
def test_unreadable_files_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        model_spec_from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(error.value)
    with pytest.raises(ValueError, match=r"nope\.json: cannot read a JSON config"):
        model_spec_from_hf_config(tmp_path / "nope.json")
