"""`ModelSpec` and `RopeScaling`: the presets' shapes as the cost model has always priced them,
published parameter counts, validation naming field and value, KV bytes, tensor-parallel
sharding, and the context each RoPE scaling gives."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from core.model.presets import get_model_preset, preset_names
from core.model.spec import ModelSpec, RopeScaling

# Published parameter counts (billions) the presets must reproduce.
PARAMS_B = {
    "Llama-2-7B": 6.74,
    "Llama-2-13B": 13.02,
    "Llama-2-70B": 68.98,
    "Llama-3-8B": 8.03,
    "Llama-3-70B": 70.55,
    "Mistral-7B": 7.24,
    "Qwen2.5-7B": 7.62,
    "OPT-13B": 12.85,
    "Llama-3.1-8B": 8.03,
    "Llama-3.1-70B": 70.55,
    "Qwen3-8B": 8.19,
    "Qwen3-32B": 32.76,
    "Qwen3-30B-A3B": 30.53,
    "tiny-llama": 0.0069632,  # ours: 4 x 692,224 per layer + 2 x 8192 x 256 embeddings
}

# What the cost model reads of each preset, exactly as the simulator's presets stated it before
# they became config.json files: (layers, hidden, heads, kv heads, head_dim, intermediate,
# vocab, dtype bytes, max_model_len, gated MLP, tied, RoPE, QK norm), the RoPE scaling and
# (experts, per token, expert width, shared width). Simulated outputs depend on every one.
DENSE = (0, 0, 0, 0)
SHAPES: dict[str, tuple[Any, ...]] = {
    "Llama-2-7B": (32, 4096, 32, 32, 128, 11008, 32000, 2, 4096, True, False, True, False),
    "Llama-2-13B": (40, 5120, 40, 40, 128, 13824, 32000, 2, 4096, True, False, True, False),
    "Llama-2-70B": (80, 8192, 64, 8, 128, 28672, 32000, 2, 4096, True, False, True, False),
    "Llama-3-8B": (32, 4096, 32, 8, 128, 14336, 128256, 2, 8192, True, False, True, False),
    "Llama-3-70B": (80, 8192, 64, 8, 128, 28672, 128256, 2, 8192, True, False, True, False),
    "Mistral-7B": (32, 4096, 32, 8, 128, 14336, 32000, 2, 32768, True, False, True, False),
    "Qwen2.5-7B": (28, 3584, 28, 4, 128, 18944, 152064, 2, 32768, True, False, True, False),
    "Llama-3.1-8B": (32, 4096, 32, 8, 128, 14336, 128256, 2, 131072, True, False, True, False),
    "Llama-3.1-70B": (80, 8192, 64, 8, 128, 28672, 128256, 2, 131072, True, False, True, False),
    "Qwen3-8B": (36, 4096, 32, 8, 128, 12288, 151936, 2, 40960, True, False, True, True),
    "Qwen3-32B": (64, 5120, 64, 8, 128, 25600, 151936, 2, 40960, True, False, True, True),
    "Qwen3-30B-A3B": (48, 2048, 32, 4, 128, 6144, 151936, 2, 40960, True, False, True, True),
    "tiny-llama": (4, 256, 8, 2, 32, 688, 8192, 4, 4096, True, False, True, False),
    "OPT-13B": (40, 5120, 40, 40, 128, 20480, 50272, 2, 2048, False, True, False, False),
}
EXPERTS = {"Qwen3-30B-A3B": (128, 8, 768, 0)}
ROPE_SCALING = {"Llama-3.1-8B": "llama3", "Llama-3.1-70B": "llama3"}


def _priced(spec: ModelSpec) -> tuple[Any, ...]:
    return (
        spec.num_layers,
        spec.hidden_size,
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.intermediate_size,
        spec.vocab_size,
        spec.dtype_bytes,
        spec.max_model_len,
        spec.gated_mlp,
        spec.tie_word_embeddings,
        spec.uses_rope,
        spec.qk_norm,
    )


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_preset_prices_the_shapes_it_always_had(name: str) -> None:
    spec = get_model_preset(name)
    assert spec.name == name
    assert _priced(spec) == SHAPES[name]
    scaling = spec.rope_scaling.rope_type if spec.rope_scaling else None
    assert scaling == ROPE_SCALING.get(name)
    experts = (
        spec.num_experts,
        spec.num_experts_per_token,
        spec.moe_intermediate_size,
        spec.shared_expert_intermediate_size,
    )
    assert experts == EXPERTS.get(name, DENSE)


@pytest.mark.parametrize("name", preset_names())
def test_model_preset_parameter_count(name: str) -> None:
    assert get_model_preset(name).num_params / 1e9 == pytest.approx(PARAMS_B[name], rel=0.01)


def test_every_requested_preset_exists() -> None:
    assert set(preset_names()) == set(PARAMS_B) == set(SHAPES)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_layers", 0),
        ("hidden_size", -1),
        ("dtype", "int3"),
        ("num_kv_heads", 5),
        ("max_position_embeddings", 0),
        ("rms_norm_eps", -1.0),
        ("rope_theta", 0.0),
        ("partial_rotary_factor", 1.5),
        ("qkv_bias", 1),
        ("sliding_window", -4),
        ("eos_token_ids", (1, "2")),
        ("moe_intermediate_size", 4),
    ],
)
def test_model_spec_validation_names_field_and_value(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"ModelSpec\.{field}.*{re.escape(repr(value))}"):
        changes: dict[str, Any] = {field: value}
        replace(get_model_preset("Llama-2-7B"), **changes)


def test_kv_bytes_per_token_and_block() -> None:
    llama = get_model_preset("Llama-2-7B")
    assert llama.kv_bytes_per_token() == 32 * 2 * 32 * 128 * 2  # 512 KiB
    assert llama.kv_bytes_per_block(16) == 8 * 2**20
    assert llama.kv_bytes_per_token(tp=2) == llama.kv_bytes_per_token() // 2
    # Llama-3-70B has 8 KV heads: past tp=8 each rank keeps a replica of one head.
    llama3 = get_model_preset("Llama-3-70B")
    assert llama3.kv_bytes_per_token(tp=16) == llama3.kv_bytes_per_token(tp=8)


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="tp=3"):
        get_model_preset("Llama-2-7B").kv_bytes_per_token(tp=3)


def test_an_unstated_dtype_is_priced_as_16_bit() -> None:
    llama = replace(get_model_preset("tiny-llama"), dtype=None)
    assert llama.dtype_bytes == 2
    assert replace(llama, dtype="float8_e4m3fn").dtype_bytes == 1


def test_each_rope_scaling_gives_its_context() -> None:
    # llama3 and the like count their scaling in the positions already; yarn multiplies its
    # original context, linear the positions (vLLM's rule).
    assert RopeScaling("llama3", 8.0, 1.0, 4.0, 8192).context_length(131072) == 131072
    yarn = RopeScaling("yarn", 4.0, original_max_position_embeddings=32768)
    assert yarn.context_length(40960) == 131072
    assert RopeScaling("yarn", 4.0).context_length(32768) == 131072
    assert RopeScaling("linear", 2.0).context_length(4096) == 8192
    assert RopeScaling("mrope").context_length(4096) == 4096


def test_the_window_caps_only_the_full_attention_length() -> None:
    mistral = get_model_preset("Mistral-7B")
    assert mistral.sliding_window == 4096
    assert (mistral.max_model_len, mistral.full_attention_len) == (32768, 4096)
    linear = replace(get_model_preset("tiny-llama"), rope_scaling=RopeScaling("linear", 2.0))
    assert linear.max_model_len == linear.full_attention_len == 8192


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rope_type": "default"}, r"RopeScaling\.rope_type.*'default'"),
        ({"rope_type": "linear"}, r"RopeScaling\.factor is missing.*'linear'"),
        ({"rope_type": "llama3", "factor": 8.0}, r"RopeScaling\.low_freq_factor is missing"),
        ({"rope_type": "linear", "factor": -1.0}, r"RopeScaling\.factor.*positive.*-1\.0"),
        ({"rope_type": "yarn", "factor": 0.5}, r"RopeScaling\.factor must be >= 1.*0\.5"),
        (
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}
            | {"original_max_position_embeddings": 8192},
            r"RopeScaling\.high_freq_factor=1\.0 must exceed low_freq_factor=4\.0",
        ),
        (
            {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
            r"RopeScaling\.original_max_position_embeddings.*0",
        ),
    ],
)
def test_rope_scaling_validation_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RopeScaling(**kwargs)
