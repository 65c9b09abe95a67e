"""Paged attention in vectorised torch, the CPU fast path: all of a step's decodes at once (split
over their cached tokens, merged per row), each prefill chunk in one
``scaled_dot_product_attention``, the gather indices and masks planned once per step. A step
with only a few decodes (``ROW_PATH_MAX_SEQS``) runs each row on its own instead: at that size
the split-and-merge's fixed cost of some twenty ops per layer outweighs a loop.

``kernels.reference`` stays the slow, obviously-right oracle; the tests hold this path to it.
Slots a sequence does not own (past its length, or named by table padding) are never read into
a result, NaN included: decode masks them out of the scores and zeroes them in V, prefill slices
them off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Tokens per decode split: long enough that a split's small matmuls amortise their call, short
# enough that padding a row's last split wastes little.
SPLIT_TOKENS = 128
# Decode rows up to which one SDPA per row beats the split-and-merge (thread CPU time, one torch
# thread, tiny-llama's 8 query and 2 KV heads of 32 at contexts 100-1,500: 1 row 47-335 us
# against 512-1,066, 8 rows 502-2,315 against 880-2,518; benchmarks/bench_engine.py).
ROW_PATH_MAX_SEQS = 8


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """Where a step's decode rows read. Each row's block table is cut into splits of
    ``split_blocks`` blocks, as many as hold its ``seq_lens`` tokens; ``block_ids``
    [num_splits * split_blocks] lists them split after split (a last split padded with block
    0) and ``split_rows`` [num_splits] the row each split belongs to. ``last_splits``
    [num_seqs] index each row's last split (-1 for an empty row) and ``last_valid``
    [num_seqs, split_blocks * block_size] says which of its slots the row has filled; every
    other split is full. ``value_slots`` [num_splits, split_blocks * block_size] are the
    splits' cache slots, a padding slot replaced by its split's first (owned) slot, so that
    P @ V can read V straight from the cache with zero weight there."""

    block_ids: torch.Tensor
    split_rows: torch.Tensor
    last_splits: torch.Tensor
    last_valid: torch.Tensor
    value_slots: torch.Tensor
    num_seqs: int


@dataclass(frozen=True, slots=True)
class RowDecodePlan:
    """A few decode rows, each attended on its own: row ``i`` reads the first
    ``seq_lens[i]`` slots of the blocks ``block_ids[i]``."""

    block_ids: tuple[torch.Tensor, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One query chunk: rows ``query_start .. query_end`` of q attend to the first
    ``seq_len`` tokens of the blocks ``block_ids``; ``mask`` [query_len, seq_len] is the
    bottom-right causal mask when the chunk has cached context before it, else None (plain
    causal, which SDPA builds itself)."""

    query_start: int
    query_end: int
    block_ids: torch.Tensor
    seq_len: int
    mask: torch.Tensor | None


def plan_decode(
    block_tables: torch.Tensor,
    seq_lens: list[int],
    block_size: int,
    max_row_seqs: int = ROW_PATH_MAX_SEQS,
) -> DecodePlan | RowDecodePlan:
    """The decode gather plan for block_tables [num_seqs, max_blocks] and each row's length:
    one row at a time for 1 to ``max_row_seqs`` rows, else split and merged."""
    num_seqs = len(seq_lens)
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows, seq_lens {num_seqs}")
    max_len = max(seq_lens, default=0)
    if -(-max_len // block_size) > block_tables.shape[1]:
        raise ValueError(
            f"a sequence of {max_len} tokens needs {-(-max_len // block_size)} blocks, but "
            f"block_tables has {block_tables.shape[1]} columns"
        )
    if 0 < num_seqs <= max_row_seqs:
        tables = block_tables.long()
        return RowDecodePlan(
            tuple(tables[i, : -(-n // block_size)] for i, n in enumerate(seq_lens)),
            tuple(seq_lens),
        )
    split_blocks = max(1, SPLIT_TOKENS // block_size)
    split_tokens = split_blocks * block_size
    device = block_tables.device
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    num_splits = (lens + split_tokens - 1) // split_tokens
    width = -(-max_len // split_tokens) * split_blocks
    tables = torch.zeros((num_seqs, width), dtype=torch.int64, device=device)
    used = min(width, block_tables.shape[1])
    tables[:, :used] = block_tables[:, :used]
    # Table columns past a row's blocks may name any block: masked below like padding.
    split_idx = torch.arange(width // split_blocks, device=device)
    owned = split_idx[None, :] < num_splits[:, None]
    block_ids = tables.view(num_seqs, width // split_blocks, split_blocks)[owned].reshape(-1)
    split_rows = torch.arange(num_seqs, device=device).repeat_interleave(num_splits)
    last_splits = torch.where(num_splits > 0, torch.cumsum(num_splits, 0) - 1, -1)
    filled = lens - (num_splits - 1).clamp_min(0) * split_tokens
    token_idx = torch.arange(split_tokens, device=device)
    last_valid = token_idx[None, :] < filled[:, None]
    slots = (
        block_ids.view(-1, split_blocks)[:, token_idx // block_size] * block_size
        + token_idx % block_size
    )
    has_last = last_splits >= 0
    last = last_splits[has_last]
    slots[last] = torch.where(last_valid[has_last], slots[last], slots[last, :1])
    return DecodePlan(block_ids, split_rows, last_splits, last_valid, slots, num_seqs)


def plan_prefill(
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    context_lens: list[int],
    block_size: int,
) -> list[PrefillChunk]:
    """One ``PrefillChunk`` per non-empty chunk; lengths must satisfy
    ``seq_len == context_len + query_len``."""
    chunks: list[PrefillChunk] = []
    device = block_tables.device
    for seq_idx, (seq_len, context_len) in enumerate(zip(seq_lens, context_lens, strict=True)):
        start, end = query_start_loc[seq_idx], query_start_loc[seq_idx + 1]
        if end == start:
            continue
        if seq_len != context_len + end - start:
            raise ValueError(
                f"sequence {seq_idx}: seq_len {seq_len} != context_len {context_len} "
                f"+ query_len {end - start}"
            )
        num_blocks = -(-seq_len // block_size)
        if num_blocks > block_tables.shape[1]:
            raise ValueError(
                f"sequence {seq_idx}: {seq_len} tokens need {num_blocks} blocks, but "
                f"block_tables has {block_tables.shape[1]} columns"
            )
        mask = None
        if context_len:
            query_pos = torch.arange(context_len, seq_len, device=device)
            mask = torch.arange(seq_len, device=device)[None, :] <= query_pos[:, None]
        block_ids = block_tables[seq_idx, :num_blocks].long()
        chunks.append(PrefillChunk(start, end, block_ids, seq_len, mask))
    return chunks


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: DecodePlan | RowDecodePlan,
    scale: float,
) -> torch.Tensor:
    """q [num_seqs, num_q_heads, head_dim] over each row's cached tokens, computed in fp32.

    Flash-decoding in torch: scores and P @ V of every split in batched matmuls, then each
    row's softmax across its splits by segment max and sums, so the work follows the tokens
    cached, not the longest row times the batch. A ``RowDecodePlan`` runs row by row.
    """
    num_seqs, num_q_heads, head_dim = q.shape
    if num_seqs != plan.num_seqs:
        raise ValueError(f"q has {num_seqs} rows but the decode plan {plan.num_seqs}")
    if isinstance(plan, RowDecodePlan):
        return _decode_rows(q, k_cache, v_cache, plan, scale)
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    rows = plan.split_rows
    split_shape = (rows.shape[0], plan.last_valid.shape[1], num_kv_heads, head_dim)
    k = k_cache.index_select(0, plan.block_ids).view(split_shape).float()
    has_last = plan.last_splits >= 0
    last = plan.last_splits[has_last]
    q_splits = q.float().view(num_seqs, num_kv_heads, group, head_dim).index_select(0, rows)
    # One bmm per kv head on strided views: permuting K to heads-first would copy it all.
    scores = torch.stack(
        [torch.bmm(q_splits[:, h], k[:, :, h].transpose(1, 2)) for h in range(num_kv_heads)],
        dim=1,
    )  # [splits, kv_heads, group, split tokens]
    scores *= scale
    # Slots past a row's end (only in its last split) may hold anything, NaN included.
    invalid = ~plan.last_valid[has_last][:, None, None, :]
    scores[last] = scores[last].masked_fill(invalid, float("-inf"))
    shape = (num_seqs, num_kv_heads, group)
    split_max = scores.amax(-1)
    row_max = scores.new_full(shape, float("-inf"))
    row_max.scatter_reduce_(0, rows[:, None, None].expand_as(split_max), split_max, "amax")
    probs = torch.exp(scores - row_max.index_select(0, rows)[..., None])
    denom = scores.new_zeros(shape).index_add_(0, rows, probs.sum(-1))
    # P @ V as weighted sums of V rows read in place: one bag per (split, q head) over the
    # table of (slot, kv head) rows, so V is never gathered.
    heads = torch.arange(num_kv_heads, device=q.device)[None, :, None, None]
    value_rows = (plan.value_slots[:, None, None, :] * num_kv_heads + heads).expand(probs.shape)
    num_bags = probs.shape[0] * num_q_heads
    offsets = torch.arange(num_bags, device=q.device) * probs.shape[3]
    partial = F.embedding_bag(
        value_rows.reshape(-1),
        v_cache.view(-1, head_dim),
        offsets,
        mode="sum",
        per_sample_weights=probs.reshape(-1).to(v_cache.dtype),
    ).view(probs.shape[0], num_kv_heads, group, head_dim)
    out = scores.new_zeros((*shape, head_dim)).index_add_(0, rows, partial.float())
    # A non-empty row's denominator is >= 1 (its max scores exp(0)); an empty row's is 0.
    out = out / denom.clamp_min(1.0)[..., None]
    return out.view(num_seqs, num_q_heads, head_dim).to(q.dtype)


def _decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: RowDecodePlan,
    scale: float,
) -> torch.Tensor:
    """Each row's one query against its first ``seq_len`` gathered slots (the rest of its
    last block is sliced off unread): scores, softmax and P @ V per KV head in two batched
    matmuls over strided views (a quarter faster than SDPA's GQA path at these sizes); an
    empty row comes back zero."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    kv_shape = (-1, num_kv_heads, head_dim)
    grouped = q.float().view(num_seqs, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    out = torch.zeros_like(q)
    for row, (block_ids, seq_len) in enumerate(zip(plan.block_ids, plan.seq_lens, strict=True)):
        if not seq_len:
            continue
        k = k_cache.index_select(0, block_ids).view(kv_shape)[:seq_len].float()
        v = v_cache.index_select(0, block_ids).view(kv_shape)[:seq_len].float()
        scores = torch.bmm(grouped[row], k.permute(1, 2, 0))  # [kv heads, group, seq_len]
        scores *= scale
        attended = torch.bmm(torch.softmax(scores, -1), v.transpose(0, 1))
        out[row] = attended.view(num_q_heads, head_dim).to(q.dtype)
    return out


def paged_prefill_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunks: list[PrefillChunk],
    scale: float,
) -> torch.Tensor:
    """Packed query chunks q [num_tokens, num_q_heads, head_dim], each attending causally to
    its cached context and itself (already stored); rows in no chunk come back zero."""
    out = torch.zeros_like(q)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    for chunk in chunks:
        shape = (-1, num_kv_heads, head_dim)
        k = k_cache.index_select(0, chunk.block_ids).view(shape)[: chunk.seq_len]
        v = v_cache.index_select(0, chunk.block_ids).view(shape)[: chunk.seq_len]
        qc = q[chunk.query_start : chunk.query_end].transpose(0, 1).float()
        attended = F.scaled_dot_product_attention(
            qc[None],
            k.transpose(0, 1).float()[None],
            v.transpose(0, 1).float()[None],
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[chunk.query_start : chunk.query_end] = attended[0].transpose(0, 1).to(q.dtype)
    return out
