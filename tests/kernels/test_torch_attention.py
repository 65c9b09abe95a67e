"""The vectorised torch paged attention (the engine's CPU path) against the loop-per-sequence
references and torch SDPA, on random block tables with NaN in every slot a sequence does not
own; lengths cross the decode split boundary and end mid-block."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels.paged_attention import paged_decode_attention  # noqa: E402
from kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from kernels.reference import (  # noqa: E402
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
)
from kernels.torch_attention import (  # noqa: E402
    SPLIT_TOKENS,
    RowDecodePlan,
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    plan_decode,
    plan_prefill,
)
from tests.kernels.paged_cases import (  # noqa: E402
    assert_close,
    make_paged_case,
    random_queries,
    sdpa_attention,
)

CPU = torch.device("cpu")
# One token, mid-block ends, a whole split, one past it, and several splits.
DECODE_LENS = [1, 5, 16, 33, SPLIT_TOKENS, SPLIT_TOKENS + 1, 3 * SPLIT_TOKENS + 7]


# 0: every batch split and merged; 64: every batch row by row.
BOTH_DECODE_PATHS = pytest.mark.parametrize("max_row_seqs", [0, 64], ids=["split", "rows"])


@BOTH_DECODE_PATHS
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_decode_matches_reference_and_sdpa(group, dtype, block_size, max_row_seqs):
    dtype = getattr(torch, dtype)
    case = make_paged_case(
        DECODE_LENS, block_size=block_size, num_kv_heads=2, head_dim=32, dtype=dtype, device=CPU
    )
    q = random_queries(len(DECODE_LENS), 2 * group, 32, dtype, CPU)
    scale = 1 / math.sqrt(32)
    plan = plan_decode(case.block_tables, DECODE_LENS, block_size, max_row_seqs)
    assert isinstance(plan, RowDecodePlan) == bool(max_row_seqs)
    out = paged_decode_attention_torch(q, case.k_cache, case.v_cache, plan, scale)
    ref = paged_decode_attention_ref(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale
    )
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, ref, dtype)
    for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        assert_close(out[seq_idx], sdpa_attention(q[seq_idx : seq_idx + 1], k, v, scale)[0], dtype)


@BOTH_DECODE_PATHS
def test_decode_of_an_empty_row_and_an_empty_batch(max_row_seqs):
    case = make_paged_case(
        [0, 20], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=CPU
    )
    q = random_queries(2, 2, 16, torch.float32, CPU)
    plan = plan_decode(case.block_tables, [0, 20], 8, max_row_seqs)
    out = paged_decode_attention_torch(q, case.k_cache, case.v_cache, plan, 0.25)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(
        out[1], sdpa_attention(q[1:2], case.keys[1], case.values[1], 0.25)[0], torch.float32
    )
    empty = plan_decode(case.block_tables[:0], [], 8)
    none = paged_decode_attention_torch(q[:0], case.k_cache, case.v_cache, empty, 0.25)
    assert none.shape == (0, 2, 16)


def test_decode_plan_refuses_a_table_too_narrow_and_a_mismatched_q():
    case = make_paged_case(
        [20], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=CPU
    )
    with pytest.raises(ValueError, match="needs 5 blocks, but block_tables has 4 columns"):
        plan_decode(case.block_tables, [33], 8)
    with pytest.raises(ValueError, match="block_tables has 1 rows, seq_lens 2"):
        plan_decode(case.block_tables, [20, 3], 8)
    plan = plan_decode(case.block_tables, [20], 8)
    q = random_queries(2, 1, 16, torch.float32, CPU)
    with pytest.raises(ValueError, match="q has 2 rows but the decode plan 1"):
        paged_decode_attention_torch(q, case.k_cache, case.v_cache, plan, 0.25)


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_with_and_without_context_matches_reference_and_sdpa(group, dtype):
    dtype = getattr(torch, dtype)
    context_lens, query_lens = [0, 0, 5, 40, 9], [1, 37, 3, 24, 0]
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    case = make_paged_case(
        seq_lens, block_size=16, num_kv_heads=2, head_dim=32, dtype=dtype, device=CPU
    )
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    q = random_queries(starts[-1], 2 * group, 32, dtype, CPU)
    scale = 1 / math.sqrt(32)
    chunks = plan_prefill(case.block_tables, starts, seq_lens, context_lens, 16)
    assert len(chunks) == 4  # the empty chunk is skipped
    out = paged_prefill_attention_torch(q, case.k_cache, case.v_cache, chunks, scale)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    ref = paged_prefill_attention_ref(
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        as_int(starts),
        case.seq_lens,
        as_int(context_lens),
        scale,
    )
    assert_close(out, ref, dtype)
    for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        start, end = starts[seq_idx], starts[seq_idx + 1]
        if end > start:
            assert_close(out[start:end], sdpa_attention(q[start:end], k, v, scale), dtype)


def test_prefill_plan_refuses_inconsistent_lengths_and_narrow_tables():
    case = make_paged_case(
        [10], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=CPU
    )
    with pytest.raises(ValueError, match="sequence 0: seq_len 10 != context_len 5"):
        plan_prefill(case.block_tables, [0, 4], [10], [5], 8)
    with pytest.raises(ValueError, match="sequence 0: 30 tokens need 4 blocks"):
        plan_prefill(case.block_tables, [0, 30], [30], [0], 8)


def test_the_wrappers_torch_backend_is_this_path():
    lens = [3, 17, 150]
    case = make_paged_case(
        lens, block_size=16, num_kv_heads=2, head_dim=32, dtype=torch.float32, device=CPU
    )
    q = random_queries(len(lens), 8, 32, torch.float32, CPU)
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.2)
    out = paged_decode_attention(*args, backend="torch")
    plan = plan_decode(case.block_tables, lens, 16)
    assert torch.equal(out, paged_decode_attention_torch(q, case.k_cache, case.v_cache, plan, 0.2))
    assert_close(out, paged_decode_attention_ref(*args), torch.float32)
    starts = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    context = case.seq_lens - 1
    prefill = paged_prefill_attention(
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        starts,
        case.seq_lens,
        context,
        0.2,
        backend="torch",
    )
    # One-token chunks over their whole context are decodes.
    assert_close(prefill, out, torch.float32)
