"""KV cache writes: store a step's new K/V into their slots (one launch per layer, checked
once per step with ``plan_store_kv``), and copy blocks for copy-on-write (one launch for one
layer, or for every layer of a stacked cache)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import contracts
from kernels.reference import copy_blocks_ref, store_kv_ref

# Elements one copy_blocks program moves per cache (16 KiB of fp32, 8 KiB of fp16).
COPY_CHUNK_ELEMENTS = 4096


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    num_kv_heads,
    stride_k_token, stride_k_head, stride_v_token, stride_v_head,
    stride_kc_block, stride_kc_token, stride_kc_head,
    stride_vc_block, stride_vc_token, stride_vc_head,
    HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """One program: all kv heads of one token, K and V; slot -1 writes nothing."""
    token_idx = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token_idx).to(tl.int64)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (slot >= 0) & (offs_h < num_kv_heads)[:, None]
    # Clamp so a skipped token's (masked) addresses stay inside the cache anyway.
    slot = tl.maximum(slot, 0)
    block_id = slot // BLOCK_SIZE
    block_offset = slot % BLOCK_SIZE

    k = tl.load(
        k_ptr + token_idx * stride_k_token + offs_h[:, None] * stride_k_head + offs_d[None, :],
        mask=mask,
    )
    kc_row = block_id * stride_kc_block + block_offset * stride_kc_token
    kc_ptrs = k_cache_ptr + kc_row + offs_h[:, None] * stride_kc_head + offs_d[None, :]
    tl.store(kc_ptrs, k, mask=mask)

    v = tl.load(
        v_ptr + token_idx * stride_v_token + offs_h[:, None] * stride_v_head + offs_d[None, :],
        mask=mask,
    )
    vc_row = block_id * stride_vc_block + block_offset * stride_vc_token
    vc_ptrs = v_cache_ptr + vc_row + offs_h[:, None] * stride_vc_head + offs_d[None, :]
    tl.store(vc_ptrs, v, mask=mask)


@triton.jit
def _copy_blocks_kernel(
    k_cache_ptr, v_cache_ptr, pairs_ptr, block_elements, stride_k_block, stride_v_block,
    stride_k_layer, stride_v_layer,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """One program: one CHUNK-element slice of one (src, dst) pair of one layer, in K and V."""
    pair_idx = tl.program_id(0).to(tl.int64)
    chunk_idx = tl.program_id(1).to(tl.int64)
    layer_idx = tl.program_id(2).to(tl.int64)
    src = tl.load(pairs_ptr + 2 * pair_idx).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair_idx + 1).to(tl.int64)
    offs = chunk_idx * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_elements
    k_base = k_cache_ptr + layer_idx * stride_k_layer
    v_base = v_cache_ptr + layer_idx * stride_v_layer
    k = tl.load(k_base + src * stride_k_block + offs, mask=mask)
    tl.store(k_base + dst * stride_k_block + offs, k, mask=mask)
    v = tl.load(v_base + src * stride_v_block + offs, mask=mask)
    tl.store(v_base + dst * stride_v_block + offs, v, mask=mask)


@dataclass(frozen=True, slots=True)
class StoreLaunch:
    """``store_kv`` checked and planned once for a step: every layer's call with k, v of
    ``[num_tokens, num_kv_heads, head_dim]`` into caches shaped as ``cache``."""

    slot_mapping: torch.Tensor
    cache: contracts.CacheShape
    backend: str


def plan_store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str = "auto",
) -> StoreLaunch:
    """Check one layer's caches and the step's slot mapping once; ``run_store_kv`` then
    stores any layer of the same shape without checking again."""
    cache = contracts.check_kv_cache(k_cache, v_cache)
    contracts.check_index("slot_mapping", slot_mapping, (None,), k_cache.device)
    resolved = contracts.resolve_backend(k_cache.device, backend)
    return StoreLaunch(slot_mapping.contiguous(), cache, resolved)


def run_store_kv(
    launch: StoreLaunch,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> None:
    """``store_kv`` as planned: k, v and the caches must have the planned shapes, dtype and
    device (unchecked), k and v a unit last stride."""
    if launch.backend == "torch":
        store_kv_ref(k, v, k_cache, v_cache, launch.slot_mapping)
        return
    if k.shape[0] == 0:
        return
    cache = launch.cache
    _store_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, launch.slot_mapping,
        cache.num_kv_heads,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEADS_PAD=triton.next_power_of_2(cache.num_kv_heads), HEAD_DIM=cache.head_dim,
        BLOCK_SIZE=cache.block_size, num_warps=4,
    )  # fmt: skip


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str = "auto",
) -> None:
    """Write k, v [num_tokens, num_kv_heads, head_dim] into their slots, in place.

    slot_mapping [num_tokens] holds block_id * block_size + offset, or -1 to skip a token
    (padding). Slots are not range-checked on the device.
    """
    launch = plan_store_kv(k_cache, v_cache, slot_mapping, backend=backend)
    cache = launch.cache
    for name, tensor in (("k", k), ("v", v)):
        contracts.check_tensor(name, tensor, 3, (k_cache.dtype,), k_cache.device)
        contracts.check_unit_last_stride(name, tensor)
        if tuple(tensor.shape[1:]) != (cache.num_kv_heads, cache.head_dim):
            raise ValueError(
                f"{name} must be [num_tokens, {cache.num_kv_heads}, {cache.head_dim}], "
                f"got {tuple(tensor.shape)}"
            )
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k has {k.shape[0]} tokens but v has {v.shape[0]}")
    contracts.check_index("slot_mapping", slot_mapping, (k.shape[0],), k_cache.device)
    run_store_kv(launch, k, v, k_cache, v_cache)


def copy_blocks(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pairs: torch.Tensor | Sequence[tuple[int, int]],
    *,
    backend: str = "auto",
) -> None:
    """Copy block src onto block dst in both caches for every (src, dst) pair, in place.

    `pairs` is [num_pairs, 2] int32/int64 (or a list of pairs, moved to the cache's device).
    A dst must not also be a src in the same call: the copies run concurrently.
    """
    contracts.check_kv_cache(k_cache, v_cache)
    copy_blocks_all_layers(k_cache[None], v_cache[None], pairs, backend=backend)


def copy_blocks_all_layers(
    k_caches: torch.Tensor,
    v_caches: torch.Tensor,
    pairs: torch.Tensor | Sequence[tuple[int, int]],
    *,
    backend: str = "auto",
) -> None:
    """``copy_blocks`` for every layer at once, in one launch: k_caches and v_caches are
    [num_layers, num_blocks, block_size, num_kv_heads, head_dim] (a stacked cache's K and V
    halves); each pair is copied in every layer."""
    for name, tensor in (("k_caches", k_caches), ("v_caches", v_caches)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 5:
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
            raise ValueError(f"{name} must be a 5-D tensor [layers, blocks, ...], got {shape}")
    if k_caches.shape[0] != v_caches.shape[0]:
        raise ValueError(f"{k_caches.shape[0]} K layers but {v_caches.shape[0]} V layers")
    cache = contracts.check_kv_cache(k_caches[0], v_caches[0])
    if not isinstance(pairs, torch.Tensor):
        pairs = torch.as_tensor(list(pairs), dtype=torch.int64).reshape(-1, 2).to(k_caches.device)
    contracts.check_index("pairs", pairs, (None, 2), k_caches.device)
    for name, tensor in (("k_caches", k_caches), ("v_caches", v_caches)):
        # Each block is copied as one flat run of elements, so it must be contiguous inside.
        if cache.num_blocks and not tensor[0, 0:1].is_contiguous():
            raise ValueError(f"{name} blocks must be contiguous inside, got {tensor.stride()}")
    if contracts.resolve_backend(k_caches.device, backend) == "torch":
        # Blocks first, layers second: the reference copies whole [layers, ...] blocks.
        copy_blocks_ref(k_caches.transpose(0, 1), v_caches.transpose(0, 1), pairs)
        return
    if pairs.shape[0] == 0:
        return
    block_elements = cache.block_size * cache.num_kv_heads * cache.head_dim
    grid = (pairs.shape[0], triton.cdiv(block_elements, COPY_CHUNK_ELEMENTS), k_caches.shape[0])
    _copy_blocks_kernel[grid](
        k_caches, v_caches, pairs.contiguous(), block_elements,
        k_caches.stride(1), v_caches.stride(1), k_caches.stride(0), v_caches.stride(0),
        CHUNK=COPY_CHUNK_ELEMENTS, num_warps=4,
    )  # fmt: skip
