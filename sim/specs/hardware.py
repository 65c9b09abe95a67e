"""Accelerator numbers the cost model needs (`HardwareSpec`), named presets, and the KV-cache
capacity a real engine would derive for a model on that accelerator (`derive_num_blocks`,
which follows vLLM's rule in `sim.specs.kv_capacity`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

_GIB = 1 << 30
_GB = 10**9


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
    # How kernels reach those peaks. The defaults are A100 values: the SM count and tile shape
    # from NVIDIA's A100 whitepaper and cuBLAS; every efficiency, latency and floor is a fit to
    # Vidur's measured A100-80GB files (../shared/profiles/vidur: mlp.csv of four models at TP
    # 1-8, attention.csv, both all_reduce.csv), checked with `python -m sim costmodel check`.
    # A GPU with op-level tables of its own states the efficiencies derived from them
    # (`sim.costmodel.efficiency_fit`, `benchmarks/derive_efficiencies.py`; docs/
    # hardware_efficiency.md); every other GPU keeps these defaults.
    num_sms: int = 108  # streaming multiprocessors: the width of one wave of GEMM tiles
    # cuBLAS fp16 output tile: 64 token rows x 128 columns. Vidur's A100 GEMM times step with
    # every 64-128 more tokens; 64 rows fit them best (median error 4-8% per linear op).
    gemm_tile_tokens: int = 64
    gemm_tile_cols: int = 128
    gemm_flops_efficiency: float = 0.75  # share of per-SM peak a full wave of tiles reaches
    gemm_latency_s: float = 5e-6  # fixed cost of one GEMM: launch, pipeline fill, split-K reduce
    # Between memory- and compute-bound (a few dozen to a few hundred tokens) a GEMM hides only
    # part of the shorter of its weight reads and its FLOPs under the longer: the share it
    # hides. None: all of it (the plain roofline's max; Vidur's tables were fitted so).
    gemm_overlap_efficiency: float | None = None
    memory_bandwidth_efficiency: float = 0.8  # weight reads, vectorised elementwise (add), copies
    elementwise_bandwidth_efficiency: float = 0.5  # one-block-per-token norm, activation
    # Rotary (neox style: element i of a head with i + head_dim/2, unvectorised loads) streams
    # slower than the other row kernels. Fit to the attn_rope rows of the four A100 mlp.csv
    # (median error 9.8%; 0.5 gave 19%): the rows from 1K tokens up alone would give 0.44.
    rotary_bandwidth_efficiency: float = 0.4
    # The residual add (PyTorch's vectorised add: two reads, one write) streams closer to peak
    # than weight reads: fit to the add rows of the Llama-2 A100 mlp.csv from 4K tokens up,
    # where its three tensors (>= 100 MB) cannot sit in the 40 MB L2.
    streaming_bandwidth_efficiency: float = 0.87
    # The embedding gathers one table row per token at a scattered address, then masks it (6
    # row-sized HBM passes per token in all): it streams below the row kernels. Fit to the emb
    # rows of the Llama-2 A100 mlp.csv from 256 tokens up (0.14-0.16 TB/s of output rows).
    embedding_bandwidth_efficiency: float = 0.43
    # PyTorch's embedding is index_select; with at most 16 indices its CUDA path takes the
    # small-index kernel, whose threads walk the indices one after another (ATen
    # native/cuda/Indexing.cu). Each index costs a dependent fetch: fit to the emb rows with
    # 1-16 tokens of the Llama-2 A100 mlp.csv (3 us at 1 token, 14 us at 16, at every TP).
    # 0 turns the small-index path off (every lookup is a row gather).
    small_index_max_rows: int = 16
    small_index_row_s: float = 7.5e-7
    attention_flops_efficiency: float = 0.37  # FlashAttention prefill, per (query, key) pair
    attention_bandwidth_efficiency: float = 0.75  # paged decode attention reading K and V
    # Decodes in a step that also prefills, where vLLM runs them in one kernel with the prompt
    # chunk: the share of bandwidth their K and V reads reach there. None: as in a decode-only
    # step (Vidur's tables time prefill and decode apart, so no default is measured).
    mixed_attention_bandwidth_efficiency: float | None = None
    attention_latency_s: float = 15e-6  # fixed cost of one attention call (split-KV reduce, setup)
    kernel_launch_floor_s: float = 2e-6  # the shortest a kernel runs, however little it does
    # servesim's split-KV decode kernel (``core.decode_split``): what one program spends on one
    # 64-token tile of K and V (head_dim 128), walking its split in series. A step's decode
    # attention lasts at least its longest walk. Fit to the H200's decode-only steps of the
    # engine with CUDA graphs (benchmarks/results/gpu-h200-2026-11-27/call2, 2.13 and 2.16 us
    # in its two runs; benchmarks/decode_walk.py); no other GPU measured it. Priced for
    # servesim's engines only (vLLM runs other kernels); 0 turns it off.
    decode_tile_s: float = 2.1e-6
    # The same kernel's fixed cost a layer (its programs' start and the split reduce), in place
    # of `attention_latency_s` (vLLM's kernels on Vidur's A100) wherever the decode walk is
    # priced. Fit to the decode tables of servesim's calibrations on an H200 at short contexts,
    # where it governs (`efficiency_fit.fit_decode_latency`, benchmarks/derive_efficiencies.py
    # --gpu H200: 4.65 us pooled, 4.6-4.8 us in each of four tables); no other GPU measured it.
    decode_latency_s: float = 4.7e-6
    # servesim's fused row kernels (add+RMSNorm, rotary, SiLU-and-mul: one Triton program a
    # row, held whole): each kernel's fixed cost, and the share of HBM bandwidth their bytes
    # stream at. Fit to the elementwise tables of ten calibrations on an H200
    # (`efficiency_fit.fit_fused_rows`, benchmarks/derive_efficiencies.py --gpu H200); no other
    # GPU measured them. Priced in place of the unfused row kernels above (vLLM's, after
    # Vidur's tables) wherever the decode walk is, for servesim's engines only.
    fused_row_latency_s: float = 3.3e-6
    fused_row_bandwidth_efficiency: float = 0.91
    # servesim's LM head: what a step's logits and sampling take beyond the logits GEMM and the
    # sampler's bytes (the final norm, the fp32 cast, the argmax, the sampled ids' copy to the
    # host). Fit to the same calibrations' lm_head tables (`efficiency_fit.fit_lm_head_latency`);
    # priced with the fused rows, for servesim's engines only.
    lm_head_latency_s: float = 9.82e-5
    # Row kernels (norm, rotary, activation) run one thread block per token: each thread walks
    # its row `row_block_threads` elements at a time, one dependent HBM round trip per step.
    row_block_threads: int = 1024
    dram_latency_s: float = 6e-7
    # NCCL all-reduce: per call (launch, the ranks' handshake; small messages measure 25-60 us
    # on both A100 node types) and bus bandwidth as a share of the NVLink rate (~180 of 300 GB/s
    # measured for large messages).
    allreduce_call_latency_s: float = 35e-6
    interconnect_bus_efficiency: float = 0.6
    # GPUs that all reach each other over the interconnect: 8 on an NVSwitch board (or an
    # 8-GPU Infinity Fabric mesh), 2 for NVLink-bridged pairs, 1 for PCIe-only cards.
    nvlink_domain_size: int = 8
    # Per-GPU bandwidth, one direction, to a GPU outside the NVLink domain: PCIe inside a node
    # of bridged pairs or PCIe-only cards; between nodes, the network. 10 GB/s fits Vidur's
    # multi-node DGX rows (an HDR NIC per GPU would be 25 GB/s).
    scale_out_bandwidth_bytes_per_s: float = 10e9
    # One ring step over that scale-out link, and the share of its bandwidth a ring reaches.
    # Defaults: the network between DGX nodes, fit to Vidur's multi-node rows (NCCL pipelines
    # small messages there, so a step costs about an NVLink hop). PCIe links set their own (see
    # `_PCIE_HOP_S` and `_PCIE_BUS_EFFICIENCY`).
    scale_out_latency_s: float = 1e-6
    scale_out_bus_efficiency: float = 0.6

    def __post_init__(self) -> None:
        for field in (
            "peak_fp16_flops",
            "peak_fp32_flops",
            "hbm_bandwidth_bytes_per_s",
            "hbm_capacity_bytes",
            "interconnect_bandwidth_bytes_per_s",
            "host_link_bandwidth_bytes_per_s",
            "num_sms",
            "gemm_tile_tokens",
            "gemm_tile_cols",
            "row_block_threads",
            "nvlink_domain_size",
            "scale_out_bandwidth_bytes_per_s",
        ):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"HardwareSpec.{field} must be positive, got {value!r}")
        for field in (
            "gemm_flops_efficiency",
            "memory_bandwidth_efficiency",
            "elementwise_bandwidth_efficiency",
            "rotary_bandwidth_efficiency",
            "streaming_bandwidth_efficiency",
            "embedding_bandwidth_efficiency",
            "attention_flops_efficiency",
            "attention_bandwidth_efficiency",
            "fused_row_bandwidth_efficiency",
            "interconnect_bus_efficiency",
            "scale_out_bus_efficiency",
        ):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise ValueError(f"HardwareSpec.{field} must be in (0, 1], got {value!r}")
        for field in (
            "kernel_launch_floor_s",
            "gemm_latency_s",
            "dram_latency_s",
            "attention_latency_s",
            "decode_tile_s",
            "decode_latency_s",
            "fused_row_latency_s",
            "lm_head_latency_s",
            "allreduce_call_latency_s",
            "scale_out_latency_s",
            "small_index_row_s",
        ):
            value = getattr(self, field)
            if not value >= 0:
                raise ValueError(f"HardwareSpec.{field} must be >= 0, got {value!r}")
        if not self.small_index_max_rows >= 0:
            raise ValueError(
                f"HardwareSpec.small_index_max_rows must be >= 0, got {self.small_index_max_rows!r}"
            )
        overlap = self.gemm_overlap_efficiency
        if overlap is not None and not 0 <= overlap <= 1:
            raise ValueError(
                f"HardwareSpec.gemm_overlap_efficiency must be in [0, 1] or None, got {overlap!r}"
            )
        mixed = self.mixed_attention_bandwidth_efficiency
        if mixed is not None and not 0 < mixed <= 1:
            raise ValueError(
                f"HardwareSpec.mixed_attention_bandwidth_efficiency must be in (0, 1] or None, "
                f"got {mixed!r}"
            )
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
    # 81920 MiB on an A100-80GB and 81559 MiB on an H100-SXM. The 1 us per ring step is a fit
    # to Vidur's A100 all-reduce files (the per-call latency dominates small messages).
    nvlink_hop_s = 1e-6
    presets = [
        HardwareSpec(
            "A100-40GB", 312e12, 19.5e12, None, 1555e9, 40 * _GIB, 300e9, nvlink_hop_s, 32e9
        ),
        HardwareSpec(
            "A100-80GB", 312e12, 19.5e12, None, 2039e9, 80 * _GIB, 300e9, nvlink_hop_s, 32e9
        ),
        # 132 SMs on the SXM H100 and H200 (H100 whitepaper); NDR InfiniBand, 400 Gb/s a GPU.
        HardwareSpec(
            "H100-SXM",
            989.4e12,
            66.9e12,
            1978.9e12,
            3350e9,
            80 * _GIB,
            450e9,
            nvlink_hop_s,
            64e9,
            num_sms=132,
            scale_out_bandwidth_bytes_per_s=50e9,
        ),
        # The GEMM efficiencies derived from our own H200 calibrations' linear tables (four,
        # within 1% of each other: benchmarks/derive_efficiencies.py --gpu H200, results in
        # benchmarks/results/efficiencies.txt); the row kernels and attention keep the
        # defaults (no table of vLLM's kernels on an H200 here).
        HardwareSpec(
            "H200",
            989.4e12,
            66.9e12,
            1978.9e12,
            4800e9,
            141 * _GIB,
            450e9,
            nvlink_hop_s,
            64e9,
            num_sms=132,
            scale_out_bandwidth_bytes_per_s=50e9,
            memory_bandwidth_efficiency=0.91,
            gemm_flops_efficiency=0.88,
            gemm_overlap_efficiency=0.71,
        ),
        # One x86 core for the engine's CPU runs (one torch thread): 16 fp32 FMA lanes x 2 at
        # ~3 GHz, ~10 GB/s of one core's DRAM streaming, memcpy-speed "host link". A rough
        # analytic baseline only; calibrated profiles are what CPU runs should use.
        HardwareSpec(
            "CPU-1T", 96e9, 96e9, None, 10e9, 8 * _GIB, 10e9, 0.0, 10e9, decode_tile_s=0.0
        ),
    ]
    presets += _workstation_presets() + _datacenter_presets()
    return {spec.name: spec for spec in presets}


# PCIe without NVLink: gen4/gen5 x16 carry 32/64 GB/s one way (the PCI-SIG rates). A ring step
# through the root complex (4 us) and the share of the PCIe rate a ring reaches (0.75) are fits
# to Vidur's a100_pairwise_nvlink all_reduce.csv, 4 GPUs (two NVLink pairs joined by PCIe
# gen4): 55-65 us for messages under 128 KB (35 us per call + 6 steps), and 23.6 GB/s of bus
# bandwidth for 16-380 MB. Gen5 cards keep them (no gen5 measurement here).
_PCIE_HOP_S = 4e-6
_PCIE_BUS_EFFICIENCY = 0.75
_PCIE_SCALE_OUT: dict[str, Any] = {
    "scale_out_latency_s": _PCIE_HOP_S,
    "scale_out_bus_efficiency": _PCIE_BUS_EFFICIENCY,
}
# How the GPUs of one node are wired is `nvlink_domain_size` (the GPUs that all reach each
# other over the interconnect) and `scale_out_bandwidth_bytes_per_s` (the link a larger group
# falls back to): an NVSwitch board is one domain of 8; an NVLink bridge joins pairs (2), a
# larger tp crossing PCIe; a PCIe-only card is a domain of 1, every all-reduce on PCIe (its
# interconnect fields then describe the GPU-to-GPU PCIe path); AMD's all-to-all Infinity
# Fabric mesh is a domain of 8 whose bandwidth is the per-GPU aggregate over all links.
_PCIE4 = 32 * _GB
_PCIE5 = 64 * _GB


# Kernel efficiencies derived from a GPU's own op-level tables by `benchmarks/
# derive_efficiencies.py` (`sim.costmodel.efficiency_fit`: each the value at which the roofline
# meets, at the median, the measured ops it alone governs; results and command in
# benchmarks/results/efficiencies.txt). Both from LLMServingSim's public profile bundles (vLLM
# 0.19.0's kernels, one layer at a time; MIT, github.com/casys-kaist/LLMServingSim at 5daddb2).
# RTX PRO 6000 Blackwell Server Edition: profiler/perf/RTXPRO6000, Llama-3.1-8B and Qwen3-32B
# at TP 1 and 2 (also in ../shared/profiles/llmservingsim).
_RTXPRO6000_SERVER_TABLES: dict[str, Any] = {
    "memory_bandwidth_efficiency": 0.98,
    "gemm_flops_efficiency": 0.88,
    "gemm_overlap_efficiency": 0.69,
    "elementwise_bandwidth_efficiency": 1.0,
    "rotary_bandwidth_efficiency": 1.0,
    "attention_bandwidth_efficiency": 0.92,
    "attention_flops_efficiency": 0.58,
    "mixed_attention_bandwidth_efficiency": 0.32,
}
# RTX 4090: profiler/perf/RTX4090, Llama-3.1-8B at TP 1. Its large GEMMs run at the
# datasheet's 165.2 TFLOPS or faster: the fit is clipped at 1.0 (the roofline still 0.8% slow).
_RTX4090_TABLES: dict[str, Any] = {
    "memory_bandwidth_efficiency": 0.95,
    "gemm_flops_efficiency": 1.0,
    "gemm_overlap_efficiency": 1.0,
    "elementwise_bandwidth_efficiency": 1.0,
    "rotary_bandwidth_efficiency": 1.0,
    "attention_bandwidth_efficiency": 0.92,
    "attention_flops_efficiency": 0.89,
    "mixed_attention_bandwidth_efficiency": 0.43,
}


def _ga102_bridged_card(
    name: str, dense_flops: float, fp32_flops: float, memory_bandwidth: float
) -> HardwareSpec:
    """A 48 GB GA102 PCIe card (84 SMs) whose pairs join over a 112.5 GB/s NVLink bridge
    (56.25 GB/s each way) and reach further cards over PCIe gen4."""
    return HardwareSpec(
        name,
        dense_flops,
        fp32_flops,
        None,
        memory_bandwidth,
        48 * _GIB,
        56.25 * _GB,
        2e-6,
        _PCIE4,
        nvlink_domain_size=2,
        scale_out_bandwidth_bytes_per_s=_PCIE4,
        **_PCIE_SCALE_OUT,
        num_sms=84,
    )


def _pcie_card(
    name: str,
    flops: tuple[float, float, float],
    memory_bandwidth: float,
    memory_bytes: int,
    pcie: float,
    num_sms: int,
    efficiencies: dict[str, Any] | None = None,
) -> HardwareSpec:
    """A PCIe card without NVLink (a domain of 1): every all-reduce crosses PCIe at ``pcie``
    bytes/s one way. ``flops`` is (dense 16-bit tensor, fp32, dense fp8) FLOP/s;
    ``efficiencies`` the card's own, where its op tables give them (else the defaults)."""
    dense, fp32, fp8 = flops
    return HardwareSpec(
        name,
        dense,
        fp32,
        fp8,
        memory_bandwidth,
        memory_bytes,
        pcie,
        _PCIE_HOP_S,
        pcie,
        nvlink_domain_size=1,
        scale_out_bandwidth_bytes_per_s=pcie,
        **_PCIE_SCALE_OUT,
        num_sms=num_sms,
        **(efficiencies or {}),
    )


def _workstation_presets() -> list[HardwareSpec]:
    """PCIe cards. Dense tensor figures: half the datasheet's sparse number. SM counts (the
    width of a wave of GEMM tiles) from NVIDIA's architecture whitepapers: GA102 in the A40 and
    RTX A6000 84, AD102 in the L40S 142 and the RTX 4090 128, GB202 in the RTX PRO 6000 188
    (24,064 CUDA cores at 128 a SM)."""
    return [
        # NVIDIA A40 datasheet: 149.7 TFLOPS fp16 tensor (299.4 sparse), 37.4 TFLOPS fp32,
        # 48 GB GDDR6 at 696 GB/s, NVLink bridge 112.5 GB/s both directions, PCIe gen4.
        _ga102_bridged_card("A40", 149.7e12, 37.4e12, 696 * _GB),
        # NVIDIA RTX A6000 datasheet: 309.7 TFLOPS tensor sparse (154.8 dense), 38.7 TFLOPS
        # fp32, 48 GB GDDR6 at 768 GB/s, NVLink bridge 112.5 GB/s both directions, PCIe gen4.
        _ga102_bridged_card("RTX-A6000", 154.8e12, 38.7e12, 768 * _GB),
        # NVIDIA L40S datasheet: 362.05 TFLOPS bf16 tensor dense (733 sparse), 733 fp8 dense,
        # 91.6 TFLOPS fp32, 48 GB GDDR6 at 864 GB/s, PCIe gen4 x16, no NVLink.
        _pcie_card("L40S", (362.05e12, 91.6e12, 733e12), 864 * _GB, 48 * _GIB, _PCIE4, 142),
        # NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): fp16 tensor with fp32
        # accumulate (what PyTorch uses) 165.2 TFLOPS dense, fp8 with fp32 accumulate 330.3,
        # 82.6 TFLOPS fp32, 24 GB GDDR6X at 1008 GB/s, PCIe gen4, no NVLink. Efficiencies
        # derived from LLMServingSim's RTX 4090 bundle (`_RTX4090_TABLES`).
        _pcie_card(
            "RTX-4090",
            (165.2e12, 82.6e12, 330.3e12),
            1008 * _GB,
            24 * _GIB,
            _PCIE4,
            128,
            _RTX4090_TABLES,
        ),
        # NVIDIA RTX PRO 6000 Blackwell (Workstation Edition): 96 GB GDDR7 at 1792 GB/s,
        # 125 TFLOPS fp32, 4000 AI TOPS fp4 sparse (datasheet); per NVIDIA's RTX Blackwell
        # figures 503.8 TFLOPS bf16 tensor dense with fp32 accumulate (full rate on this
        # card) and 1007.6 fp8; PCIe gen5 x16, no NVLink.
        _pcie_card(
            "RTX-PRO-6000", (503.8e12, 125e12, 1007.6e12), 1792 * _GB, 96 * _GIB, _PCIE5, 188
        ),
        # The Server Edition of the same card: 1597 GB/s, the figure LLMServingSim's cluster
        # config gives for its measured RTX PRO 6000 runs; FLOP/s taken as the Workstation
        # Edition's (not separately checked). Efficiencies derived from LLMServingSim's
        # bundles of this card (`_RTXPRO6000_SERVER_TABLES`).
        _pcie_card(
            "RTX-PRO-6000-Server",
            (503.8e12, 125e12, 1007.6e12),
            1597 * _GB,
            96 * _GIB,
            _PCIE5,
            188,
            _RTXPRO6000_SERVER_TABLES,
        ),
    ]


def _datacenter_presets() -> list[HardwareSpec]:
    """SXM/OAM parts on a switch or mesh. Dense tensor figures: half the sparse number. SMs:
    148 on a B200 (NVIDIA's Blackwell figures), 304 compute units on an MI300X (AMD data
    sheet); the H20's count is not published, so it keeps the A100's 108 (issue 16)."""
    return [
        # NVIDIA H20 published specifications: 148 TFLOPS bf16 dense, 296 fp8, 44 TFLOPS fp32,
        # 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s both directions, PCIe gen5.
        HardwareSpec("H20", 148e12, 44e12, 296e12, 4000 * _GB, 96 * _GIB, 450 * _GB, 2e-6, _PCIE5),
        # NVIDIA HGX B200 specifications, per GPU: fp16/bf16 4.5 PFLOPS and fp8 9 PFLOPS
        # sparse (2.25 and 4.5 dense), fp32 75 TFLOPS, 180 GB HBM3e at 7.7 TB/s, NVLink 5
        # 1.8 TB/s both directions, PCIe gen5 128 GB/s both directions.
        HardwareSpec(
            "B200",
            2250e12,
            75e12,
            4500e12,
            7700 * _GB,
            180 * _GIB,
            900 * _GB,
            2e-6,
            _PCIE5,
            num_sms=148,
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
            scale_out_bandwidth_bytes_per_s=_PCIE5,
            **_PCIE_SCALE_OUT,
            num_sms=304,
        ),
    ]


HARDWARE_PRESETS: dict[str, HardwareSpec] = _hardware_presets()


NODE_TYPES: dict[str, dict[str, float]] = {
    # NVSwitch (DGX/HGX boards): every GPU of the node in one NVLink domain; the preset as is.
    "dgx": {},
    # NVLink bridges join GPUs in pairs; a ring over more crosses PCIe (gen4 x16: 32 GB/s per
    # direction), as in Vidur's `a100_pairwise_nvlink` measurements.
    "pairwise_nvlink": {
        "nvlink_domain_size": 2,
        "scale_out_bandwidth_bytes_per_s": 32e9,
        "scale_out_latency_s": _PCIE_HOP_S,
        "scale_out_bus_efficiency": _PCIE_BUS_EFFICIENCY,
    },
}
"""How the GPUs of one node are wired, by the names Vidur's network profiles use."""


def hardware_for_node(hardware: HardwareSpec, node_type: str) -> HardwareSpec:
    """`hardware` in a node of `node_type` (a key of NODE_TYPES)."""
    if node_type not in NODE_TYPES:
        raise ValueError(f"unknown node type {node_type!r}; known: {', '.join(NODE_TYPES)}")
    changes: dict[str, Any] = dict(NODE_TYPES[node_type])
    return replace(hardware, **changes)


def get_hardware_preset(name: str) -> HardwareSpec:
    """Look up a preset by name, ignoring case; the error lists the valid names."""
    for key, spec in HARDWARE_PRESETS.items():
        if key.lower() == name.lower():
            return spec
    raise ValueError(
        f"unknown hardware {name!r}; presets are: {', '.join(sorted(HARDWARE_PRESETS))}"
    )
