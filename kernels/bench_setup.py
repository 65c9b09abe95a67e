"""What the kernel benchmarks share: the Llama-3-8B layer they time, the targets, the result
row, the timer and the paged-cache builder (``kernels.bench`` and ``kernels.bench_graph``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
ELEMENT_BYTES = 2  # bf16
# Targets from the kernel issue: fraction of copy bandwidth, or of SDPA-flash throughput.
DECODE_LARGE_TOKENS, DECODE_MEDIUM_TOKENS = 256 * 1024, 32 * 1024
TARGETS = {
    "decode_large": 0.75,
    "decode_medium": 0.55,
    "decode_small_us": 20.0,
    "block16_vs_128": 1.15,
    "prefill_vs_sdpa": 0.70,
    "cache_ops": 0.60,
}


@dataclass
class Row:
    kernel: str
    shape: dict[str, int]
    median_us: float
    bandwidth_gbs: float | None = None
    tflops: float | None = None
    sdpa_us: float | None = None
    sdpa_backend: str | None = None
    graph_us: float | None = None  # per call, captured in a CUDA graph
    torch_us: float | None = None  # the unfused torch ops a fused kernel replaces
    torch_graph_us: float | None = None
    # The same call under the variant it is compared with, in a CUDA graph (decode_split: the
    # "fixed" split, where the row's own times are "per_sequence").
    baseline_graph_us: float | None = None
    verdicts: dict[str, bool] = field(default_factory=dict)


def time_us(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return 1000.0 * float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def paged_cache(
    num_seqs: int,
    seq_len: int,
    block_size: int,
    device: str = "cuda",
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A cache (bf16 unless told) holding num_seqs x seq_len tokens in randomly permuted blocks."""
    import torch

    dtype = dtype or torch.bfloat16
    blocks_per_seq = math.ceil(seq_len / block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device=device, dtype=dtype)
    v_cache = torch.randn(shape, device=device, dtype=dtype)
    perm = torch.randperm(num_blocks, device=device, dtype=torch.int64).to(torch.int32)
    return k_cache, v_cache, perm.view(num_seqs, blocks_per_seq)
