"""Decode attention over a paged KV cache: one query token per sequence, split-KV when the
batch is too small to fill the GPU, plus the tile helpers the prefill kernel shares.

``plan_paged_decode`` checks a step's metadata and fixes its split plan and scratch once;
``run_paged_decode`` then launches each layer without checking again (and a CUDA graph can
capture it: the plan's tensors and launch parameters stay fixed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from core.decode_split import DEFAULT_SPLIT, check_split_mode, gpu_tile_tokens
from core.decode_split import choose_num_splits as choose_num_splits
from core.decode_split import plan_splits as _plan_splits
from kernels import contracts
from kernels.torch_attention import paged_decode_attention_torch, plan_decode

LOG2_E = 1.4426950408889634
# tl.dot needs M >= 16, so the GQA group (the M dim of the decode dot) is padded up to it.
MIN_DOT_ROWS = 16


@triton.jit
def _gather_kv_tile(
    cache_ptr, table_row_ptr, token_idx, token_mask, head_offset, offs_d,
    stride_block, stride_token, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Load [len(token_idx), HEAD_DIM] of one kv head; each token finds its block in the table."""
    block_id = tl.load(table_row_ptr + token_idx // BLOCK_SIZE, mask=token_mask, other=0)
    # int64 before the multiply: block_id * stride_block passes 2**31 in large caches.
    slot_offset = block_id.to(tl.int64) * stride_block
    slot_offset += (token_idx % BLOCK_SIZE).to(tl.int64) * stride_token
    ptrs = cache_ptr + head_offset + slot_offset[:, None] + offs_d[None, :]
    # Masked so unused slots (stale or NaN) never enter the dot products.
    return tl.load(ptrs, mask=token_mask[:, None], other=0.0)


@triton.jit
def _online_softmax_step(
    q, k, v, m_i, l_i, acc, score_mask, qk_scale, DOT_PRECISION: tl.constexpr
):  # fmt: skip
    """Fold one K/V tile into the running max, denominator and accumulator (base-2, fp32)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(score_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _paged_decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, tokens_per_split,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_token, stride_k_head,
    stride_v_block, stride_v_token, stride_v_head,
    stride_table_seq, stride_o_seq, stride_o_head,
    QUERIES_PER_KV: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_TOKENS: tl.constexpr, WRITE_PARTIALS: tl.constexpr,
    PER_SEQUENCE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: one sequence, one kv head (its whole query group as the dot's rows), one
    split of the tokens. With one split it writes the output; else a partial and its lse.
    ``PER_SEQUENCE``: the sequence's own tiles are shared among the splits, instead of every
    split being ``tokens_per_split`` long (``core.decode_split.SPLIT_MODES``)."""
    seq_idx = tl.program_id(0).to(tl.int64)
    kv_head_idx = tl.program_id(1).to(tl.int64)
    split_idx = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq_idx).to(tl.int32)
    if PER_SEQUENCE:
        seq_tiles = (seq_len + TILE_TOKENS - 1) // TILE_TOKENS
        num_splits = tl.num_programs(2)
        tokens_per_split = (seq_tiles + num_splits - 1) // num_splits * TILE_TOKENS
    split_start = split_idx * tokens_per_split
    split_end = tl.minimum(seq_len, split_start + tokens_per_split)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    head_idx = kv_head_idx * QUERIES_PER_KV + offs_g
    group_mask = offs_g < QUERIES_PER_KV
    q_ptrs = q_ptr + seq_idx * stride_q_seq + head_idx[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptrs, mask=group_mask[:, None], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    table_row_ptr = block_tables_ptr + seq_idx * stride_table_seq
    k_head_offset = kv_head_idx * stride_k_head
    v_head_offset = kv_head_idx * stride_v_head
    for tile_start in range(split_start, split_end, TILE_TOKENS):
        token_idx = tile_start + tl.arange(0, TILE_TOKENS)
        token_mask = token_idx < split_end
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

    # An empty split (or seq_len 0) has l_i == 0: write zeros and lse -inf, never NaN.
    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    if WRITE_PARTIALS:
        # Partials are [seq, q_head, split, dim] fp32; every split writes, so the reduce never
        # reads uninitialised memory.
        num_q_heads = QUERIES_PER_KV * tl.num_programs(1)
        row = (seq_idx * num_q_heads + head_idx) * tl.num_programs(2) + split_idx
        part_ptrs = part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(part_ptrs, out, mask=group_mask[:, None])
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=group_mask)
    else:
        o_ptrs = out_ptr + seq_idx * stride_o_seq + head_idx[:, None] * stride_o_head
        o_ptrs += offs_d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=group_mask[:, None])


@triton.jit
def _reduce_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits, stride_o_seq, stride_o_head,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Combine the splits of one (sequence, query head) by their log-sum-exp weights."""
    seq_idx = tl.program_id(0).to(tl.int64)
    head_idx = tl.program_id(1).to(tl.int64)
    row0 = (seq_idx * tl.num_programs(1) + head_idx) * num_splits
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    split_mask = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row0 + offs_s, mask=split_mask, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    # All splits empty (seq_len 0): weights become 0 instead of exp2(-inf - -inf) = NaN.
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp2(lse - lse_max)
    parts = tl.load(
        part_out_ptr + (row0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )
    total = tl.sum(weights, 0)
    out = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    o_ptrs = out_ptr + seq_idx * stride_o_seq + head_idx * stride_o_head + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty))


def parallel_programs(device: torch.device) -> int:
    """How many programs keep the device busy: two per SM on CUDA, one per core elsewhere."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1


def plan_splits(
    num_programs: int, max_seq_len: int, tile: int, num_splits: int | None, device: torch.device
) -> tuple[int, int]:
    """(num_splits, tokens_per_split), the split a whole number of tiles long
    (``core.decode_split.plan_splits`` on this device's parallel programs)."""
    target = parallel_programs(device) if num_splits is None else 1
    return _plan_splits(num_programs, max_seq_len, tile, target, num_splits)


def decode_tile_tokens(head_dim: int, device: torch.device) -> int:
    # The interpreter pays per loop iteration, so it gets big tiles; GPUs keep K+V tiles in
    # registers, which caps the tile for head_dim 256.
    if device.type != "cuda":
        return 32
    return gpu_tile_tokens(head_dim)


@dataclass(frozen=True, slots=True)
class DecodeLaunch:
    """One step's paged decode, checked and planned once: ``num_seqs`` rows of
    ``num_q_heads`` query heads over caches shaped as ``cache``, split ``num_splits`` ways
    (``tokens_per_split`` tokens each at most; each sequence's own share under
    ``split_mode`` "per_sequence") with scratch ``part_out``/``part_lse`` when split."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    num_seqs: int
    num_q_heads: int
    cache: contracts.CacheShape
    num_splits: int
    tokens_per_split: int
    tile: int
    qk_scale: float
    dot_precision: str
    part_out: torch.Tensor | None
    part_lse: torch.Tensor | None
    split_mode: str = DEFAULT_SPLIT


def plan_paged_decode(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_q_heads: int,
    scale: float,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_tokens: int | None = None,
    split_mode: str = DEFAULT_SPLIT,
) -> DecodeLaunch:
    """Check one layer's caches and the step's block tables and lengths, and fix the split
    plan and its scratch (see ``paged_decode_attention`` for the arguments)."""
    check_split_mode(split_mode, "split_mode")
    cache = contracts.check_kv_cache(k_cache, v_cache)
    if num_q_heads < 1 or num_q_heads % cache.num_kv_heads:
        raise ValueError(
            f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {cache.num_kv_heads}"
        )
    contracts.check_index("seq_lens", seq_lens, (None,), k_cache.device)
    num_seqs = seq_lens.shape[0]
    contracts.check_index("block_tables", block_tables, (num_seqs, None), k_cache.device)
    tile = tile_tokens or decode_tile_tokens(cache.head_dim, k_cache.device)
    if not contracts.is_power_of_two(tile) or tile < MIN_DOT_ROWS:
        raise ValueError(f"tile_tokens must be a power of two >= 16, got {tile}")
    if max_seq_len is None:
        max_seq_len = block_tables.shape[1] * cache.block_size
    num_splits, tokens_per_split = plan_splits(
        num_seqs * cache.num_kv_heads, max_seq_len, tile, num_splits, k_cache.device
    )
    part_out = part_lse = None
    if num_splits > 1 and num_seqs:
        shape = (num_seqs, num_q_heads, num_splits)
        part_out = k_cache.new_empty((*shape, cache.head_dim), dtype=torch.float32)
        part_lse = k_cache.new_empty(shape, dtype=torch.float32)
    return DecodeLaunch(
        block_tables.contiguous(), seq_lens.contiguous(), num_seqs, num_q_heads, cache,
        num_splits, tokens_per_split, tile, scale * LOG2_E,
        contracts.dot_precision(k_cache.dtype), part_out, part_lse, split_mode,
    )  # fmt: skip


def run_paged_decode(
    launch: DecodeLaunch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The planned decode for one layer: q [num_seqs, num_q_heads, head_dim] and the caches
    must match the plan (unchecked; q and ``out`` need a unit last stride). Writes ``out``
    (a new tensor if None) and returns it."""
    if out is None:
        out = torch.empty_like(q)
    if launch.num_seqs == 0:
        return out
    cache, num_splits = launch.cache, launch.num_splits
    group = launch.num_q_heads // cache.num_kv_heads
    part_out = launch.part_out if launch.part_out is not None else out
    part_lse = launch.part_lse if launch.part_lse is not None else out
    grid = (launch.num_seqs, cache.num_kv_heads, num_splits)
    _paged_decode_attention_kernel[grid](
        q, k_cache, v_cache, launch.block_tables, launch.seq_lens, out, part_out, part_lse,
        launch.qk_scale, launch.tokens_per_split,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        launch.block_tables.stride(0), out.stride(0), out.stride(1),
        QUERIES_PER_KV=group, GROUP_PAD=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
        HEAD_DIM=cache.head_dim, BLOCK_SIZE=cache.block_size, TILE_TOKENS=launch.tile,
        WRITE_PARTIALS=num_splits > 1, PER_SEQUENCE=launch.split_mode == "per_sequence",
        DOT_PRECISION=launch.dot_precision,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if num_splits > 1:
        _reduce_splits_kernel[(launch.num_seqs, launch.num_q_heads)](
            part_out, part_lse, out, num_splits, out.stride(0), out.stride(1),
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            HEAD_DIM=cache.head_dim, num_warps=4,
        )  # fmt: skip
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    backend: str = "auto",
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_tokens: int | None = None,
    split_mode: str = DEFAULT_SPLIT,
) -> torch.Tensor:
    """Attention of q [num_seqs, num_q_heads, head_dim] over each sequence's cached tokens.

    block_tables [num_seqs, max_blocks] and seq_lens [num_seqs] are int32/int64; seq_lens[i]
    counts all cached tokens of sequence i (the current one included, written by store_kv).
    Values are not checked on the device: a block id outside the cache reads out of bounds.
    `max_seq_len` (an upper bound on seq_lens, known to the scheduler) sizes the KV splits;
    without it they cover the whole block table. `num_splits` and `tile_tokens` override the
    heuristics (tests and benchmarks). `split_mode` ("per_sequence" or "fixed",
    ``core.decode_split.SPLIT_MODES``) says whether each sequence shares its own context among
    the splits or every split spans the planned length.
    """
    cache = contracts.check_kv_cache(k_cache, v_cache)
    contracts.check_queries(q, cache, k_cache.device, k_cache.dtype)
    num_seqs = q.shape[0]
    contracts.check_index("seq_lens", seq_lens, (num_seqs,), q.device)
    contracts.check_index("block_tables", block_tables, (num_seqs, None), q.device)
    if contracts.resolve_backend(q.device, backend) == "torch":
        plan = plan_decode(block_tables, seq_lens.tolist(), cache.block_size)
        return paged_decode_attention_torch(q, k_cache, v_cache, plan, scale)
    launch = plan_paged_decode(
        k_cache, v_cache, block_tables, seq_lens, q.shape[1], scale,
        max_seq_len=max_seq_len, num_splits=num_splits, tile_tokens=tile_tokens,
        split_mode=split_mode,
    )  # fmt: skip
    return run_paged_decode(launch, q, k_cache, v_cache)
