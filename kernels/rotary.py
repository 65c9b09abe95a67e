"""Rotary position embedding of q and k in one launch, in place, from one precomputed cos_sin
cache (vLLM's rotary_embedding, "neox"/halves layout as Llama and Hugging Face use it).

The cache is [max_positions, head_dim]: row p holds cos(p * inv_freq) in its first half and
sin(p * inv_freq) in its second (the model builds it once: ``engine.model.llama.cos_sin_cache``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import contracts


@triton.jit
def _rotate_heads(
    base_ptr, num_heads, stride_head, half, cos, sin, offs_d, d_mask, HEADS_PAD: tl.constexpr
):  # fmt: skip
    """Rotate every head of one token in place: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    offs_h = tl.arange(0, HEADS_PAD)
    mask = (offs_h < num_heads)[:, None] & d_mask[None, :]
    ptrs = base_ptr + offs_h[:, None] * stride_head + offs_d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + half, mask=mask, other=0.0).to(tl.float32)
    dtype = base_ptr.dtype.element_ty
    tl.store(ptrs, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(ptrs + half, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rotary_embedding_kernel(
    positions_ptr, q_ptr, k_ptr, cache_ptr,
    num_q_heads, num_kv_heads, half,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head, stride_cache,
    Q_HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    """One program: every q and k head of one token, the cache row read once for both."""
    token_idx = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token_idx).to(tl.int64)
    offs_d = tl.arange(0, HALF_PAD)
    d_mask = offs_d < half
    cache_row = cache_ptr + position * stride_cache
    cos = tl.load(cache_row + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_row + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    q_base = q_ptr + token_idx * stride_q_token
    _rotate_heads(q_base, num_q_heads, stride_q_head, half, cos, sin, offs_d, d_mask, Q_HEADS_PAD)
    k_base = k_ptr + token_idx * stride_k_token
    _rotate_heads(k_base, num_kv_heads, stride_k_head, half, cos, sin, offs_d, d_mask, KV_HEADS_PAD)


def rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """New (q, k) rotated by the cache rows of `positions`, in fp32, rounded once."""
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def _check_heads(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    contracts.check_tensor(name, tensor, 3, (like.dtype,), like.device)
    contracts.check_unit_last_stride(name, tensor)
    if tensor.shape[0] != like.shape[0] or tensor.shape[2] != like.shape[2]:
        raise ValueError(
            f"{name} must be [{like.shape[0]}, heads, {like.shape[2]}], got {tuple(tensor.shape)}"
        )


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    backend: str = "auto",
) -> None:
    """Rotate q [num_tokens, num_q_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim]
    in place by the angles of their tokens' positions.

    q and k may be strided views (of one fused QKV projection, say) with their last dim
    contiguous, and must not overlap. positions [num_tokens] is int32/int64 and must lie in
    [0, max_positions): it is not range-checked on the device. The cache is
    [max_positions, head_dim] in any kernel dtype (see the module docstring).
    """
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    contracts.check_tensor("q", q, 3, contracts.KERNEL_DTYPES, device)
    contracts.check_unit_last_stride("q", q)
    _check_heads("k", k, q)
    head_dim = q.shape[2]
    if head_dim < 2 or head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even and positive, got {head_dim}")
    contracts.check_tensor("cos_sin_cache", cos_sin_cache, 2, contracts.KERNEL_DTYPES, device)
    contracts.check_unit_last_stride("cos_sin_cache", cos_sin_cache)
    if cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, {head_dim}], got {tuple(cos_sin_cache.shape)}"
        )
    contracts.check_index("positions", positions, (q.shape[0],), device)
    if contracts.resolve_backend(device, backend) == "torch":
        q_rot, k_rot = rotary_embedding_ref(positions, q, k, cos_sin_cache)
        q.copy_(q_rot)
        k.copy_(k_rot)
        return
    launch_rotary_embedding(positions, q, k, cos_sin_cache)


def launch_rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """The bare launch behind `rotary_embedding`, without its checks (see rms_norm's
    launch_rms_norm)."""
    if q.shape[0] == 0:
        return
    half = q.shape[2] // 2
    _rotary_embedding_kernel[(q.shape[0],)](
        positions.contiguous(), q, k, cos_sin_cache,
        q.shape[1], k.shape[1], half,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        Q_HEADS_PAD=triton.next_power_of_2(max(q.shape[1], 1)),
        KV_HEADS_PAD=triton.next_power_of_2(max(k.shape[1], 1)),
        HALF_PAD=triton.next_power_of_2(half), num_warps=4,
    )  # fmt: skip
