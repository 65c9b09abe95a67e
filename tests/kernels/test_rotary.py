"""Rotary embedding from one cos_sin cache: the Triton kernel (interpreted on CPU) rotating q and
k in place against the torch reference, the reference against the complex-number rotation, and
the wrapper's checks."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels.rotary import rotary_embedding, rotary_embedding_ref  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
MAX_POSITIONS = 300


def cache(head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[MAX_POSITIONS, head_dim]: cos of each position's angles, then sin (RoPE base 10000)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.arange(MAX_POSITIONS).float()[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


def fused_qkv(num_tokens, num_q_heads, num_kv_heads, head_dim, dtype, device="cpu"):
    """q, k (and v) as strided views of one projection output, as the model has them."""
    gen = torch.Generator().manual_seed(num_tokens * 31 + head_dim)
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    qkv = (torch.randn(num_tokens, width, generator=gen) * 2).to(dtype).to(device)
    q = qkv[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    k = qkv[:, num_q_heads * head_dim :][:, : num_kv_heads * head_dim]
    return qkv, q, k.view(num_tokens, num_kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim"),
    [(1, 4, 4, 16), (7, 3, 1, 80), (12, 8, 2, 128), (5, 5, 5, 6)],
)
def test_rotary_matches_reference_in_place(
    device, dtype, num_tokens, num_q_heads, num_kv_heads, head_dim
):
    qkv, q, k = fused_qkv(num_tokens, num_q_heads, num_kv_heads, head_dim, dtype, device)
    qkv_before = qkv.clone()
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, MAX_POSITIONS, (num_tokens,), generator=gen)
    positions = positions.to(torch.int32).to(device)
    cos_sin = cache(head_dim, dtype).to(device)
    expected_q, expected_k = rotary_embedding_ref(positions, q, k, cos_sin)

    rotary_embedding(positions, q, k, cos_sin, backend="triton")

    tol = TOL[dtype]
    torch.testing.assert_close(q, expected_q, atol=tol, rtol=tol)
    torch.testing.assert_close(k, expected_k, atol=tol, rtol=tol)
    v_start = (num_q_heads + num_kv_heads) * head_dim
    assert torch.equal(qkv[:, v_start:], qkv_before[:, v_start:]), "v was written"


def test_position_zero_is_the_identity(device):
    _, q, k = fused_qkv(3, 2, 1, 32, torch.float32, device)
    q_before, k_before = q.clone(), k.clone()
    positions = torch.zeros(3, dtype=torch.int64, device=device)
    rotary_embedding(positions, q, k, cache(32, torch.float32).to(device), backend="triton")
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


def test_zero_tokens(device):
    _, q, k = fused_qkv(0, 2, 1, 16, torch.float32, device)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    rotary_embedding(empty, q, k, cache(16, torch.float32).to(device), backend="triton")


def test_reference_is_a_complex_rotation():
    """Each (x[i], x[i + D/2]) pair is the complex number x * e^{i p theta_i}."""
    head_dim, position = 8, 37
    cos_sin = cache(head_dim, torch.float64)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, head_dim, generator=gen, dtype=torch.float64)
    positions = torch.tensor([position])
    q_rot, k_rot = rotary_embedding_ref(positions, q, k, cos_sin)
    theta = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    turn = torch.polar(torch.ones_like(theta), position * theta)
    for before, after in ((q, q_rot), (k, k_rot)):
        half = head_dim // 2
        expected = torch.complex(before[..., :half], before[..., half:]) * turn
        torch.testing.assert_close(after[..., :half], expected.real, atol=1e-6, rtol=0)
        torch.testing.assert_close(after[..., half:], expected.imag, atol=1e-6, rtol=0)
    # The angles are taken in fp32 (as Hugging Face takes them), then stored.
    assert math.isclose(float(cos_sin[position, 0]), math.cos(position), rel_tol=1e-6)


def test_torch_backend_rotates_in_place():
    _, q, k = fused_qkv(4, 2, 2, 16, torch.float32)
    positions = torch.tensor([0, 5, 9, 299])
    expected = rotary_embedding_ref(positions, q, k, cache(16, torch.float32))
    rotary_embedding(positions, q, k, cache(16, torch.float32), backend="torch")
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p, q, k, c: (p, q, k[:2], c), r"k must be \[4, heads, 16\]"),
        (lambda p, q, k, c: (p, q, k.half(), c), "k dtype"),
        (lambda p, q, k, c: (p, q, k, c[:, :8]), r"cos_sin_cache must be \[max_positions, 16\]"),
        (lambda p, q, k, c: (p[:3], q, k, c), "positions must have shape"),
        (lambda p, q, k, c: (p.float(), q, k, c), "positions dtype"),
        (lambda p, q, k, c: (p, q[..., :15], k[..., :15], c), "head_dim must be even"),
    ],
)
def test_rejects_bad_input(change, message):
    _, q, k = fused_qkv(4, 2, 2, 16, torch.float32)
    args = change(torch.arange(4), q, k, cache(16, torch.float32))
    with pytest.raises(ValueError, match=message):
        rotary_embedding(*args, backend="torch")
