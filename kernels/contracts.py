"""What the kernel wrappers accept: the KV cache layout, the dtype/device/stride checks run
before every launch, and the choice between the Triton kernels and the torch references."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

BACKENDS = ("auto", "triton", "torch")
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True, slots=True)
class CacheShape:
    """The dimensions of one layer's K (or V) cache: [num_blocks, block_size, kv_heads, dim]."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int


def resolve_backend(device: torch.device | str, backend: str = "auto") -> str:
    """Return "triton" or "torch" for tensors on `device`.

    "auto" picks Triton on CUDA, and on CPU only under the Triton interpreter
    (TRITON_INTERPRET=1); elsewhere the torch references run.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    on_cuda = torch.device(device).type == "cuda"
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if backend == "torch":
        return "torch"
    if backend == "triton":
        if not (on_cuda or interpreted):
            raise ValueError(
                f"backend='triton' needs a CUDA tensor or TRITON_INTERPRET=1, got device {device}"
            )
        return "triton"
    return "triton" if on_cuda or interpreted else "torch"


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_tensor(
    name: str,
    tensor: torch.Tensor,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device,
) -> None:
    """Raise ValueError unless `tensor` has `ndim` dims, an allowed dtype and the device."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {dtypes}, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device}")


def check_unit_last_stride(name: str, tensor: torch.Tensor) -> None:
    # The kernels vectorise along head_dim, which needs consecutive elements there.
    if tensor.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dim, got {tensor.stride()}")


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> CacheShape:
    """Validate one layer's K and V caches and return their common shape."""
    device = k_cache.device if isinstance(k_cache, torch.Tensor) else torch.device("cpu")
    check_tensor("k_cache", k_cache, 4, KERNEL_DTYPES, device)
    check_tensor("v_cache", v_cache, 4, (k_cache.dtype,), device)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    check_unit_last_stride("k_cache", k_cache)
    check_unit_last_stride("v_cache", v_cache)
    shape = CacheShape(*k_cache.shape)
    if not is_power_of_two(shape.block_size):
        raise ValueError(f"block_size must be a power of two, got {shape.block_size}")
    if not is_power_of_two(shape.head_dim) or not 16 <= shape.head_dim <= 256:
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {shape.head_dim}")
    return shape


def check_queries(
    q: torch.Tensor, cache: CacheShape, device: torch.device, dtype: torch.dtype
) -> int:
    """Validate q of shape [rows, num_q_heads, head_dim] and return the GQA group size."""
    check_tensor("q", q, 3, (dtype,), device)
    check_unit_last_stride("q", q)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    if head_dim != cache.head_dim:
        raise ValueError(f"q head_dim {head_dim} != cache head_dim {cache.head_dim}")
    if num_q_heads % cache.num_kv_heads != 0:
        raise ValueError(
            f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {cache.num_kv_heads}"
        )
    return num_q_heads // cache.num_kv_heads


def check_index(
    name: str, tensor: torch.Tensor, shape: tuple[int | None, ...], device: torch.device
) -> None:
    """Validate an int32/int64 metadata tensor; None in `shape` accepts any size there.

    Contiguity is not required: the wrappers make metadata contiguous, it is small.
    """
    check_tensor(name, tensor, len(shape), INDEX_DTYPES, device)
    if any(want is not None and got != want for got, want in zip(tensor.shape, shape, strict=True)):
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs would silently use TF32 on GPU; the fp32 path exists for exactness.
    return "ieee" if dtype == torch.float32 else "tf32"
