"""Accelerator numbers the cost model needs (`HardwareSpec`), named presets, and the KV-cache
capacity a real engine would derive for a model on that accelerator (`derive_num_blocks`)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.model_spec import ModelSpec, check_tp

_GIB = 1 << 30
_GB = 10**9

INTERCONNECTS: tuple[str, ...] = ("nvswitch", "nvlink-bridge", "mesh", "pcie")
"""How the GPUs of one replica reach each other: through an NVLink switch (any tp at full
link rate); an NVLink bridge between pairs (tp 2 on the bridge, larger tp over PCIe); a
direct all-to-all mesh (AMD Infinity Fabric; the bandwidth given is the per-GPU aggregate
that collectives reach over all links); or PCIe only (the interconnect fields then describe
the GPU-to-GPU PCIe path)."""


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
    interconnect: str = "nvswitch"  # one of INTERCONNECTS

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(
                f"HardwareSpec.interconnect must be one of {INTERCONNECTS}, "
                f"got {self.interconnect!r}"
            )
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

    def allreduce_link(self, tp: int) -> tuple[float, float]:
        """(bandwidth bytes/s one direction, latency s per hop) a ring over `tp` ranks uses:
        an NVLink bridge joins pairs only, so larger groups go over the host's PCIe."""
        if self.interconnect == "nvlink-bridge" and tp > 2:
            return self.host_link_bandwidth_bytes_per_s, self.interconnect_latency_s
        return self.interconnect_bandwidth_bytes_per_s, self.interconnect_latency_s

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
    ]
    presets += _workstation_presets() + _datacenter_presets()
    return {spec.name: spec for spec in presets}


# PCIe without NVLink: gen4/gen5 x16 carry 32/64 GB/s one way (the PCI-SIG rates). The 8 us
# a hop through the root complex is an assumption (a few times the NVLink hop), not a measured
# or datasheet figure; a hardware file can set its own.
_PCIE_HOP_S = 8e-6
_PCIE4 = 32 * _GB
_PCIE5 = 64 * _GB


def _workstation_presets() -> list[HardwareSpec]:
    """PCIe cards. Dense tensor figures: half the datasheet's sparse number."""
    return [
        # NVIDIA A40 datasheet: 149.7 TFLOPS fp16 tensor (299.4 sparse), 37.4 TFLOPS fp32,
        # 48 GB GDDR6 at 696 GB/s, NVLink bridge 112.5 GB/s both directions, PCIe gen4.
        HardwareSpec(
            "A40",
            149.7e12,
            37.4e12,
            None,
            696 * _GB,
            48 * _GIB,
            56.25 * _GB,
            2e-6,
            _PCIE4,
            interconnect="nvlink-bridge",
        ),
        # NVIDIA RTX A6000 datasheet: 309.7 TFLOPS tensor sparse (154.8 dense), 38.7 TFLOPS
        # fp32, 48 GB GDDR6 at 768 GB/s, NVLink bridge 112.5 GB/s both directions, PCIe gen4.
        HardwareSpec(
            "RTX-A6000",
            154.8e12,
            38.7e12,
            None,
            768 * _GB,
            48 * _GIB,
            56.25 * _GB,
            2e-6,
            _PCIE4,
            interconnect="nvlink-bridge",
        ),
        # NVIDIA L40S datasheet: 362.05 TFLOPS bf16 tensor dense (733 sparse), 733 fp8 dense,
        # 91.6 TFLOPS fp32, 48 GB GDDR6 at 864 GB/s, PCIe gen4 x16, no NVLink.
        HardwareSpec(
            "L40S",
            362.05e12,
            91.6e12,
            733e12,
            864 * _GB,
            48 * _GIB,
            _PCIE4,
            _PCIE_HOP_S,
            _PCIE4,
            interconnect="pcie",
        ),
        # NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): fp16 tensor with fp32
        # accumulate (what PyTorch uses) 165.2 TFLOPS dense, fp8 with fp32 accumulate 330.3,
        # 82.6 TFLOPS fp32, 24 GB GDDR6X at 1008 GB/s, PCIe gen4, no NVLink.
        HardwareSpec(
            "RTX-4090",
            165.2e12,
            82.6e12,
            330.3e12,
            1008 * _GB,
            24 * _GIB,
            _PCIE4,
            _PCIE_HOP_S,
            _PCIE4,
            interconnect="pcie",
        ),
        # NVIDIA RTX PRO 6000 Blackwell (Workstation Edition): 96 GB GDDR7 at 1792 GB/s,
        # 125 TFLOPS fp32, 4000 AI TOPS fp4 sparse (datasheet); per NVIDIA's RTX Blackwell
        # figures 503.8 TFLOPS bf16 tensor dense with fp32 accumulate (full rate on this
        # card) and 1007.6 fp8; PCIe gen5 x16, no NVLink.
        HardwareSpec(
            "RTX-PRO-6000",
            503.8e12,
            125e12,
            1007.6e12,
            1792 * _GB,
            96 * _GIB,
            _PCIE5,
            _PCIE_HOP_S,
            _PCIE5,
            interconnect="pcie",
        ),
        # The Server Edition of the same card: 1597 GB/s, the figure LLMServingSim's cluster
        # config gives for its measured RTX PRO 6000 runs; FLOP/s taken as the Workstation
        # Edition's (not separately checked).
        HardwareSpec(
            "RTX-PRO-6000-Server",
            503.8e12,
            125e12,
            1007.6e12,
            1597 * _GB,
            96 * _GIB,
            _PCIE5,
            _PCIE_HOP_S,
            _PCIE5,
            interconnect="pcie",
        ),
    ]


def _datacenter_presets() -> list[HardwareSpec]:
    """SXM/OAM parts on a switch or mesh. Dense tensor figures: half the sparse number."""
    return [
        # NVIDIA H20 published specifications: 148 TFLOPS bf16 dense, 296 fp8, 44 TFLOPS fp32,
        # 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s both directions, PCIe gen5.
        HardwareSpec("H20", 148e12, 44e12, 296e12, 4000 * _GB, 96 * _GIB, 450 * _GB, 2e-6, _PCIE5),
        # NVIDIA HGX B200 specifications, per GPU: fp16/bf16 4.5 PFLOPS and fp8 9 PFLOPS
        # sparse (2.25 and 4.5 dense), fp32 75 TFLOPS, 180 GB HBM3e at 7.7 TB/s, NVLink 5
        # 1.8 TB/s both directions, PCIe gen5 128 GB/s both directions.
        HardwareSpec(
            "B200", 2250e12, 75e12, 4500e12, 7700 * _GB, 180 * _GIB, 900 * _GB, 2e-6, _PCIE5
        ),
        # AMD Instinct MI300X data sheet: 1307.4 TFLOPS fp16/bf16 dense, 2614.9 fp8 dense,
        # 163.4 TFLOPS fp32 vector, 192 GB HBM3 at 5.3 TB/s; 7 Infinity Fabric links of
        # 128 GB/s both directions to the other 7 GPUs (7 x 64 GB/s one way), PCIe gen5.
        HardwareSpec(
            "MI300X",
            1307.4e12,
            163.4e12,
            2614.9e12,
            5300 * _GB,
            192 * _GIB,
            448 * _GB,
            2e-6,
            _PCIE5,
            interconnect="mesh",
        ),
    ]


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
