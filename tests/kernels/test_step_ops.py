"""The model's elementwise ops (``engine.model.llama.step_ops``) on the Triton backend (the fused
kernels' bare launchers, interpreted) and on the torch backend agree op by op, in fp32 and fp16,
and the rotation reads the model's one cos_sin cache (plain, linear and llama3 RoPE)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from core.model.spec import RopeScaling  # noqa: E402
from engine.model.llama import (  # noqa: E402
    RMSNorm,
    StepOps,
    TorchStepOps,
    TritonStepOps,
    cos_sin_cache,
    rope_inv_freq,
    step_ops,
)

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}
HEAD_DIM, MAX_POSITIONS = 32, 512
ROPES = {
    "plain": None,
    "linear": RopeScaling("linear", factor=2.0),
    "llama3": RopeScaling(
        "llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    ),
}


def inv_freq(rope: str) -> torch.Tensor:
    return rope_inv_freq(HEAD_DIM, 500000.0, ROPES[rope])


def both(dtype: torch.dtype, rope: str = "plain", tokens: int = 9) -> tuple[StepOps, StepOps]:
    """The same step's ops on the Triton backend and on the torch backend."""
    cache = cos_sin_cache(inv_freq(rope), MAX_POSITIONS, torch.device("cpu"), dtype)
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen)
    return step_ops(positions, cache, "triton"), step_ops(positions, cache, "torch")


def rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_norms_agree(dtype):
    fused, plain = both(dtype)
    assert isinstance(fused, TritonStepOps) and isinstance(plain, TorchStepOps)
    norm = RMSNorm(96, 1e-5, torch.device("cpu"), dtype)
    with torch.no_grad():
        norm.weight.copy_(rand(96, dtype=dtype, seed=0).abs() + 0.5)
    x, residual = rand(9, 96, dtype=dtype, seed=1), rand(9, 96, dtype=dtype, seed=2)
    tol = TOL[dtype]
    torch.testing.assert_close(fused.rms_norm(x, norm), plain.rms_norm(x, norm), atol=tol, rtol=tol)
    out_a, sum_a = fused.add_rms_norm(x.clone(), residual.clone(), norm)
    out_b, sum_b = plain.add_rms_norm(x.clone(), residual.clone(), norm)
    assert torch.equal(sum_a, sum_b)
    torch.testing.assert_close(out_a, out_b, atol=tol, rtol=tol)


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotations_agree(dtype, rope):
    fused, plain = both(dtype, rope)
    qkv = rand(9, (6 + 2 * 2) * 32, dtype=dtype, seed=4)
    qk = qkv[:, : 8 * 32].view(9, 8, 32)
    q_b, k_b = plain.rotate(qk.clone(), 6)
    q_a, k_a = fused.rotate(qk, 6)
    assert q_a.data_ptr() == qkv.data_ptr()  # rotated in place, inside the QKV output
    tol = TOL[dtype]
    torch.testing.assert_close(q_a, q_b, atol=tol, rtol=tol)
    torch.testing.assert_close(k_a, k_b, atol=tol, rtol=tol)


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_cache_rows_are_cos_then_sin_of_the_scaled_frequencies(rope):
    freqs = inv_freq(rope)
    cache = cos_sin_cache(freqs, MAX_POSITIONS, torch.device("cpu"), torch.float32)
    assert cache.shape == (MAX_POSITIONS, HEAD_DIM)
    torch.testing.assert_close(cache[300, :16], torch.cos(300 * freqs))
    torch.testing.assert_close(cache[300, 16:], torch.sin(300 * freqs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_agree(dtype):
    fused, plain = both(dtype)
    gate_up = rand(9, 160, dtype=dtype, seed=5)
    tol = TOL[dtype]
    torch.testing.assert_close(
        fused.silu_and_mul(gate_up), plain.silu_and_mul(gate_up), atol=tol, rtol=tol
    )
