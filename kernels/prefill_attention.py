"""Prefill attention over a paged KV cache: variable-length query chunks attend causally to
their own tokens and to earlier context already cached (chunked prefill, prefix-cache hits).
``plan_paged_prefill`` checks a step's metadata once; ``run_paged_prefill`` launches a layer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import contracts
from kernels.paged_attention import LOG2_E, _gather_kv_tile, _online_softmax_step
from kernels.torch_attention import paged_prefill_attention_torch, plan_prefill


@triton.jit
def _paged_prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
    query_start_loc_ptr, seq_lens_ptr, context_lens_ptr, out_ptr,
    qk_scale,
    stride_q_token, stride_q_head,
    stride_k_block, stride_k_token, stride_k_head,
    stride_v_block, stride_v_token, stride_v_head,
    stride_table_seq, stride_o_token, stride_o_head,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_QUERIES: tl.constexpr, TILE_TOKENS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: TILE_QUERIES query tokens of one sequence and one query head.

    Query i of a chunk sits at position context_len + i and sees keys 0..context_len + i
    (causal, bottom-right aligned); the chunk's own K/V are already in the cache.
    """
    q_tile_idx = tl.program_id(0)
    head_idx = tl.program_id(1).to(tl.int64)
    seq_idx = tl.program_id(2).to(tl.int64)
    q_start = tl.load(query_start_loc_ptr + seq_idx).to(tl.int64)
    query_len = (tl.load(query_start_loc_ptr + seq_idx + 1) - q_start).to(tl.int32)
    first_query = q_tile_idx * TILE_QUERIES
    # The grid is sized for the longest chunk; shorter chunks leave idle programs.
    if first_query >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq_idx).to(tl.int32)
    context_len = tl.load(context_lens_ptr + seq_idx).to(tl.int32)

    offs_m = first_query + tl.arange(0, TILE_QUERIES)
    offs_d = tl.arange(0, HEAD_DIM)
    row_mask = offs_m < query_len
    q_rows = q_start + offs_m.to(tl.int64)
    q_ptrs = q_ptr + q_rows[:, None] * stride_q_token + head_idx * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0)

    m_i = tl.full([TILE_QUERIES], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([TILE_QUERIES], dtype=tl.float32)
    acc = tl.zeros([TILE_QUERIES, HEAD_DIM], dtype=tl.float32)
    table_row_ptr = block_tables_ptr + seq_idx * stride_table_seq
    kv_head_idx = head_idx // QUERIES_PER_KV
    k_head_offset = kv_head_idx * stride_k_head
    v_head_offset = kv_head_idx * stride_v_head
    last_query = tl.minimum(first_query + TILE_QUERIES, query_len) - 1
    kv_end = tl.minimum(seq_len, context_len + last_query + 1)
    # Keys before context_len + first_query are visible to every row: skip the causal mask.
    unmasked_end = tl.minimum(context_len + first_query, kv_end) // TILE_TOKENS * TILE_TOKENS
    for tile_start in range(0, unmasked_end, TILE_TOKENS):
        token_idx = tile_start + tl.arange(0, TILE_TOKENS)
        token_mask = token_idx < kv_end
        k = _gather_kv_tile(
            k_cache_ptr, table_row_ptr, token_idx, token_mask, k_head_offset, offs_d,
            stride_k_block, stride_k_token, BLOCK_SIZE,
        )  # fmt: skip
        v = _gather_kv_tile(
            v_cache_ptr, table_row_ptr, token_idx, token_mask, v_head_offset, offs_d,
            stride_v_block, stride_v_token, BLOCK_SIZE,
        )  # fmt: skip
        m_i, l_i, acc = _online_softmax_step(
            q, k, v, m_i, l_i, acc, token_mask[None, :], qk_scale, DOT_PRECISION
        )
    for tile_start in range(unmasked_end, kv_end, TILE_TOKENS):
        token_idx = tile_start + tl.arange(0, TILE_TOKENS)
        token_mask = token_idx < kv_end
        k = _gather_kv_tile(
            k_cache_ptr, table_row_ptr, token_idx, token_mask, k_head_offset, offs_d,
            stride_k_block, stride_k_token, BLOCK_SIZE,
        )  # fmt: skip
        v = _gather_kv_tile(
            v_cache_ptr, table_row_ptr, token_idx, token_mask, v_head_offset, offs_d,
            stride_v_block, stride_v_token, BLOCK_SIZE,
        )  # fmt: skip
        causal = token_idx[None, :] <= (context_len + offs_m)[:, None]
        m_i, l_i, acc = _online_softmax_step(
            q, k, v, m_i, l_i, acc, causal & token_mask[None, :], qk_scale, DOT_PRECISION
        )

    # Every real row sees key 0, so l_i > 0 there; the guard only keeps padded rows finite.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + q_rows[:, None] * stride_o_token + head_idx * stride_o_head + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def prefill_tiles(head_dim: int, device: torch.device) -> tuple[int, int, int]:
    """(query tile, key tile, num_warps): bigger query tiles reuse each K/V load more."""
    if device.type != "cuda":
        return 16, 32, 4
    if head_dim >= 256:
        return 64, 32, 4
    return 128, 64, 8


@dataclass(frozen=True, slots=True)
class PrefillLaunch:
    """One step's paged prefill, checked and planned once for every layer: ``num_seqs``
    chunks of ``num_q_heads`` query heads, the grid sized for ``max_query_len``."""

    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    context_lens: torch.Tensor
    num_seqs: int
    num_q_heads: int
    max_query_len: int
    cache: contracts.CacheShape
    tile_queries: int
    tile_tokens: int
    num_warps: int
    qk_scale: float
    dot_precision: str


def plan_paged_prefill(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    context_lens: torch.Tensor,
    num_q_heads: int,
    scale: float,
    *,
    max_query_len: int | None = None,
    tiles: tuple[int, int] | None = None,
) -> PrefillLaunch:
    """Check one layer's caches and the step's chunk metadata, and fix the tiles and grid
    (see ``paged_prefill_attention`` for the arguments)."""
    cache = contracts.check_kv_cache(k_cache, v_cache)
    if num_q_heads < 1 or num_q_heads % cache.num_kv_heads:
        raise ValueError(
            f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {cache.num_kv_heads}"
        )
    device = k_cache.device
    contracts.check_index("seq_lens", seq_lens, (None,), device)
    num_seqs = seq_lens.shape[0]
    contracts.check_index("context_lens", context_lens, (num_seqs,), device)
    contracts.check_index("query_start_loc", query_start_loc, (num_seqs + 1,), device)
    contracts.check_index("block_tables", block_tables, (num_seqs, None), device)
    tile_queries, tile_tokens, num_warps = prefill_tiles(cache.head_dim, device)
    if tiles is not None:
        tile_queries, tile_tokens = tiles
    for name, value in (("query tile", tile_queries), ("key tile", tile_tokens)):
        if not contracts.is_power_of_two(value) or value < 16:
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    query_start_loc = query_start_loc.contiguous()
    if max_query_len is None:
        lens = query_start_loc[1:] - query_start_loc[:-1]
        max_query_len = int(lens.max().item()) if num_seqs else 0
    return PrefillLaunch(
        block_tables.contiguous(), query_start_loc, seq_lens.contiguous(),
        context_lens.contiguous(), num_seqs, num_q_heads, max_query_len, cache,
        tile_queries, tile_tokens, num_warps, scale * LOG2_E,
        contracts.dot_precision(k_cache.dtype),
    )  # fmt: skip


def run_paged_prefill(
    launch: PrefillLaunch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The planned prefill for one layer: q [num_tokens, num_q_heads, head_dim] and the
    caches must match the plan (unchecked). Writes ``out`` (new if None) and returns it."""
    if out is None:
        out = torch.empty_like(q)
    if launch.num_seqs == 0 or q.shape[0] == 0 or launch.max_query_len == 0:
        return out
    cache = launch.cache
    grid = (math.ceil(launch.max_query_len / launch.tile_queries), q.shape[1], launch.num_seqs)
    _paged_prefill_attention_kernel[grid](
        q, k_cache, v_cache, launch.block_tables,
        launch.query_start_loc, launch.seq_lens, launch.context_lens, out,
        launch.qk_scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        launch.block_tables.stride(0), out.stride(0), out.stride(1),
        QUERIES_PER_KV=launch.num_q_heads // cache.num_kv_heads, HEAD_DIM=cache.head_dim,
        BLOCK_SIZE=cache.block_size, TILE_QUERIES=launch.tile_queries,
        TILE_TOKENS=launch.tile_tokens, DOT_PRECISION=launch.dot_precision,
        num_warps=launch.num_warps, num_stages=2,
    )  # fmt: skip
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    backend: str = "auto",
    max_query_len: int | None = None,
    tiles: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Attention of the packed query chunks q [num_tokens, num_q_heads, head_dim].

    Sequence i's chunk is q[query_start_loc[i]:query_start_loc[i + 1]]; its K/V must already be
    in the cache (call store_kv first), so seq_lens[i] == context_lens[i] + chunk length.
    Without `max_query_len` the wrapper reads it from query_start_loc (a device sync).
    `tiles` = (query tile, key tile) overrides the heuristic (tests and benchmarks).
    """
    cache = contracts.check_kv_cache(k_cache, v_cache)
    contracts.check_queries(q, cache, k_cache.device, k_cache.dtype)
    contracts.check_index("seq_lens", seq_lens, (None,), q.device)
    num_seqs = seq_lens.shape[0]
    contracts.check_index("context_lens", context_lens, (num_seqs,), q.device)
    contracts.check_index("query_start_loc", query_start_loc, (num_seqs + 1,), q.device)
    contracts.check_index("block_tables", block_tables, (num_seqs, None), q.device)
    if contracts.resolve_backend(q.device, backend) == "torch":
        chunks = plan_prefill(
            block_tables,
            query_start_loc.tolist(),
            seq_lens.tolist(),
            context_lens.tolist(),
            cache.block_size,
        )
        return paged_prefill_attention_torch(q, k_cache, v_cache, chunks, scale)
    if num_seqs == 0 or q.shape[0] == 0:
        # (checked like any call, but no device read of an empty query_start_loc)
        max_query_len = 0
    launch = plan_paged_prefill(
        k_cache, v_cache, block_tables, query_start_loc, seq_lens, context_lens, q.shape[1],
        scale, max_query_len=max_query_len, tiles=tiles,
    )  # fmt: skip
    return run_paged_prefill(launch, q, k_cache, v_cache)
