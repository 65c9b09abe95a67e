"""Per-step attention metadata and the attention call every layer makes through ``kernels/``.

The model runner builds one ``AttentionMetadata`` per step and passes it to every layer: nothing
is module-global. A step's token rows are ordered *decodes first* (one row per decoding
sequence), then the prefill chunks, packed. ``attend`` writes the step's K/V into the paged
cache by slot mapping and then runs paged decode attention on the decode rows and paged prefill
attention on the rest. The plans are made once per step: the torch backend's gather plans when
the metadata is built, the Triton kernels' checks, split plan and scratch by the first layer's
``attend`` (``KernelLaunches``); every later layer only launches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from core.decode_split import DEFAULT_SPLIT
from kernels.contracts import check_queries, resolve_backend
from kernels.torch_attention import (
    DecodePlan,
    PrefillChunk,
    RowDecodePlan,
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    plan_decode,
    plan_prefill,
)

if TYPE_CHECKING:
    from kernels.cache_ops import StoreLaunch
    from kernels.paged_attention import DecodeLaunch
    from kernels.prefill_attention import PrefillLaunch


@dataclass(frozen=True, slots=True)
class KernelLaunches:
    """The Triton kernels of one step, checked and planned by its first layer."""

    store: StoreLaunch
    decode: DecodeLaunch | None
    prefill: PrefillLaunch | None


@dataclass(slots=True)
class AttentionMetadata:
    """What one step's attention needs to know, built once and shared by all layers.

    ``slot_mapping[i]`` is the cache slot (``block_id * block_size + offset``) of row ``i``'s
    new K/V. The first ``num_decode_tokens`` rows are decode rows: row ``i`` attends to
    ``decode_seq_lens[i]`` cached tokens (its own included) through ``decode_block_tables[i]``.
    The remaining rows are prefill chunks: chunk ``j`` is rows
    ``num_decode_tokens + prefill_query_start_loc[j] ..`` ``+ prefill_query_start_loc[j + 1]``,
    with ``prefill_context_lens[j]`` tokens already cached before it and
    ``prefill_seq_lens[j]`` after it. The last ``num_padding_tokens`` decode rows are padding
    (a CUDA graph's bucket): slot -1 and length 0, so they store nothing, read nothing and
    come back zero. ``backend`` is resolved ("triton" or "torch"); ``torch_plan`` holds the
    torch backend's gather plans; ``decode_num_splits`` fixes the decode split count (CUDA
    graphs; None lets the kernel plan choose); ``decode_split`` says how each decode shares
    its context among the splits (``core.decode_split.SPLIT_MODES``); ``launches`` is filled
    by the first ``attend``.
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
    backend: str = "torch"
    torch_plan: tuple[DecodePlan | RowDecodePlan, list[PrefillChunk]] | None = None
    num_padding_tokens: int = 0
    decode_num_splits: int | None = None
    decode_split: str = DEFAULT_SPLIT
    launches: KernelLaunches | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_seq_lens.shape[0])


@dataclass(frozen=True, slots=True)
class HostMetadata:
    """One step's metadata as host arrays (numpy), before it goes to the device."""

    slot_mapping: np.ndarray  # [num_tokens] int64
    decode_seq_lens: np.ndarray  # [num_decodes] int32
    decode_block_tables: np.ndarray  # [num_decodes, width] int32
    prefill_block_tables: np.ndarray  # [num_prefills, width] int32
    prefill_query_start_loc: np.ndarray  # [num_prefills + 1] int32
    prefill_seq_lens: np.ndarray  # [num_prefills] int32
    prefill_context_lens: np.ndarray  # [num_prefills] int32
    num_padding_tokens: int = 0


# Moves one named host array to the device (a persistent buffer's view, or a fresh tensor).
Upload = Callable[[str, np.ndarray], torch.Tensor]


def device_metadata(
    host: HostMetadata,
    upload: Upload,
    block_size: int,
    backend: str,
    decode_num_splits: int | None = None,
    max_decode_seq_len: int | None = None,
    decode_split: str = DEFAULT_SPLIT,
) -> AttentionMetadata:
    """The step's ``AttentionMetadata`` from its host arrays, each uploaded once; the torch
    backend's gather plans are made here (``backend`` must be resolved)."""
    num_decodes = len(host.decode_seq_lens)
    if max_decode_seq_len is None:
        max_decode_seq_len = int(host.decode_seq_lens.max()) if num_decodes else 0
    starts = host.prefill_query_start_loc
    query_lens = starts[1:] - starts[:-1]
    decode_tables = upload("decode_block_tables", host.decode_block_tables)
    prefill_tables = upload("prefill_block_tables", host.prefill_block_tables)
    torch_plan = None
    if backend == "torch":
        torch_plan = (
            plan_decode(decode_tables, host.decode_seq_lens.tolist(), block_size),
            plan_prefill(
                prefill_tables,
                starts.tolist(),
                host.prefill_seq_lens.tolist(),
                host.prefill_context_lens.tolist(),
                block_size,
            ),
        )
    return AttentionMetadata(
        slot_mapping=upload("slot_mapping", host.slot_mapping),
        num_decode_tokens=num_decodes,
        decode_block_tables=decode_tables,
        decode_seq_lens=upload("decode_seq_lens", host.decode_seq_lens),
        max_decode_seq_len=max_decode_seq_len,
        prefill_block_tables=prefill_tables,
        prefill_query_start_loc=upload("prefill_query_start_loc", starts),
        prefill_seq_lens=upload("prefill_seq_lens", host.prefill_seq_lens),
        prefill_context_lens=upload("prefill_context_lens", host.prefill_context_lens),
        max_prefill_query_len=int(query_lens.max()) if len(query_lens) else 0,
        backend=backend,
        torch_plan=torch_plan,
        num_padding_tokens=host.num_padding_tokens,
        decode_num_splits=decode_num_splits,
        decode_split=decode_split,
    )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
    store: bool = True,
) -> torch.Tensor:
    """Store the step's k, v [T, kv_heads, D] (unless ``store`` is False: a piecewise graph
    stored them), then attend with q [T, q_heads, D]; the result [T, q_heads, D] is written
    into ``out`` where one is given (a piecewise graph's buffer)."""
    if meta.torch_plan is not None:
        attended = _attend_torch(q, k, v, k_cache, v_cache, meta, scale, store)
        return attended if out is None else out.copy_(attended)
    launches = meta.launches
    if launches is None:
        launches = meta.launches = _plan_launches(q, k_cache, v_cache, meta, scale)
    # The Triton wrappers are imported where they are first called: importing one imports
    # triton, whose @jit reads TRITON_INTERPRET as the module loads (tests set it late).
    from kernels.cache_ops import run_store_kv
    from kernels.paged_attention import run_paged_decode
    from kernels.prefill_attention import run_paged_prefill

    if store:
        run_store_kv(launches.store, k, v, k_cache, v_cache)
    num_decode = meta.num_decode_tokens
    if launches.prefill is None:
        assert launches.decode is not None
        return run_paged_decode(launches.decode, q, k_cache, v_cache, out)
    if launches.decode is None:
        return run_paged_prefill(launches.prefill, q, k_cache, v_cache, out)
    if out is None:
        out = torch.empty_like(q)
    run_paged_decode(launches.decode, q[:num_decode], k_cache, v_cache, out[:num_decode])
    run_paged_prefill(launches.prefill, q[num_decode:], k_cache, v_cache, out[num_decode:])
    return out


def _plan_launches(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> KernelLaunches:
    """The first layer's checks and plans, which every later layer of the step reuses."""
    from kernels.cache_ops import plan_store_kv
    from kernels.paged_attention import plan_paged_decode
    from kernels.prefill_attention import plan_paged_prefill

    store = plan_store_kv(k_cache, v_cache, meta.slot_mapping, backend=meta.backend)
    check_queries(q, store.cache, k_cache.device, k_cache.dtype)
    if q.shape[0] != meta.num_tokens:
        raise ValueError(f"q has {q.shape[0]} rows but the step {meta.num_tokens}")
    decode = prefill = None
    if meta.num_decode_tokens or not meta.num_prefills:
        decode = plan_paged_decode(
            k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, q.shape[1], scale,
            max_seq_len=meta.max_decode_seq_len, num_splits=meta.decode_num_splits,
            split_mode=meta.decode_split,
        )  # fmt: skip
    if meta.num_prefills:
        prefill = plan_paged_prefill(
            k_cache, v_cache, meta.prefill_block_tables, meta.prefill_query_start_loc,
            meta.prefill_seq_lens, meta.prefill_context_lens, q.shape[1], scale,
            max_query_len=meta.max_prefill_query_len,
        )  # fmt: skip
    return KernelLaunches(store, decode, prefill)


def _attend_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    store: bool = True,
) -> torch.Tensor:
    """The torch backend on the step's plans, skipping the wrappers' per-call checks (the
    metadata was checked when it was built)."""
    assert meta.torch_plan is not None
    decode_plan, chunks = meta.torch_plan
    # Padding rows (slot -1) are the last ones: a flat index_copy_ of the others stores the K/V.
    slots = meta.slot_mapping
    if meta.num_padding_tokens:
        num_stored = meta.num_tokens - meta.num_padding_tokens
        slots, k, v = slots[:num_stored], k[:num_stored], v[:num_stored]
    if store:
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)
    num_decode = meta.num_decode_tokens
    decoded = paged_decode_attention_torch(q[:num_decode], k_cache, v_cache, decode_plan, scale)
    if not chunks:
        return decoded
    prefilled = paged_prefill_attention_torch(q[num_decode:], k_cache, v_cache, chunks, scale)
    return torch.cat((decoded, prefilled)) if num_decode else prefilled


def host_metadata(
    decode_seq_lens: list[int],
    decode_block_tables: list[list[int]],
    prefill_chunks: list[tuple[int, int]],
    prefill_block_tables: list[list[int]],
    block_size: int,
) -> HostMetadata:
    """``HostMetadata`` from plain lists: each decode row's ``seq_len`` (new token included)
    and each prefill chunk's ``(num_context_tokens, num_new_tokens)``, with their block tables.
    Slots follow from positions: a decode row writes position ``seq_len - 1``, a chunk writes
    positions ``context .. context + new - 1``."""
    slots: list[int] = []
    for seq_len, table in zip(decode_seq_lens, decode_block_tables, strict=True):
        pos = seq_len - 1
        slots.append(table[pos // block_size] * block_size + pos % block_size)
    starts = [0]
    for (context, new), table in zip(prefill_chunks, prefill_block_tables, strict=True):
        for pos in range(context, context + new):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + new)

    def table_array(tables: list[list[int]]) -> np.ndarray:
        width = max((len(t) for t in tables), default=0)
        rows = [t + [0] * (width - len(t)) for t in tables]
        return np.array(rows, dtype=np.int32).reshape(len(tables), width)

    return HostMetadata(
        slot_mapping=np.array(slots, dtype=np.int64),
        decode_seq_lens=np.array(decode_seq_lens, dtype=np.int32),
        decode_block_tables=table_array(decode_block_tables),
        prefill_block_tables=table_array(prefill_block_tables),
        prefill_query_start_loc=np.array(starts, dtype=np.int32),
        prefill_seq_lens=np.array([c + n for c, n in prefill_chunks], dtype=np.int32),
        prefill_context_lens=np.array([c for c, _ in prefill_chunks], dtype=np.int32),
    )


def build_metadata(
    decode_seq_lens: list[int],
    decode_block_tables: list[list[int]],
    prefill_chunks: list[tuple[int, int]],
    prefill_block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str,
    backend: str = "auto",
) -> AttentionMetadata:
    """Metadata from plain lists (see ``host_metadata``) on fresh device tensors: for tests,
    benchmarks and one-off passes; the model runner keeps persistent buffers instead."""
    host = host_metadata(
        decode_seq_lens, decode_block_tables, prefill_chunks, prefill_block_tables, block_size
    )

    def upload(_: str, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device)

    return device_metadata(host, upload, block_size, resolve_backend(device, backend))
