"""vLLM's KV capacity rule term by term, against figures vLLM logged, and Vidur's rule against
the 3,328 blocks Vidur reports for Llama-2-70B at TP2 on an A100-80GB."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.model.presets import get_model_preset
from sim.specs.hardware import HARDWARE_PRESETS
from sim.specs.kv_capacity import (
    GIB,
    ModelDoesNotFitError,
    derive_num_blocks,
    forward_peak_bytes,
    vidur_num_blocks,
    vllm_kv_capacity,
)

A100 = HARDWARE_PRESETS["A100-80GB"]
LLAMA2_70B = get_model_preset("Llama-2-70B")


def test_vidur_rule_gives_its_3328_blocks() -> None:
    # 13 whole 4,096-token requests: (72 GiB - 63.75 GiB of layer weights) / 640 MiB each.
    assert vidur_num_blocks(LLAMA2_70B, A100, 2, 16) == 3328


def test_vllm_rule_matches_a_logged_h100_run() -> None:
    # vLLM on an H100 (79.18 GiB as CUDA reports it), Llama-3.1-8B, TP1, utilization 0.9,
    # 1,024 sequences and 8,192 tokens: "Available KV cache memory: 51.38 GiB", with 14.99 GiB
    # of weights (llm-d-benchmark's config_explorer/empirical-vllm-memory-results.md). The
    # sampler term was fitted to runs including this one; weights and the sum are not.
    h100 = replace(HARDWARE_PRESETS["H100-SXM"], hbm_capacity_bytes=int(79.18 * GIB))
    capacity = vllm_kv_capacity(get_model_preset("Llama-3-8B"), h100, 1, 16, 0.9, 8192, 1024)
    assert capacity.weight_bytes / GIB == pytest.approx(14.99, abs=0.05)
    assert capacity.kv_bytes / GIB == pytest.approx(51.38, rel=0.005)


def test_terms_add_up_and_the_null_block_is_counted() -> None:
    capacity = vllm_kv_capacity(LLAMA2_70B, A100, 2, 16, 0.9, 8192, 256)
    assert capacity.budget_bytes == int(80 * GIB * 0.9)
    assert capacity.weight_bytes == LLAMA2_70B.weight_bytes_per_shard(2)
    # The MLP holds the widest tensors: residual, input, gate-up and the product.
    assert capacity.forward_peak_bytes == 8192 * (2 * 8192 + 3 * 28672 // 2) * 2
    assert capacity.activation_peak_bytes == capacity.forward_peak_bytes
    assert capacity.non_torch_bytes == int(0.13 * GIB) + int(0.42 * GIB)
    assert capacity.num_gpu_blocks == capacity.kv_bytes // capacity.block_bytes
    assert capacity.num_usable_blocks == capacity.num_gpu_blocks - 1
    budgets = {"max_num_batched_tokens": 8192, "max_num_seqs": 256}
    assert derive_num_blocks(LLAMA2_70B, A100, 2, 16, 0.9, **budgets) == capacity.num_gpu_blocks


def test_the_larger_of_forward_and_sampler_counts() -> None:
    llama3 = get_model_preset("Llama-3-8B")
    few = vllm_kv_capacity(llama3, A100, 1, 16, 0.9, 8192, max_num_seqs=64)
    many = vllm_kv_capacity(llama3, A100, 1, 16, 0.9, 8192, max_num_seqs=1024)
    assert few.activation_peak_bytes == forward_peak_bytes(llama3, 1, 8192)
    assert many.activation_peak_bytes == many.sampler_peak_bytes > few.activation_peak_bytes
    assert many.num_gpu_blocks < few.num_gpu_blocks


def test_bad_inputs_and_models_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_utilization.*1\.5"):
        vllm_kv_capacity(LLAMA2_70B, A100, 2, 16, 1.5, 8192, 256)
    with pytest.raises(ValueError, match="max_num_seqs must be positive"):
        vllm_kv_capacity(LLAMA2_70B, A100, 2, 16, 0.9, 8192, max_num_seqs=0)
    with pytest.raises(ModelDoesNotFitError, match=r"Llama-2-70B at tp=1 .*peak activation"):
        vllm_kv_capacity(LLAMA2_70B, A100, 1, 16, 0.9, 8192, 256)
