"""silu_and_mul: the Triton kernel (interpreted on CPU) against the torch reference, the
reference against torch's SiLU and multiply, and the wrapper's checks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402

TOL = {torch.float32: 1e-6, torch.float16: 1e-3}


def gate_up(num_tokens: int, width: int, dtype: torch.dtype, pad: int = 0) -> torch.Tensor:
    """[num_tokens, 2 * width], a column slice of a wider tensor when `pad` > 0."""
    gen = torch.Generator().manual_seed(width + num_tokens)
    full = torch.randn(num_tokens, 2 * width + pad, generator=gen) * 4
    return full.to(dtype)[:, : 2 * width]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_tokens", "width", "pad"), [(1, 8, 0), (5, 333, 0), (3, 5000, 7)])
def test_silu_and_mul_matches_reference(device, dtype, num_tokens, width, pad):
    x = gate_up(num_tokens, width, dtype, pad).to(device)
    out = silu_and_mul(x, backend="triton")
    assert out.shape == (num_tokens, width) and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out, silu_and_mul_ref(x), atol=TOL[dtype], rtol=TOL[dtype])


# exp(1e4) overflows to inf on purpose: the quotient is then -0, as on the GPU.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_extreme_gates_stay_finite(device):
    x = torch.tensor([[-1e4, -80.0, 0.0, 80.0, 1.0, 1.0, 1.0, 1.0]], device=device)
    out = silu_and_mul(x, backend="triton")
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.0, 80.0]], device=device))


def test_zero_rows(device):
    assert silu_and_mul(torch.empty(0, 16, device=device), backend="triton").shape == (0, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_matches_torch_silu_times_up(dtype):
    x = gate_up(4, 40, dtype)
    gate, up = x.chunk(2, dim=-1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(silu_and_mul_ref(x), F.silu(gate) * up, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.zeros(3, 7), "odd width 7"),
        (torch.zeros(3, 8, 2), "x must have 2 dims"),
        (torch.zeros(8, 3).t(), "stride 1 in its last dim"),
        (torch.zeros(3, 8, dtype=torch.int32), "x dtype"),
    ],
)
def test_rejects_bad_input(x, message):
    with pytest.raises(ValueError, match=message):
        silu_and_mul(x, backend="torch")
