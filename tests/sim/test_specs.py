"""Model and hardware specs: presets, validation, the HF config reader, KV capacity."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sim.specs.hardware import HARDWARE_PRESETS, get_hardware_preset
from sim.specs.hf_config import model_spec_from_hf_config
from sim.specs.kv_capacity import ModelDoesNotFitError, derive_num_blocks
from sim.specs.model import MODEL_PRESETS, ModelSpec, get_model_preset

GIB = 1 << 30
# vLLM's defaults, the setting these figures are for.
BUDGETS = {"max_num_batched_tokens": 8192, "max_num_seqs": 256}

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


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_model_preset_parameter_count(name: str) -> None:
    assert MODEL_PRESETS[name].num_params / 1e9 == pytest.approx(PARAMS_B[name], rel=0.01)


def test_every_requested_preset_exists() -> None:
    assert set(MODEL_PRESETS) == set(PARAMS_B)
    assert {"A100-40GB", "A100-80GB", "H100-SXM", "H200", "CPU-1T"} <= set(HARDWARE_PRESETS)


def test_lookup_is_case_insensitive_and_lists_names_on_error() -> None:
    assert get_model_preset("llama-2-7b").name == "Llama-2-7B"
    assert get_hardware_preset("h100-sxm").name == "H100-SXM"
    with pytest.raises(ValueError, match=r"unknown model 'gpt-9'.*Llama-2-7B"):
        get_model_preset("gpt-9")
    with pytest.raises(ValueError, match=r"unknown hardware 'TPU'.*A100-80GB"):
        get_hardware_preset("TPU")


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_layers", 0), ("hidden_size", -1), ("dtype_bytes", 3), ("num_kv_heads", 5)],
)
def test_model_spec_validation_names_field_and_value(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"{field}.*{value}"):
        changes: dict[str, Any] = {field: value}
        replace(MODEL_PRESETS["Llama-2-7B"], **changes)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hbm_bandwidth_bytes_per_s", 0.0),
        ("peak_fp16_flops", -1.0),
        ("interconnect_latency_s", -1e-6),
        ("num_sms", 0),
        ("gemm_flops_efficiency", 1.5),
        ("elementwise_bandwidth_efficiency", 0.0),
        ("kernel_launch_floor_s", -1e-6),
        ("allreduce_call_latency_s", -1e-6),
        ("nvlink_domain_size", 0),
    ],
)
def test_hardware_spec_validation_names_field_and_value(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"HardwareSpec\.{field}.*{value}"):
        changes: dict[str, Any] = {field: value}
        replace(HARDWARE_PRESETS["A100-80GB"], **changes)


def test_peak_flops_by_dtype() -> None:
    a100, h100 = HARDWARE_PRESETS["A100-80GB"], HARDWARE_PRESETS["H100-SXM"]
    assert a100.peak_flops(2) == 312e12
    assert h100.peak_flops(1) == pytest.approx(2 * h100.peak_flops(2), rel=1e-3)
    with pytest.raises(ValueError, match=r"A100-80GB.*dtype_bytes=1"):
        a100.peak_flops(1)


def test_kv_bytes_per_token_and_block() -> None:
    llama = MODEL_PRESETS["Llama-2-7B"]
    assert llama.kv_bytes_per_token() == 32 * 2 * 32 * 128 * 2  # 512 KiB
    assert llama.kv_bytes_per_block(16) == 8 * 2**20
    assert llama.kv_bytes_per_token(tp=2) == llama.kv_bytes_per_token() // 2
    # Llama-3-70B has 8 KV heads: past tp=8 each rank keeps a replica of one head.
    llama3 = MODEL_PRESETS["Llama-3-70B"]
    assert llama3.kv_bytes_per_token(tp=16) == llama3.kv_bytes_per_token(tp=8)


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="tp=3"):
        MODEL_PRESETS["Llama-2-7B"].kv_bytes_per_token(tp=3)


def test_derive_num_blocks_llama2_7b_a100_80gb() -> None:
    # (0.9 * 80 GiB - 12.55 GiB weights - ~1.5 GiB reserve) / 8 MiB per block ~= 7.4k
    num_blocks = derive_num_blocks(
        MODEL_PRESETS["Llama-2-7B"], HARDWARE_PRESETS["A100-80GB"], 1, 16, 0.9, **BUDGETS
    )
    assert 7000 <= num_blocks <= 7700


def test_derive_num_blocks_exact_with_explicit_reserve() -> None:
    llama = MODEL_PRESETS["Llama-2-7B"]
    num_blocks = derive_num_blocks(
        llama, HARDWARE_PRESETS["A100-80GB"], 1, 16, 0.9, activation_reserve_bytes=0, **BUDGETS
    )
    assert num_blocks == (int(80 * GIB * 0.9) - llama.weight_bytes) // (8 * 2**20)


def test_llama2_70b_does_not_fit_one_a100() -> None:
    with pytest.raises(ModelDoesNotFitError, match=r"Llama-2-70B at tp=1.*A100-80GB.*raise tp"):
        derive_num_blocks(
            MODEL_PRESETS["Llama-2-70B"], HARDWARE_PRESETS["A100-80GB"], 1, 16, 0.9, **BUDGETS
        )
    assert derive_num_blocks(
        MODEL_PRESETS["Llama-2-70B"], HARDWARE_PRESETS["A100-80GB"], 4, 16, 0.9, **BUDGETS
    )


def test_opt_13b_on_a100_40gb_has_a_few_gib_of_kv() -> None:
    # The vLLM paper's setting: ~26 GB of weights leave roughly 10 GB for the KV cache.
    opt = MODEL_PRESETS["OPT-13B"]
    num_blocks = derive_num_blocks(opt, HARDWARE_PRESETS["A100-40GB"], 1, 16, 0.9, **BUDGETS)
    kv_gib = num_blocks * opt.kv_bytes_per_block(16) / GIB
    assert 5 <= kv_gib <= 14


def test_derive_num_blocks_rejects_bad_utilization() -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_utilization.*1\.5"):
        derive_num_blocks(
            MODEL_PRESETS["Llama-2-7B"], HARDWARE_PRESETS["A100-80GB"], 1, 16, 1.5, **BUDGETS
        )


LLAMA_CONFIG = {
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

OPT_CONFIG = {
    "model_type": "opt",
    "hidden_size": 5120,
    "ffn_dim": 20480,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "torch_dtype": "float16",
}


def _write(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_hf_config_llama_matches_preset(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, LLAMA_CONFIG), name="Llama-2-7B")
    assert spec == MODEL_PRESETS["Llama-2-7B"]


def test_hf_config_opt_matches_preset(tmp_path: Path) -> None:
    _write(tmp_path, OPT_CONFIG)
    assert model_spec_from_hf_config(tmp_path, name="OPT-13B") == MODEL_PRESETS["OPT-13B"]


def test_hf_config_gqa_and_dtype(tmp_path: Path) -> None:
    config = {**LLAMA_CONFIG, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}
    spec = model_spec_from_hf_config(_write(tmp_path, config))
    assert spec.num_kv_heads == 8
    assert spec.dtype_bytes == 2
    assert isinstance(spec, ModelSpec)


def test_hf_config_missing_key_names_file_and_key(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "intermediate_size"}
    path = _write(tmp_path, config)
    with pytest.raises(ValueError, match=rf"{path}.*'intermediate_size'"):
        model_spec_from_hf_config(path)


def test_hf_config_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.json"):
        model_spec_from_hf_config(tmp_path / "nope.json")
