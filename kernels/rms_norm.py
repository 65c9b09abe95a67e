"""RMSNorm, alone or fused with the residual add before it (vLLM's fused_add_rms_norm): one
Triton program per token row, the row held whole in registers, statistics in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import contracts

# A program holds one row; past this the registers spill and a looped kernel would be needed.
MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr,
    hidden, eps, stride_x, stride_residual, stride_out,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program: one row. With HAS_RESIDUAL, residual <- x + residual first and the norm is
    taken of that sum; out may alias x (each row is read whole before it is written)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual_ptrs = residual_ptr + row * stride_residual + offs
        residual = tl.load(residual_ptrs, mask=mask, other=0.0).to(tl.float32)
        # Rounded to the storage dtype before the statistics, as the unfused model does.
        summed = (x + residual).to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptrs, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden
    normed = (x * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # fp16/bf16: the normalised row is rounded, then scaled by the weight (Hugging Face's
    # order); the fp32 product of two such values is exact, so one more rounding matches torch.
    out = normed.to(tl.float32) * weight
    tl.store(out_ptr + row * stride_out + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, in fp32, rounded as the kernel is."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed.to(x.dtype).float() * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) as new tensors; the sum in the inputs' dtype."""
    summed = (x.float() + residual.float()).to(residual.dtype)
    return rms_norm_ref(summed, weight, eps), summed


def _check_rows(name: str, tensor: torch.Tensor, hidden: int, weight: torch.Tensor) -> None:
    contracts.check_tensor(name, tensor, 2, (weight.dtype,), weight.device)
    contracts.check_unit_last_stride(name, tensor)
    if tensor.shape[1] != hidden:
        raise ValueError(f"{name} must be [num_tokens, {hidden}], got {tuple(tensor.shape)}")


def _check_norm(weight: torch.Tensor, eps: float) -> int:
    """Validate the norm's weight and eps and return the hidden size."""
    device = weight.device if isinstance(weight, torch.Tensor) else torch.device("cpu")
    contracts.check_tensor("weight", weight, 1, contracts.KERNEL_DTYPES, device)
    contracts.check_unit_last_stride("weight", weight)
    hidden = int(weight.shape[0])
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden size must be in [1, {MAX_HIDDEN}], got {hidden}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    return hidden


def launch_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
) -> None:
    """The bare launch behind both wrappers, without their checks, for a caller whose tensors
    are right by construction (the model: its layers' shapes never change within a step).
    With a residual: residual <- x + residual, out <- norm(residual); else out <- norm(x)."""
    if x.shape[0] == 0:
        return
    hidden = x.shape[1]
    block = triton.next_power_of_2(hidden)
    # Without a residual the kernel never touches its pointer; x stands in for it.
    residual_arg, residual_stride = (x, 0) if residual is None else (residual, residual.stride(0))
    _rms_norm_kernel[(x.shape[0],)](
        x, residual_arg, weight, out,
        hidden, float(eps), x.stride(0), residual_stride, out.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=min(16, max(1, block // 512)),
    )  # fmt: skip


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: str = "auto"
) -> torch.Tensor:
    """A new tensor: each row of x [num_tokens, hidden] normalised and scaled by weight
    [hidden]. x may have any row stride (its last dim contiguous) and weight's dtype."""
    hidden = _check_norm(weight, eps)
    _check_rows("x", x, hidden, weight)
    if contracts.resolve_backend(x.device, backend) == "torch":
        return rms_norm_ref(x, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch_rms_norm(x, None, weight, out, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place, in one pass: residual <- x + residual, then x <- rms_norm(residual) * weight.

    x and residual are [num_tokens, hidden] with any row stride (last dim contiguous), the
    weight's dtype, and must not overlap each other. Returns (x, residual).
    """
    hidden = _check_norm(weight, eps)
    _check_rows("x", x, hidden, weight)
    _check_rows("residual", residual, hidden, weight)
    if residual.shape[0] != x.shape[0]:
        raise ValueError(f"residual has {residual.shape[0]} rows but x has {x.shape[0]}")
    if contracts.resolve_backend(x.device, backend) == "torch":
        out, summed = fused_add_rms_norm_ref(x, residual, weight, eps)
        residual.copy_(summed)
        x.copy_(out)
        return x, residual
    launch_rms_norm(x, residual, weight, x, eps)
    return x, residual
