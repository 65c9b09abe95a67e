"""Time of one GPU kernel from its shape and a `HardwareSpec`: tiled GEMMs (wave quantisation,
weight reads), streaming elementwise kernels (launch floor), attention, and alpha-beta all-reduce.
Pure functions; the roofline sums them into steps and `costmodel check` holds them to Vidur's
measured ops one by one."""

from __future__ import annotations

import math

from sim.specs.hardware import HardwareSpec


def gemm_s(hw: HardwareSpec, m: int, n: int, k: int, dtype_bytes: int) -> float:
    """C[m, n] = A[m, k] @ B[k, n] with B the weight.

    Compute: the output is cut into `gemm_tile_tokens` x `gemm_tile_cols` tiles, one SM each, in
    waves of `num_sms`; a partial wave costs a full one (so time steps up every 128 tokens, as
    the A100 files show); fewer tiles than SMs are split along K. Memory: weights, input and
    output cross HBM once. The kernel takes the longer of the two, plus the share of the
    shorter it does not hide (1 - `gemm_overlap_efficiency`; all of it hidden when None), plus
    a fixed latency (launch, pipeline fill, the split-K reduction).
    """
    if m <= 0:
        return 0.0
    # Few tokens get a narrower tile (cuBLAS has 16- to 64-row tiles): the smallest power of
    # two, at least 16, that holds them, so a batch-1 GEMM does not pay for 128 rows.
    tile_rows = min(hw.gemm_tile_tokens, max(16, 1 << (m - 1).bit_length()))
    tiles = math.ceil(m / tile_rows) * math.ceil(n / hw.gemm_tile_cols)
    # Fewer tiles than SMs: cuBLAS splits K across the idle SMs (split-K), so the work spreads
    # over the whole GPU instead of leaving SMs idle.
    waves = tiles / hw.num_sms if tiles < hw.num_sms else math.ceil(tiles / hw.num_sms)
    sm_flops_per_s = hw.peak_flops(dtype_bytes) / hw.num_sms * hw.gemm_flops_efficiency
    compute = waves * 2 * tile_rows * hw.gemm_tile_cols * k / sm_flops_per_s
    memory = (
        (n * k + m * k + m * n)
        * dtype_bytes
        / (hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency)
    )
    overlap = hw.gemm_overlap_efficiency
    if overlap is None or overlap == 1.0:
        return hw.gemm_latency_s + max(compute, memory)
    longer, shorter = (compute, memory) if compute >= memory else (memory, compute)
    return hw.gemm_latency_s + longer + (1.0 - overlap) * shorter


def streaming_s(
    hw: HardwareSpec, num_bytes: float, bandwidth_efficiency: float | None = None
) -> float:
    """A vectorised elementwise kernel (PyTorch's add, copies) moving `num_bytes` through HBM,
    reads plus writes, at `bandwidth_efficiency` (default `memory_bandwidth_efficiency`)."""
    if num_bytes <= 0:
        return 0.0
    if bandwidth_efficiency is None:
        bandwidth_efficiency = hw.memory_bandwidth_efficiency
    bandwidth = hw.hbm_bandwidth_bytes_per_s * bandwidth_efficiency
    return max(num_bytes / bandwidth, hw.kernel_launch_floor_s)


def row_kernel_s(
    hw: HardwareSpec, num_bytes: float, row_elements: int, bandwidth_efficiency: float | None = None
) -> float:
    """A one-block-per-token kernel (RMSNorm, rotary, SiLU-and-mul) moving `num_bytes`.

    Few tokens leave most SMs idle, and each block's threads walk their row
    `row_block_threads` elements at a time, a dependent HBM round trip per step: a floor that
    grows with the row's width. Many tokens make it bandwidth-bound, at the lower efficiency
    such kernels reach (no vectorised loads, a reduction or a table per row):
    `elementwise_bandwidth_efficiency` unless the kernel has its own (`bandwidth_efficiency`).
    """
    if num_bytes <= 0:
        return 0.0
    walk = hw.kernel_launch_floor_s + math.ceil(row_elements / hw.row_block_threads) * (
        hw.dram_latency_s
    )
    if bandwidth_efficiency is None:
        bandwidth_efficiency = hw.elementwise_bandwidth_efficiency
    bandwidth = hw.hbm_bandwidth_bytes_per_s * bandwidth_efficiency
    return max(num_bytes / bandwidth, walk)


def embedding_s(hw: HardwareSpec, num_tokens: int, num_bytes: float, row_elements: int) -> float:
    """The embedding lookup of `num_tokens` tokens moving `num_bytes` in all.

    Up to `small_index_max_rows` tokens, PyTorch's index_select takes its small-index kernel,
    which walks the indices one after another: the launch floor plus `small_index_row_s` per
    token. Beyond, a row kernel at `embedding_bandwidth_efficiency` (scattered row gathers).
    """
    if num_tokens <= 0 or num_bytes <= 0:
        return 0.0
    if num_tokens <= hw.small_index_max_rows:
        return hw.kernel_launch_floor_s + num_tokens * hw.small_index_row_s
    return row_kernel_s(hw, num_bytes, row_elements, hw.embedding_bandwidth_efficiency)


def attention_s(hw: HardwareSpec, flops: float, num_bytes: float) -> float:
    """One attention kernel: the longer of its FLOPs and its bytes at attention efficiency."""
    if flops <= 0 and num_bytes <= 0:
        return 0.0
    compute = flops / (hw.peak_fp16_flops * hw.attention_flops_efficiency)
    memory = num_bytes / (hw.hbm_bandwidth_bytes_per_s * hw.attention_bandwidth_efficiency)
    return hw.attention_latency_s + max(compute, memory, hw.kernel_launch_floor_s)


def ring_link(hw: HardwareSpec, num_workers: int, domain: int) -> tuple[float, float, float]:
    """(bandwidth in bytes/s, hop latency in s, bus efficiency) of the slowest link of a ring of
    ``num_workers`` GPUs: NVLink while they fit in one NVLink ``domain``, else scale-out."""
    if num_workers <= domain:
        return (
            hw.interconnect_bandwidth_bytes_per_s,
            hw.interconnect_latency_s,
            hw.interconnect_bus_efficiency,
        )
    return (
        hw.scale_out_bandwidth_bytes_per_s,
        hw.scale_out_latency_s,
        hw.scale_out_bus_efficiency,
    )


def allreduce_s(
    hw: HardwareSpec, num_bytes: float, num_workers: int, devices_per_node: int | None = None
) -> float:
    """One ring all-reduce of `num_bytes` per rank over `num_workers` GPUs, alpha-beta style.

    alpha: a per-call latency plus one hop latency per ring step (2(p-1) steps: reduce-scatter
    then all-gather). beta: each rank sends and receives 2(p-1)/p of the message at the bus
    bandwidth of the ring's slowest link: NVLink while every rank is in one NVLink domain (the
    smaller of `nvlink_domain_size` and `devices_per_node`), otherwise the scale-out link
    (PCIe between NVLink pairs, or the network between nodes), whose hop latency and bus
    efficiency are its own: every ring step waits for the slowest edge.
    """
    if num_workers <= 1 or num_bytes <= 0:
        return 0.0
    domain = hw.nvlink_domain_size
    if devices_per_node is not None:
        domain = min(domain, devices_per_node)
    link, hop, bus = ring_link(hw, num_workers, domain)
    steps = 2 * (num_workers - 1)
    latency = hw.allreduce_call_latency_s + steps * hop
    return latency + steps / num_workers * num_bytes / (link * bus)


def link_s(num_bytes: float, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """``num_bytes`` over one link: its latency plus the bytes at its bandwidth; nothing to
    send costs nothing."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(
            f"link_bandwidth_bytes_per_s must be positive, got {bandwidth_bytes_per_s!r}"
        )
    if num_bytes <= 0:
        return 0.0
    return latency_s + num_bytes / bandwidth_bytes_per_s
