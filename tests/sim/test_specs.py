"""Hardware specs (presets, validation, peak FLOP/s) and the KV capacity a model leaves; the
model description's own tests are in tests/core/model/."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from core.model.presets import get_model_preset
from sim.specs.hardware import HARDWARE_PRESETS, get_hardware_preset
from sim.specs.kv_capacity import ModelDoesNotFitError, derive_num_blocks

GIB = 1 << 30
# vLLM's defaults, the setting these figures are for.
BUDGETS = {"max_num_batched_tokens": 8192, "max_num_seqs": 256}


def test_hardware_lookup_is_case_insensitive_and_lists_names_on_error() -> None:
    assert get_hardware_preset("h100-sxm").name == "H100-SXM"
    assert {"A100-40GB", "A100-80GB", "H100-SXM", "H200", "CPU-1T"} <= set(HARDWARE_PRESETS)
    with pytest.raises(ValueError, match=r"unknown hardware 'TPU'.*A100-80GB"):
        get_hardware_preset("TPU")


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


def test_derive_num_blocks_llama2_7b_a100_80gb() -> None:
    # (0.9 * 80 GiB - 12.55 GiB weights - ~1.5 GiB reserve) / 8 MiB per block ~= 7.4k
    num_blocks = derive_num_blocks(
        get_model_preset("Llama-2-7B"), HARDWARE_PRESETS["A100-80GB"], 1, 16, 0.9, **BUDGETS
    )
    assert 7000 <= num_blocks <= 7700


def test_derive_num_blocks_exact_with_explicit_reserve() -> None:
    llama = get_model_preset("Llama-2-7B")
    num_blocks = derive_num_blocks(
        llama, HARDWARE_PRESETS["A100-80GB"], 1, 16, 0.9, activation_reserve_bytes=0, **BUDGETS
    )
    assert num_blocks == (int(80 * GIB * 0.9) - llama.weight_bytes) // (8 * 2**20)


def test_llama2_70b_does_not_fit_one_a100() -> None:
    with pytest.raises(ModelDoesNotFitError, match=r"Llama-2-70B at tp=1.*A100-80GB.*raise tp"):
        derive_num_blocks(
            get_model_preset("Llama-2-70B"), HARDWARE_PRESETS["A100-80GB"], 1, 16, 0.9, **BUDGETS
        )
    assert derive_num_blocks(
        get_model_preset("Llama-2-70B"), HARDWARE_PRESETS["A100-80GB"], 4, 16, 0.9, **BUDGETS
    )


def test_opt_13b_on_a100_40gb_has_a_few_gib_of_kv() -> None:
    # The vLLM paper's setting: ~26 GB of weights leave roughly 10 GB for the KV cache.
    opt = get_model_preset("OPT-13B")
    num_blocks = derive_num_blocks(opt, HARDWARE_PRESETS["A100-40GB"], 1, 16, 0.9, **BUDGETS)
    kv_gib = num_blocks * opt.kv_bytes_per_block(16) / GIB
    assert 5 <= kv_gib <= 14


def test_derive_num_blocks_rejects_bad_utilization() -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_utilization.*1\.5"):
        derive_num_blocks(
            get_model_preset("Llama-2-7B"), HARDWARE_PRESETS["A100-80GB"], 1, 16, 1.5, **BUDGETS
        )
