"""RMSNorm and add+RMSNorm: the Triton kernel (interpreted on CPU) against the torch reference,
the reference against torch's own rms_norm, and the wrapper's in-place contract and checks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels.rms_norm import (  # noqa: E402
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)

EPS = 1e-5
# One fp16 ulp near the outputs' magnitude (O(1)): the kernel and the reference round alike but
# sum the squares in a different order.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def rows(num_tokens, hidden, dtype, seed, width=0, device="cpu"):  # -> torch.Tensor
    """[num_tokens, hidden]; with `width` > hidden, a column slice of a wider tensor (strided)."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(num_tokens, max(width, hidden), generator=gen) * 3
    return full.to(dtype).to(device)[:, :hidden]


def weight(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(99)
    return (torch.rand(hidden, generator=gen) + 0.5).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_tokens", "hidden"), [(1, 64), (7, 100), (33, 4096), (5, 1)])
def test_rms_norm_matches_reference(device, dtype, num_tokens, hidden):
    x = rows(num_tokens, hidden, dtype, seed=hidden, device=device)
    w = weight(hidden, dtype).to(device)
    out = rms_norm(x, w, EPS, backend="triton")
    assert out.shape == x.shape and out.dtype == dtype
    tol = TOL[dtype]
    torch.testing.assert_close(out, rms_norm_ref(x, w, EPS), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_tokens", "hidden", "width"), [(3, 64, 64), (9, 96, 160), (4, 33, 48)]
)
def test_fused_add_updates_residual_and_x_in_place(device, dtype, num_tokens, hidden, width):
    x = rows(num_tokens, hidden, dtype, seed=1, width=width, device=device)
    residual = rows(num_tokens, hidden, dtype, seed=2, width=width + 16, device=device)
    w = weight(hidden, dtype).to(device)
    expected_out, expected_sum = fused_add_rms_norm_ref(x, residual, w, EPS)
    x_ptr, residual_ptr = x.data_ptr(), residual.data_ptr()
    parents = x._base, residual._base  # the wider tensors: columns past `hidden` untouched
    before = [p[:, hidden:].clone() for p in parents]

    out, summed = fused_add_rms_norm(x, residual, w, EPS, backend="triton")

    assert out.data_ptr() == x_ptr and summed.data_ptr() == residual_ptr
    # The sum is one rounding of an exact fp32 add in both: equal to the bit.
    assert torch.equal(residual, expected_sum)
    torch.testing.assert_close(x, expected_out, atol=TOL[dtype], rtol=TOL[dtype])
    for parent, kept in zip(parents, before, strict=True):
        assert torch.equal(parent[:, hidden:], kept)


def test_zero_rows_are_a_no_op(device):
    x = torch.empty(0, 64, device=device)
    w = weight(64, torch.float32).to(device)
    assert rms_norm(x, w, EPS, backend="triton").shape == (0, 64)
    out, summed = fused_add_rms_norm(x, x.clone(), w, EPS, backend="triton")
    assert out.shape == summed.shape == (0, 64)


def test_torch_backend_keeps_the_in_place_contract():
    x, residual = rows(5, 48, torch.float32, 3), rows(5, 48, torch.float32, 4)
    w = weight(48, torch.float32)
    expected_out, expected_sum = fused_add_rms_norm_ref(x, residual, w, EPS)
    out, summed = fused_add_rms_norm(x, residual, w, EPS, backend="torch")
    assert out is x and summed is residual
    assert torch.equal(x, expected_out) and torch.equal(residual, expected_sum)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_matches_torch_rms_norm(dtype):
    x, w = rows(6, 80, dtype, 5), weight(80, dtype)
    expected = rms_norm_as_hugging_face(x, w)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(rms_norm_ref(x, w, EPS), expected, atol=tol, rtol=tol)


def rms_norm_as_hugging_face(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    normed = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=EPS)
    return w * normed.to(x.dtype)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x, r, w: (x.half(), r, w), "x dtype"),
        (lambda x, r, w: (x, r[:3], w), "residual has 3 rows"),
        (lambda x, r, w: (x, r, w[:10]), r"x must be \[num_tokens, 10\]"),
        (lambda x, r, w: (x.t().contiguous().t(), r, w), "stride 1 in its last dim"),
        (lambda x, r, w: (x[None], r, w), "x must have 2 dims"),
    ],
)
def test_fused_add_rejects_bad_input(change, message):
    x, r, w = change(
        rows(4, 16, torch.float32, 0), rows(4, 16, torch.float32, 1), weight(16, torch.float32)
    )
    with pytest.raises(ValueError, match=message):
        fused_add_rms_norm(x, r, w, EPS, backend="torch")


@pytest.mark.parametrize("eps", [0.0, -1.0, True, "1e-5"])
def test_rejects_bad_eps(eps):
    with pytest.raises(ValueError, match="eps must be a positive number"):
        rms_norm(rows(2, 8, torch.float32, 0), weight(8, torch.float32), eps)
