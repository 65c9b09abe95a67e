"""Models people run today: Llama-3.1 and Qwen3 config.json files, RoPE-scaled context, and the
mixture-of-experts FLOP and byte counts against hand computations."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import HARDWARE_PRESETS
from sim.specs.hf_config import model_spec_from_hf_config
from sim.specs.model import MODEL_PRESETS, ModelSpec

# Keys as in the published config.json files (trimmed of keys the reader ignores).
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
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


def _write(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_llama31_config_has_128k_context_and_gqa(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, LLAMA31_8B), name="Llama-3.1-8B")
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (32, 32, 8, 128)
    assert spec.max_model_len == 131072  # llama3 scaling is already in max_position_embeddings
    assert spec.rope_scaling_type == "llama3"
    assert spec.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2  # 128 KiB
    assert spec == MODEL_PRESETS["Llama-3.1-8B"]


def test_qwen3_config_has_explicit_head_dim_and_qk_norm(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, QWEN3_32B), name="Qwen3-32B")
    # 64 heads x 128 = 8192 is not hidden_size 5120: head_dim must come from the config.
    assert spec.head_dim == 128 and spec.q_size == 8192 and spec.kv_size == 1024
    assert spec.qk_norm and spec.max_model_len == 40960
    assert spec == MODEL_PRESETS["Qwen3-32B"]
    # Published size: 32.8B parameters.
    assert spec.num_params / 1e9 == pytest.approx(32.76, abs=0.01)


def test_qwen3_moe_config_matches_preset_and_active_size(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, QWEN3_30B_A3B), name="Qwen3-30B-A3B")
    assert spec == MODEL_PRESETS["Qwen3-30B-A3B"]
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
    assert spec.max_model_len == 131072 and spec.rope_scaling_type == "yarn"


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
    assert (spec.num_experts, spec.num_experts_per_token, spec.moe_intermediate_size) == (
        8,
        2,
        14336,
    )
    assert spec.num_params / 1e9 == pytest.approx(46.7, abs=0.05)  # Mixtral-8x7B: 46.7B
    shared = {**QWEN3_30B_A3B, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 5632}
    with_shared = model_spec_from_hf_config(_write(tmp_path, shared))
    extra = (
        with_shared.active_params_per_layer - MODEL_PRESETS["Qwen3-30B-A3B"].active_params_per_layer
    )
    assert extra == 3 * 2048 * 5632
    assert not with_shared.qk_norm


def test_moe_configs_we_cannot_model_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]})
    with pytest.raises(ValueError, match=r"config\.json: dense layers between MoE layers"):
        model_spec_from_hf_config(path)
    path = _write(tmp_path, {**QWEN3_30B_A3B, "num_experts_per_tok": 200})
    with pytest.raises(ValueError, match=r"config\.json: .*num_experts_per_token.*200"):
        model_spec_from_hf_config(path)
    with pytest.raises(ValueError, match=r"moe_intermediate_size=4 needs num_experts > 0"):
        replace(MODEL_PRESETS["Llama-3-8B"], moe_intermediate_size=4)


# Qwen3-30B-A3B by hand, per layer: attention 2048 x (2 x 4096 + 2 x 512) = 18,874,368; router
# 2048 x 128 = 262,144; one expert 3 x 2048 x 768 = 4,718,592; 8 routed = 37,748,736.
ATTENTION, ROUTER, EXPERT = 18_874_368, 262_144, 4_718_592


def test_moe_flops_per_token_by_hand() -> None:
    model = MODEL_PRESETS["Qwen3-30B-A3B"]
    h100 = HARDWARE_PRESETS["H100-SXM"]
    cost = RooflineCostModel(model, h100, block_size=16)
    flops_per_token = 2 * 48 * (ATTENTION + ROUTER + 8 * EXPERT)
    assert flops_per_token == 5_460_983_808
    # 8192 tokens are compute-bound: the routed experts run at the GEMM efficiency on the
    # active parameters' FLOPs (8 of 128 experts a token), beside the attention and router
    # GEMMs; no shared experts in this model.
    ops = cost.layer_ops
    assert ops.op_s("mlp_up_proj", 8192) == ops.op_s("mlp_down_proj", 8192) == 0.0
    tokens = 8192
    experts = 2 * h100.gemm_latency_s + tokens * 2 * 8 * EXPERT / (989.4e12 * 0.75)
    assert ops.experts_s(tokens) == pytest.approx(experts)
    dense = sum(ops.op_s(op, tokens) for op in ("attn_pre_proj", "attn_post_proj", "mlp_router"))
    assert cost.linear_s(tokens) == pytest.approx(48 * (dense + experts))
    # The whole layer's linear FLOPs are the active parameters' (within the GEMMs' tiling).
    per_layer_active = 2 * (ATTENTION + ROUTER + 8 * EXPERT)
    assert 48 * tokens * per_layer_active / (989.4e12 * 0.75) < cost.linear_s(tokens)


def test_moe_expert_weight_reads_by_hand() -> None:
    model = MODEL_PRESETS["Qwen3-30B-A3B"]
    h100 = HARDWARE_PRESETS["H100-SXM"]
    cost = RooflineCostModel(model, h100, block_size=16)
    expert_all_layers_bytes = 48 * EXPERT * 2
    # One token reads its 8 experts; two read 128 (1 - (15/16)^2) = 15.5 on average; thousands
    # read all 128.
    assert cost.expert_weight_bytes(1) == pytest.approx(8 * expert_all_layers_bytes)
    assert cost.expert_weight_bytes(2) == pytest.approx(15.5 * expert_all_layers_bytes)
    assert cost.expert_weight_bytes(4096) == pytest.approx(128 * expert_all_layers_bytes)
    # A decode step of one token is memory-bound on the experts: its 8 experts' weights and
    # the activations, far below reading all 128.
    act = 2 * (2 * 2048 + 3 * 768) * 8
    assert cost.layer_ops.experts_s(1) == pytest.approx(
        2 * h100.gemm_latency_s + (8 * EXPERT * 2 + act) / (3350e9 * 0.8)
    )
    assert cost.linear_s(1) < cost.linear_s(4096) / 4
    # Two ranks (TP-sharded experts, or EP with 64 whole experts each) read half per rank.
    cost_tp2 = RooflineCostModel(model, HARDWARE_PRESETS["H100-SXM"], tp=2, block_size=16)
    assert cost_tp2.expert_weight_bytes(2) == pytest.approx(15.5 * expert_all_layers_bytes / 2)


def test_dense_model_has_no_expert_terms() -> None:
    llama: ModelSpec = MODEL_PRESETS["Llama-3.1-8B"]
    cost = RooflineCostModel(llama, HARDWARE_PRESETS["H100-SXM"], block_size=16)
    assert cost.expert_weight_bytes(100) == 0.0
    assert llama.active_params_per_layer == llama.params_per_layer
