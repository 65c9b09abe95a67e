"""The torch references against torch's own SDPA, so a reference bug cannot hide behind a
kernel that shares it; bf16 included (the references do not need the interpreter)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels.reference import (  # noqa: E402
    dense_attention,
    gather_kv,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
)
from tests.kernels.paged_cases import assert_close, make_paged_case, random_queries, sdpa_attention  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_and_decode_reference(dtype):
    dtype = getattr(torch, dtype)
    case = make_paged_case(
        [1, 8, 19], block_size=8, num_kv_heads=2, head_dim=16, dtype=dtype, device=CPU
    )
    for i, k in enumerate(case.keys):
        assert torch.equal(gather_kv(case.k_cache, case.block_tables[i], k.shape[0]), k)
    q = random_queries(3, 8, 16, dtype, CPU)
    out = paged_decode_attention_ref(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.25
    )
    for i, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        assert_close(out[i], sdpa_attention(q[i : i + 1], k, v, 0.25)[0], dtype)


def test_dense_attention_is_bottom_right_causal():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 2, 16, generator=gen) for n in (3, 7, 7))
    out = dense_attention(q, k, v, 0.5, causal=True)
    assert_close(out, sdpa_attention(q, k, v, 0.5), torch.float32)
    # The last query sees all 7 keys, the first only 5.
    assert_close(out[-1:], dense_attention(q[-1:], k, v, 0.5, causal=False), torch.float32)
    assert_close(out[:1], dense_attention(q[:1], k[:5], v[:5], 0.5, causal=False), torch.float32)


def test_prefill_reference_rejects_inconsistent_lengths():
    case = make_paged_case(
        [10], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=CPU
    )
    q = random_queries(4, 1, 16, torch.float32, CPU)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    with pytest.raises(ValueError, match="seq_len 10 != context_len 5"):
        paged_prefill_attention_ref(
            q,
            case.k_cache,
            case.v_cache,
            case.block_tables,
            as_int([0, 4]),
            case.seq_lens,
            as_int([5]),
            1 / math.sqrt(16),
        )
