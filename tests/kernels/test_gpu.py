"""Compiled kernels on a CUDA device at real shapes, bf16 included (run with
TRITON_INTERPRET=0 python -m pytest -m gpu tests/kernels)."""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

from kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from kernels.cache_ops import copy_blocks, store_kv  # noqa: E402
from kernels.paged_attention import paged_decode_attention  # noqa: E402
from kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from kernels.reference import (  # noqa: E402
    copy_blocks_ref,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    store_kv_ref,
)
from kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref  # noqa: E402
from kernels.rotary import rotary_embedding, rotary_embedding_ref  # noqa: E402
from tests.kernels.paged_cases import assert_close, make_paged_case, random_queries  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs CUDA and TRITON_INTERPRET=0",
    ),
]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("block_size", [8, 16, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_and_prefill_on_gpu(dtype, head_dim, block_size, group):
    dtype = getattr(torch, dtype)
    context_lens, query_lens = [0, 37, 256, 1000], [1, 200, 64, 300]
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    case = make_paged_case(
        seq_lens, block_size=block_size, num_kv_heads=2, head_dim=head_dim, dtype=dtype, device=CUDA
    )
    scale = 1 / math.sqrt(head_dim)
    q = random_queries(len(seq_lens), 2 * group, head_dim, dtype, CUDA)
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale)
    assert_close(paged_decode_attention(*args), paged_decode_attention_ref(*args), dtype)
    for num_splits in (1, 5):
        for split_mode in ("per_sequence", "fixed"):
            out = paged_decode_attention(*args, num_splits=num_splits, split_mode=split_mode)
            assert_close(out, paged_decode_attention_ref(*args), dtype)

    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    qp = random_queries(starts[-1], 2 * group, head_dim, dtype, CUDA)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=CUDA)  # noqa: E731
    args = (
        qp,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        as_int(starts),
        case.seq_lens,
        as_int(context_lens),
        scale,
    )
    assert_close(paged_prefill_attention(*args), paged_prefill_attention_ref(*args), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cache_ops_on_gpu(dtype):
    dtype = getattr(torch, dtype)
    shape = (64, 16, 8, 128)
    k_cache = torch.randn(shape, device=CUDA).to(dtype)
    v_cache = torch.randn(shape, device=CUDA).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    k, v = torch.randn(2, 100, 8, 128, device=CUDA).to(dtype).unbind(0)
    slots = torch.randperm(64 * 16, device=CUDA)[:100]
    slots[::7] = -1
    store_kv(k, v, k_cache, v_cache, slots)
    store_kv_ref(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    pairs = [(1, 40), (2, 41), (63, 0)]
    copy_blocks(k_cache, v_cache, pairs)
    copy_blocks_ref(k_ref, v_ref, pairs)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("num_tokens", [1, 37, 4096])
def test_fused_elementwise_on_gpu(dtype, num_tokens):
    """Llama-3-8B widths, q/k as views of one QKV output, compiled; one output ulp allowed."""
    dtype = getattr(torch, dtype)
    hidden, inter, heads, kv_heads, head_dim = 4096, 14336, 32, 8, 128

    def rand(*shape):
        return torch.randn(*shape, device=CUDA).to(dtype)

    x, residual, weight = rand(num_tokens, hidden), rand(num_tokens, hidden), rand(hidden)
    out_ref, sum_ref = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    fused_add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, sum_ref)
    assert_close(x, out_ref, dtype)

    gate_up = rand(num_tokens, 2 * inter)
    assert_close(silu_and_mul(gate_up), silu_and_mul_ref(gate_up), dtype)

    qkv = rand(num_tokens, (heads + 2 * kv_heads) * head_dim)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
    q, k = qk[:, :heads], qk[:, heads:]
    cos_sin = rand(8192, head_dim).clamp(-1, 1)
    positions = torch.randint(0, 8192, (num_tokens,), device=CUDA)
    q_ref, k_ref = rotary_embedding_ref(positions, q, k, cos_sin)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    rotary_embedding(positions, q, k, cos_sin)
    assert_close(q, q_ref, dtype)
    assert_close(k, k_ref, dtype)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)
