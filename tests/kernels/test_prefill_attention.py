"""Prefill attention over paged KV: chunks with and without cached context, against the torch
reference and torch SDPA with a bottom-right causal mask."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels.paged_attention import paged_decode_attention  # noqa: E402
from kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from kernels.reference import paged_prefill_attention_ref  # noqa: E402
from tests.kernels.paged_cases import (  # noqa: E402
    assert_close,
    make_paged_case,
    random_queries,
    sdpa_attention,
)


def chunk_metadata(context_lens: list[int], query_lens: list[int], device):
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    return as_int32(starts), as_int32(context_lens)


def check_prefill(
    device,
    context_lens,
    query_lens,
    *,
    group,
    dtype,
    block_size,
    head_dim=32,
    num_kv_heads=2,
    **kwargs,
):
    """Run the kernel and compare each chunk with SDPA over its sequence's original K/V."""
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    case = make_paged_case(
        seq_lens,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )
    query_start_loc, context = chunk_metadata(context_lens, query_lens, device)
    q = random_queries(sum(query_lens), num_kv_heads * group, head_dim, dtype, device)
    scale = 1 / math.sqrt(head_dim)
    args = (
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        query_start_loc,
        case.seq_lens,
        context,
        scale,
    )
    out = paged_prefill_attention(*args, backend="triton", **kwargs)
    assert_close(out, paged_prefill_attention_ref(*args), dtype)
    for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        start, end = query_start_loc[seq_idx].item(), query_start_loc[seq_idx + 1].item()
        assert_close(out[start:end], sdpa_attention(q[start:end], k, v, scale), dtype)
    return case, q, out


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fresh_prefill_varlen(device, group, dtype):
    # No cached context: plain causal prefill of 1, partial-block and whole-block chunks.
    check_prefill(
        device, [0, 0, 0, 0], [1, 7, 16, 37], group=group, dtype=getattr(torch, dtype), block_size=8
    )


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("block_size", [8, 16])
def test_chunked_prefill_with_cached_context(device, group, block_size):
    # Later chunks of long prompts and prefix-cache hits: context already in the cache,
    # including contexts ending mid-block and on a block boundary.
    check_prefill(
        device,
        [5, 16, 29, 48],
        [3, 20, 1, 16],
        group=group,
        dtype=torch.float16,
        block_size=block_size,
    )


@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 64)])
def test_tile_shapes_agree(device, tiles):
    # Query tiles that straddle the context/chunk boundary and key tiles wider than a chunk.
    check_prefill(
        device, [0, 11, 40], [45, 19, 9], group=2, dtype=torch.float32, block_size=8, tiles=tiles
    )


def test_head_dim_64_with_explicit_max_query_len(device):
    check_prefill(
        device,
        [10, 0],
        [6, 21],
        group=4,
        dtype=torch.float16,
        block_size=16,
        head_dim=64,
        num_kv_heads=1,
        max_query_len=21,
    )


def test_one_token_chunks_equal_decode(device):
    # A chunk of one token after its context is exactly a decode step.
    context_lens = [0, 8, 30]
    case, q, out = check_prefill(
        device, context_lens, [1, 1, 1], group=4, dtype=torch.float32, block_size=8
    )
    decode = paged_decode_attention(
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        case.seq_lens,
        1 / math.sqrt(32),
        backend="triton",
    )
    torch.testing.assert_close(out, decode, atol=1e-5, rtol=1e-5)


def test_empty_chunk_is_skipped(device):
    # A sequence scheduled with zero new tokens must not disturb its neighbours.
    check_prefill(device, [4, 9, 0], [5, 0, 3], group=1, dtype=torch.float32, block_size=8)
