"""Pure-torch references for the kernels: gather a sequence's blocks, attend densely in fp32.

Slow (a Python loop over sequences) and obviously right; the tests hold the Triton kernels and
the vectorised torch path (`kernels.torch_attention`, what `backend="torch"` runs) to these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first `num_tokens` of one sequence from a paged cache: [num_tokens, kv_heads, dim]."""
    block_size = cache.shape[1]
    token_idx = torch.arange(num_tokens, device=cache.device)
    block_ids = block_table.long()[token_idx // block_size]
    return cache[block_ids, token_idx % block_size]


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> torch.Tensor:
    """Softmax attention of q [Lq, Hq, D] over k, v [Lk, Hkv, D] in fp32, returned in fp32.

    With `causal`, the mask is bottom-right aligned: query i sees keys j <= Lk - Lq + i, so the
    last query sees everything (the queries are the newest Lq of the Lk tokens).
    """
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)  # [Hq, Lq, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = qf @ kf.transpose(1, 2) * scale  # [Hq, Lq, Lk]
    if causal:
        num_q, num_k = q.shape[0], k.shape[0]
        query_pos = torch.arange(num_q, device=q.device)[:, None] + (num_k - num_q)
        key_pos = torch.arange(num_k, device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).transpose(0, 1)


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence attending to its `seq_lens[i]` cached tokens."""
    out = torch.zeros_like(q)
    for seq_idx, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[seq_idx], seq_len)
        v = gather_kv(v_cache, block_tables[seq_idx], seq_len)
        out[seq_idx] = dense_attention(q[seq_idx : seq_idx + 1], k, v, scale, causal=False)[0]
    return out


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Each sequence's query chunk attends causally to its context and to itself, all cached."""
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    lengths = zip(seq_lens.tolist(), context_lens.tolist(), strict=True)
    for seq_idx, (seq_len, context_len) in enumerate(lengths):
        start, end = starts[seq_idx], starts[seq_idx + 1]
        if end == start:
            continue
        if seq_len != context_len + end - start:
            raise ValueError(
                f"sequence {seq_idx}: seq_len {seq_len} != context_len {context_len} "
                f"+ query_len {end - start}"
            )
        k = gather_kv(k_cache, block_tables[seq_idx], seq_len)
        v = gather_kv(v_cache, block_tables[seq_idx], seq_len)
        out[start:end] = dense_attention(q[start:end], k, v, scale, causal=True)
    return out


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token i's K/V into slot `slot_mapping[i]` (block_id * block_size + offset).

    Slot -1 skips the token.
    """
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache[slots // block_size, slots % block_size] = k[keep]
    v_cache[slots // block_size, slots % block_size] = v[keep]


def copy_blocks_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pairs: torch.Tensor | Sequence[tuple[int, int]],
) -> None:
    """Copy block `src` onto block `dst` in both caches for every (src, dst) pair."""
    pairs_t = torch.as_tensor(pairs, dtype=torch.long, device=k_cache.device).reshape(-1, 2)
    src, dst = pairs_t[:, 0], pairs_t[:, 1]
    k_cache[dst] = k_cache[src]
    v_cache[dst] = v_cache[src]
