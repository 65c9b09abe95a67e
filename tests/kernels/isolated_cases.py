"""Kernel cases that could crash the interpreter (a bad address kills the process), each run by
test_isolated.py in a fresh `python -c` so a crash fails one test, not the whole suite."""

from __future__ import annotations

import math
import os
import sys

# The child process sets the interpreter itself: it may be started without the env var.
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch

from kernels.cache_ops import copy_blocks, store_kv
from kernels.paged_attention import paged_decode_attention
from kernels.prefill_attention import paged_prefill_attention
from tests.kernels.paged_cases import (
    assert_close,
    make_paged_case,
    random_queries,
    sdpa_attention,
)


def lazily_zeroed(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    # np.zeros takes fresh zero pages from the OS, so a 4 GiB cache costs only what is touched.
    return torch.from_numpy(np.zeros(shape, dtype=dtype))


def int64_offsets() -> None:
    """Blocks past element 2**31: any int32 offset product wraps and reads or writes elsewhere."""
    block_size, head_dim = 16, 64
    num_blocks = 2**31 // (block_size * head_dim) + 8
    shape = (num_blocks, block_size, 1, head_dim)
    k_cache, v_cache = lazily_zeroed(shape, np.float16), lazily_zeroed(shape, np.float16)
    high = [num_blocks - 1, num_blocks - 5, num_blocks - 3]  # deliberately out of order
    assert high[0] * block_size * head_dim > 2**31

    gen = torch.Generator().manual_seed(0)
    seq_len = 40
    k = torch.randn(seq_len, 1, head_dim, generator=gen).half()
    v = torch.randn(seq_len, 1, head_dim, generator=gen).half()
    token_idx = torch.arange(seq_len)
    slots = torch.tensor(high)[token_idx // block_size] * block_size + token_idx % block_size
    store_kv(k, v, k_cache, v_cache, slots, backend="triton")
    assert torch.equal(k_cache[high[1], 3, 0], k[19, 0]), "store_kv wrote to the wrong place"

    tables = torch.tensor([high], dtype=torch.int32)
    q = random_queries(1, 4, head_dim, torch.float16, torch.device("cpu"))
    scale = 1 / math.sqrt(head_dim)
    out = paged_decode_attention(
        q, k_cache, v_cache, tables, torch.tensor([seq_len]), scale, backend="triton", num_splits=2
    )
    assert_close(out[0], sdpa_attention(q, k, v, scale)[0], torch.float16)

    qp = random_queries(seq_len - 30, 4, head_dim, torch.float16, torch.device("cpu"))
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    out = paged_prefill_attention(
        qp,
        k_cache,
        v_cache,
        tables,
        as_int([0, 10]),
        as_int([40]),
        as_int([30]),
        scale,
        backend="triton",
    )
    assert_close(out, sdpa_attention(qp, k, v, scale), torch.float16)

    copy_blocks(k_cache, v_cache, [(high[0], high[2] + 1), (high[1], 7)], backend="triton")
    assert torch.equal(k_cache[high[2] + 1], k_cache[high[0]])
    assert torch.equal(v_cache[7], v_cache[high[1]])


def garbage_past_sequence_end() -> None:
    """Block table columns past a sequence's end hold ids far outside the cache (or -1):
    the kernels must never dereference them."""
    dtype, device = torch.float32, torch.device("cpu")
    case = make_paged_case(
        [1, 8, 21], block_size=8, num_kv_heads=2, head_dim=32, dtype=dtype, device=device
    )
    used = (case.seq_lens + 7) // 8
    for row, num_used in enumerate(used.tolist()):
        case.block_tables[row, num_used:] = 2**30 if row % 2 else -1
    q = random_queries(3, 8, 32, dtype, device)
    scale = 1 / math.sqrt(32)
    for num_splits in (1, 3):
        out = paged_decode_attention(
            q,
            case.k_cache,
            case.v_cache,
            case.block_tables,
            case.seq_lens,
            scale,
            backend="triton",
            num_splits=num_splits,
        )
        for i, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
            assert_close(out[i], sdpa_attention(q[i : i + 1], k, v, scale)[0], dtype)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    out = paged_prefill_attention(
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        as_int([0, 1, 2, 3]),
        case.seq_lens,
        case.seq_lens - 1,
        scale,
        backend="triton",
    )
    for i, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        assert_close(out[i], sdpa_attention(q[i : i + 1], k, v, scale)[0], dtype)


CASES = {f.__name__: f for f in (int64_offsets, garbage_past_sequence_end)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    print("ok")
