"""SwiGLU's activation in one pass: silu(gate) * up from the fused gate/up projection's output
(vLLM's silu_and_mul), instead of a chunk, a SiLU and a multiply through memory."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import contracts

# Columns one program covers; the interpreter pays per program, so CPU gets wider ones.
GPU_BLOCK, INTERPRETER_BLOCK = 1024, 4096


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, width, stride_x, stride_out, BLOCK: tl.constexpr
):  # fmt: skip
    """One program: BLOCK columns of one row; gate is x[:, :width], up is x[:, width:]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=mask, other=0.0).to(tl.float32)
    # The SiLU is rounded to the storage dtype before the product, as torch's two ops do; the
    # fp32 product of two fp16/bf16 values is exact, so the final rounding matches too.
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for x [..., 2d], computed as the kernel rounds it."""
    gate, up = x.float().chunk(2, dim=-1)
    act = (gate * torch.sigmoid(gate)).to(x.dtype).float()
    return (act * up).to(x.dtype)


def silu_and_mul(x: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """A new [num_tokens, d] tensor silu(x[:, :d]) * x[:, d:] for x [num_tokens, 2d].

    x may have any row stride (a slice of a wider tensor) with its last dim contiguous.
    """
    device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    contracts.check_tensor("x", x, 2, contracts.KERNEL_DTYPES, device)
    contracts.check_unit_last_stride("x", x)
    if x.shape[1] % 2 != 0:
        raise ValueError(f"x must be [num_tokens, 2 * d], got odd width {x.shape[1]}")
    if contracts.resolve_backend(device, backend) == "torch":
        return silu_and_mul_ref(x)
    out = torch.empty((x.shape[0], x.shape[1] // 2), dtype=x.dtype, device=device)
    launch_silu_and_mul(x, out)
    return out


def launch_silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    """The bare launch behind `silu_and_mul`, without its checks (see rms_norm's
    launch_rms_norm): out [num_tokens, d] <- silu(x[:, :d]) * x[:, d:]."""
    num_tokens, width = out.shape
    if num_tokens == 0 or width == 0:
        return
    block = GPU_BLOCK if x.device.type == "cuda" else INTERPRETER_BLOCK
    block = min(block, triton.next_power_of_2(width))
    grid = (num_tokens, triton.cdiv(width, block))
    _silu_and_mul_kernel[grid](
        x, out, width, x.stride(0), out.stride(0), BLOCK=block, num_warps=4 if block >= 512 else 1
    )
