"""Per-step attention metadata and the attention call every layer makes through ``kernels/``.

The model runner builds one ``AttentionMetadata`` per step and passes it to every layer: nothing
is module-global. A step's token rows are ordered *decodes first* (one row per decoding
sequence), then the prefill chunks, packed. ``attend`` writes the step's K/V into the paged
cache by slot mapping and then runs paged decode attention on the decode rows and paged prefill
attention on the rest. On the torch backend the gather plans (block ids, masks) are built here,
once per step, and every layer reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.contracts import resolve_backend
from kernels.torch_attention import (
    DecodePlan,
    PrefillChunk,
    RowDecodePlan,
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    plan_decode,
    plan_prefill,
)


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """What one step's attention needs to know, built once and shared by all layers.

    ``slot_mapping[i]`` is the cache slot (``block_id * block_size + offset``) of row ``i``'s
    new K/V. The first ``num_decode_tokens`` rows are decode rows: row ``i`` attends to
    ``decode_seq_lens[i]`` cached tokens (its own included) through ``decode_block_tables[i]``.
    The remaining rows are prefill chunks: chunk ``j`` is rows
    ``num_decode_tokens + prefill_query_start_loc[j] ..`` ``+ prefill_query_start_loc[j + 1]``,
    with ``prefill_context_lens[j]`` tokens already cached before it and
    ``prefill_seq_lens[j]`` after it. ``torch_plan`` holds the torch backend's gather plans
    (None on Triton).
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32
    decode_seq_lens: torch.Tensor  # [num_decodes] int32
    max_decode_seq_len: int
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [num_prefills + 1] int32, from 0
    prefill_seq_lens: torch.Tensor  # [num_prefills] int32
    prefill_context_lens: torch.Tensor  # [num_prefills] int32
    max_prefill_query_len: int
    backend: str = "auto"
    torch_plan: tuple[DecodePlan | RowDecodePlan, list[PrefillChunk]] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_seq_lens.shape[0])


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Store the step's k, v [T, kv_heads, D], then attend with q [T, q_heads, D]."""
    if meta.torch_plan is not None:
        return _attend_torch(q, k, v, k_cache, v_cache, meta, scale)
    # The Triton wrappers are imported where they are first called: importing one imports
    # triton, whose @jit reads TRITON_INTERPRET as the module loads (tests set it late).
    from kernels.cache_ops import store_kv

    store_kv(k, v, k_cache, v_cache, meta.slot_mapping, backend=meta.backend)
    num_decode = meta.num_decode_tokens
    if meta.num_prefills == 0:
        return _decode(q, k_cache, v_cache, meta, scale)
    if num_decode == 0:
        return _prefill(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    out[:num_decode] = _decode(q[:num_decode], k_cache, v_cache, meta, scale)
    out[num_decode:] = _prefill(q[num_decode:], k_cache, v_cache, meta, scale)
    return out


def _attend_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """The torch backend on the step's plans, skipping the wrappers' per-call checks (the
    metadata was checked when it was built)."""
    assert meta.torch_plan is not None
    decode_plan, chunks = meta.torch_plan
    # The slot mapping of a step has no -1 padding, so a flat index_copy_ stores the K/V.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping, v)
    num_decode = meta.num_decode_tokens
    decoded = paged_decode_attention_torch(q[:num_decode], k_cache, v_cache, decode_plan, scale)
    if not chunks:
        return decoded
    prefilled = paged_prefill_attention_torch(q[num_decode:], k_cache, v_cache, chunks, scale)
    return torch.cat((decoded, prefilled)) if num_decode else prefilled


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    from kernels.paged_attention import paged_decode_attention

    out: torch.Tensor = paged_decode_attention(
        q,
        k_cache,
        v_cache,
        meta.decode_block_tables,
        meta.decode_seq_lens,
        scale,
        backend=meta.backend,
        max_seq_len=meta.max_decode_seq_len,
    )
    return out


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    from kernels.prefill_attention import paged_prefill_attention

    out: torch.Tensor = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        meta.prefill_block_tables,
        meta.prefill_query_start_loc,
        meta.prefill_seq_lens,
        meta.prefill_context_lens,
        scale,
        backend=meta.backend,
        max_query_len=meta.max_prefill_query_len,
    )
    return out


def build_metadata(
    decode_seq_lens: list[int],
    decode_block_tables: list[list[int]],
    prefill_chunks: list[tuple[int, int]],
    prefill_block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str,
    backend: str = "auto",
) -> AttentionMetadata:
    """Metadata from plain lists: each decode row's ``seq_len`` (new token included) and each
    prefill chunk's ``(num_context_tokens, num_new_tokens)``, with their block tables.

    Slots follow from positions: a decode row writes position ``seq_len - 1``, a chunk writes
    positions ``context .. context + new - 1``.
    """
    slots: list[int] = []
    for seq_len, table in zip(decode_seq_lens, decode_block_tables, strict=True):
        pos = seq_len - 1
        slots.append(table[pos // block_size] * block_size + pos % block_size)
    starts = [0]
    for (context, new), table in zip(prefill_chunks, prefill_block_tables, strict=True):
        for pos in range(context, context + new):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + new)

    def table_tensor(tables: list[list[int]]) -> torch.Tensor:
        width = max((len(t) for t in tables), default=0)
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(tables), width)

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    decode_tables = table_tensor(decode_block_tables)
    prefill_tables = table_tensor(prefill_block_tables)
    prefill_seq_lens = [c + n for c, n in prefill_chunks]
    prefill_context_lens = [c for c, _ in prefill_chunks]
    torch_plan = None
    if resolve_backend(device, backend) == "torch":
        torch_plan = (
            plan_decode(decode_tables, decode_seq_lens, block_size),
            plan_prefill(
                prefill_tables, starts, prefill_seq_lens, prefill_context_lens, block_size
            ),
        )
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        num_decode_tokens=len(decode_seq_lens),
        decode_block_tables=decode_tables,
        decode_seq_lens=ints(decode_seq_lens),
        max_decode_seq_len=max(decode_seq_lens, default=0),
        prefill_block_tables=prefill_tables,
        prefill_query_start_loc=ints(starts),
        prefill_seq_lens=ints(prefill_seq_lens),
        prefill_context_lens=ints(prefill_context_lens),
        max_prefill_query_len=max((n for _, n in prefill_chunks), default=0),
        backend=backend,
        torch_plan=torch_plan,
    )
