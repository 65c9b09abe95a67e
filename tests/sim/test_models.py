"""The roofline on a mixture of experts (Qwen3-30B-A3B): FLOP and byte counts against hand
computations. Reading the models' config.json files is tested in tests/core/model/."""

from __future__ import annotations

import pytest

from core.model.presets import get_model_preset
from core.model.spec import ModelSpec
from sim.costmodel.roofline import RooflineCostModel
from sim.specs.hardware import HARDWARE_PRESETS

# Qwen3-30B-A3B by hand, per layer: attention 2048 x (2 x 4096 + 2 x 512) = 18,874,368; router
# 2048 x 128 = 262,144; one expert 3 x 2048 x 768 = 4,718,592; 8 routed = 37,748,736.
ATTENTION, ROUTER, EXPERT = 18_874_368, 262_144, 4_718_592


def test_moe_flops_per_token_by_hand() -> None:
    model = get_model_preset("Qwen3-30B-A3B")
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
    model = get_model_preset("Qwen3-30B-A3B")
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
    llama: ModelSpec = get_model_preset("Llama-3.1-8B")
    cost = RooflineCostModel(llama, HARDWARE_PRESETS["H100-SXM"], block_size=16)
    assert cost.expert_weight_bytes(100) == 0.0
    assert llama.active_params_per_layer == llama.params_per_layer
