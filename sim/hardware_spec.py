"""Accelerator numbers the cost model needs (`HardwareSpec`), named presets, and the KV-cache
capacity a real engine would derive for a model on that accelerator (`derive_num_blocks`)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.model_spec import ModelSpec, check_tp

_GIB = 1 << 30


class ModelDoesNotFitError(ValueError):
    """The weights and activation reserve leave no room for even one KV block."""


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator. Peak FLOP/s are dense (no 2:4 sparsity); bandwidths are per direction."""

    name: str
    peak_fp16_flops: float  # fp16 and bf16 tensor cores
    peak_fp32_flops: float  # plain fp32, since PyTorch leaves TF32 matmuls off by default
    peak_fp8_flops: float | None  # None where there are no fp8 tensor cores
    hbm_bandwidth_bytes_per_s: float
    hbm_capacity_bytes: int
    interconnect_bandwidth_bytes_per_s: float  # NVLink, one direction, one GPU
    interconnect_latency_s: float  # one hop of a ring all-reduce
    host_link_bandwidth_bytes_per_s: float  # PCIe, one direction: what swapping uses

    def __post_init__(self) -> None:
        for field in (
            "peak_fp16_flops",
            "peak_fp32_flops",
            "hbm_bandwidth_bytes_per_s",
            "hbm_capacity_bytes",
            "interconnect_bandwidth_bytes_per_s",
            "host_link_bandwidth_bytes_per_s",
        ):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"HardwareSpec.{field} must be positive, got {value!r}")
        if self.peak_fp8_flops is not None and not self.peak_fp8_flops > 0:
            raise ValueError(
                f"HardwareSpec.peak_fp8_flops must be positive or None, got {self.peak_fp8_flops!r}"
            )
        if not self.interconnect_latency_s >= 0:
            raise ValueError(
                "HardwareSpec.interconnect_latency_s must be >= 0, "
                f"got {self.interconnect_latency_s!r}"
            )

    def peak_flops(self, dtype_bytes: int) -> float:
        """Dense peak for a model stored in `dtype_bytes`-wide values."""
        peaks = {1: self.peak_fp8_flops, 2: self.peak_fp16_flops, 4: self.peak_fp32_flops}
        peak = peaks.get(dtype_bytes)
        if peak is None:
            raise ValueError(f"{self.name} has no peak FLOP/s for dtype_bytes={dtype_bytes!r}")
        return peak


def _hardware_presets() -> dict[str, HardwareSpec]:
    # NVIDIA datasheets (A100: "NVIDIA A100 Tensor Core GPU" datasheet; H100 and H200: the
    # "H100 Tensor Core GPU" and "H200 Tensor Core GPU" product pages), SXM variants. Sparse
    # figures halved to dense. NVLink 600/900 GB/s and PCIe 64/128 GB/s are quoted for both
    # directions together; we store one direction. HBM "GB" there are binary: nvidia-smi shows
    # 81920 MiB on an A100-80GB and 81559 MiB on an H100-SXM. The 2 us NVLink hop latency is a
    # typical small-message NCCL figure, not a datasheet number.
    nvlink_hop_s = 2e-6
    presets = [
        HardwareSpec(
            "A100-40GB", 312e12, 19.5e12, None, 1555e9, 40 * _GIB, 300e9, nvlink_hop_s, 32e9
        ),
        HardwareSpec(
            "A100-80GB", 312e12, 19.5e12, None, 2039e9, 80 * _GIB, 300e9, nvlink_hop_s, 32e9
        ),
        HardwareSpec(
            "H100-SXM", 989.4e12, 66.9e12, 1978.9e12, 3350e9, 80 * _GIB, 450e9, nvlink_hop_s, 64e9
        ),
        HardwareSpec(
            "H200", 989.4e12, 66.9e12, 1978.9e12, 4800e9, 141 * _GIB, 450e9, nvlink_hop_s, 64e9
        ),
        # One x86 core for the engine's CPU runs (one torch thread): 16 fp32 FMA lanes x 2 at
        # ~3 GHz, ~10 GB/s of one core's DRAM streaming, memcpy-speed "host link". A rough
        # analytic baseline only; calibrated profiles are what CPU runs should use.
        HardwareSpec("CPU-1T", 96e9, 96e9, None, 10e9, 8 * _GIB, 10e9, 0.0, 10e9),
    ]
    return {spec.name: spec for spec in presets}


HARDWARE_PRESETS: dict[str, HardwareSpec] = _hardware_presets()


def get_hardware_preset(name: str) -> HardwareSpec:
    """Look up a preset by name, ignoring case; the error lists the valid names."""
    for key, spec in HARDWARE_PRESETS.items():
        if key.lower() == name.lower():
            return spec
    raise ValueError(
        f"unknown hardware {name!r}; presets are: {', '.join(sorted(HARDWARE_PRESETS))}"
    )


def default_activation_reserve_bytes(model: ModelSpec, tp: int = 1) -> int:
    """Memory a real engine's profiling run would see besides weights and KV.

    vLLM measures the peak of a dummy forward over `max_num_batched_tokens` tokens; we estimate
    the same peak: hidden states, residual, QKV and MLP intermediates for min(max_model_len,
    8192) tokens, fp32 logits for 256 sampled rows, plus 1 GiB for the CUDA context, cuBLAS
    workspace and NCCL buffers that the engine also cannot hand to the KV cache.
    """
    check_tp(model, tp)
    num_tokens = min(model.max_model_len, 8192)
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    mlp = (3 if model.gated_mlp else 2) * model.intermediate_size // tp
    per_token = (4 * model.hidden_size + qkv + mlp) * model.dtype_bytes
    logits = 256 * model.vocab_size * 4 // tp
    return num_tokens * per_token + logits + _GIB


def derive_num_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
) -> int:
    """KV blocks per rank: (capacity x utilization - weights per shard - reserve) / block bytes.

    This is vLLM's ``num_gpu_blocks``, the null block included: a paged cache of this many
    blocks gives requests one fewer (``CacheConfig.num_usable_blocks``). Raises
    ModelDoesNotFitError (a ValueError) when not even one block besides the null block fits.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
        )
    if activation_reserve_bytes is None:
        activation_reserve_bytes = default_activation_reserve_bytes(model, tp)
    if activation_reserve_bytes < 0:
        raise ValueError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes!r}")
    budget = int(hardware.hbm_capacity_bytes * gpu_memory_utilization)
    weights = model.weight_bytes_per_shard(tp)
    block_bytes = model.kv_bytes_per_block(block_size, tp)
    free = budget - weights - activation_reserve_bytes
    if free < 2 * block_bytes:  # the null block and one a request can use
        raise ModelDoesNotFitError(
            f"{model.name} at tp={tp} does not fit on {hardware.name}: "
            f"{weights / _GIB:.1f} GiB of weights per GPU + {activation_reserve_bytes / _GIB:.1f} "
            f"GiB activation reserve leave {free / _GIB:.1f} GiB of the {budget / _GIB:.1f} GiB "
            f"budget (gpu_memory_utilization={gpu_memory_utilization}), less than one "
            f"{block_bytes / 2**20:.1f} MiB KV block; raise tp or use a larger GPU"
        )
    return free // block_bytes
