"""Random paged-KV cases for the kernel tests: contiguous per-sequence K/V scattered through
random, non-contiguous block tables into caches whose unused slots hold NaN."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

# fp16 runs the dots on fp16 inputs and rounds P to fp16 before P @ V.
TOLERANCES = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@dataclass
class PagedCase:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    keys: list[torch.Tensor]  # per sequence, [seq_len, num_kv_heads, head_dim], as cached
    values: list[torch.Tensor]
    poison_block_id: int  # a NaN-only block that pads every block table


def make_paged_case(
    seq_lens: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> PagedCase:
    """Blocks are dealt to sequences in a random order, so no table is contiguous or sorted;
    table columns past a sequence's end name a NaN block, as do unused slots of its last one."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    poison_block_id = order.pop()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    max_blocks = max(blocks_per_seq, default=0) + 1
    block_tables = torch.full((len(seq_lens), max_blocks), poison_block_id, dtype=torch.int32)
    keys, values = [], []
    for seq_idx, (seq_len, num_seq_blocks) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        blocks = [order.pop() for _ in range(num_seq_blocks)]
        block_tables[seq_idx, :num_seq_blocks] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        token_idx = torch.arange(seq_len)
        block_ids = torch.tensor(blocks, dtype=torch.long)[token_idx // block_size]
        k_cache[block_ids, token_idx % block_size] = k
        v_cache[block_ids, token_idx % block_size] = v
        keys.append(k.to(device))
        values.append(v.to(device))
    return PagedCase(
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        keys=keys,
        values=values,
        poison_block_id=poison_block_id,
    )


def random_queries(
    num_rows: int, num_q_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(num_rows, num_q_heads, head_dim, generator=gen).to(dtype).to(device)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """torch's own SDPA in fp32 with a bottom-right causal mask, q [Lq, Hq, D], k/v [Lk, Hkv, D].

    Independent of kernels.reference: it is the check on the references as well.
    """
    qf, kf, vf = (t.float().transpose(0, 1)[None] for t in (q, k, v))
    mask = causal_lower_right(q.shape[0], k.shape[0]) if q.shape[0] > 1 else None
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any(), "NaN reached the output"
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=tol, rtol=tol)
