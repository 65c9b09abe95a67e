"""store_kv and copy_blocks against their references and against the slots they must touch,
and one step end to end: store a chunk's K/V, then attend to them."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels.cache_ops import (  # noqa: E402
    copy_blocks,
    copy_blocks_all_layers,
    plan_store_kv,
    run_store_kv,
    store_kv,
)
from kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from kernels.reference import copy_blocks_ref, store_kv_ref  # noqa: E402
from tests.kernels.paged_cases import assert_close, sdpa_attention  # noqa: E402


def nan_caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    return k_cache, k_cache.clone()


def same(a, b) -> bool:
    """Equal including NaN positions."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        a.nan_to_num(), b.nan_to_num()
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("num_kv_heads", [1, 3])
def test_store_kv_writes_exactly_its_slots(device, dtype, num_kv_heads):
    dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    block_size, head_dim, num_tokens = 8, 16, 21
    k_cache, v_cache = nan_caches(6, block_size, num_kv_heads, head_dim, dtype, device)
    # K and V as strided views of one fused projection, as a model produces them.
    kv = torch.randn(num_tokens, 2, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.randperm(6 * block_size, generator=gen)[:num_tokens].to(device)
    slots[[0, 7, 20]] = -1  # padding tokens
    store_kv(k, v, k_cache, v_cache, slots, backend="triton")

    k_ref, v_ref = nan_caches(6, block_size, num_kv_heads, head_dim, dtype, device)
    store_kv_ref(k, v, k_ref, v_ref, slots)
    assert same(k_cache, k_ref) and same(v_cache, v_ref)
    written = slots[slots >= 0]
    assert int((~torch.isnan(k_cache.view(-1, num_kv_heads, head_dim)[:, 0, 0])).sum()) == len(
        written
    )
    block, offset = slots[5] // block_size, slots[5] % block_size
    assert torch.equal(k_cache[block, offset], k[5]) and torch.equal(v_cache[block, offset], v[5])


def test_store_kv_all_skipped_leaves_cache_untouched(device):
    k_cache, v_cache = nan_caches(2, 8, 1, 16, torch.float32, device)
    k = torch.ones(4, 1, 16, device=device)
    store_kv(k, k, k_cache, v_cache, torch.full((4,), -1, device=device), backend="triton")
    assert torch.isnan(k_cache).all() and torch.isnan(v_cache).all()


@pytest.mark.parametrize("as_list", [False, True])
def test_copy_blocks_matches_reference(device, as_list):
    gen = torch.Generator().manual_seed(1)
    # 16 x 4 x 64 = 4096 elements per block: exactly one copy chunk, plus a second shape below.
    for shape in ((8, 16, 4, 64), (5, 8, 3, 32)):
        k_cache = torch.randn(*shape, generator=gen).to(device)
        v_cache = torch.randn(*shape, generator=gen).to(device)
        pairs_list = [(0, 3), (2, 4), (1, 1)]
        pairs = (
            pairs_list if as_list else torch.tensor(pairs_list, dtype=torch.int32, device=device)
        )
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        copy_blocks(k_cache, v_cache, pairs, backend="triton")
        copy_blocks_ref(k_ref, v_ref, pairs_list)
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
        assert torch.equal(k_cache[3], k_cache[0]) and torch.equal(v_cache[4], v_cache[2])


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_copy_blocks_all_layers_copies_every_layer(device, backend):
    if backend == "torch" and device.type != "cpu":
        pytest.skip("the torch path is tested on CPU")
    gen = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 3, 6, 8, 2, 16, generator=gen).to(device)  # [K/V, layers, blocks, ...]
    want = kv.clone()
    pairs = [(0, 4), (2, 5)]
    for layer in range(3):
        copy_blocks_ref(want[0, layer], want[1, layer], pairs)
    copy_blocks_all_layers(kv[0], kv[1], pairs, backend=backend)
    assert torch.equal(kv, want) and torch.equal(kv[:, :, 4], kv[:, :, 0])
    with pytest.raises(ValueError, match="must be a 5-D tensor"):
        copy_blocks_all_layers(kv[0, 0], kv[1, 0], pairs, backend=backend)


def test_a_planned_store_equals_the_checked_one(device):
    gen = torch.Generator().manual_seed(4)
    k_cache, v_cache = nan_caches(4, 8, 2, 16, torch.float32, device)
    k_ref, v_ref = nan_caches(4, 8, 2, 16, torch.float32, device)
    slots = torch.tensor([3, -1, 17, 30], device=device)
    launch = plan_store_kv(k_cache, v_cache, slots, backend="triton")
    for _ in range(2):  # two layers' worth of calls on one plan
        k, v = (torch.randn(4, 2, 16, generator=gen).to(device) for _ in "kv")
        run_store_kv(launch, k, v, k_cache, v_cache)
        store_kv(k, v, k_ref, v_ref, slots, backend="triton")
        assert same(k_cache, k_ref) and same(v_cache, v_ref)


def test_copy_blocks_without_pairs_is_a_no_op(device):
    k_cache = torch.randn(3, 8, 1, 16, device=device)
    before = k_cache.clone()
    copy_blocks(k_cache, k_cache, [], backend="triton")
    assert torch.equal(k_cache, before)


def test_store_then_prefill_one_step(device):
    # A step of two prompts: the second continues after 10 tokens already cached.
    gen = torch.Generator().manual_seed(2)
    block_size, num_kv_heads, head_dim, group = 8, 2, 32, 4
    k_cache, v_cache = nan_caches(8, block_size, num_kv_heads, head_dim, torch.float32, device)
    block_tables = torch.tensor([[5, 1, 7], [2, 0, 6]], dtype=torch.int32, device=device)
    old_k, old_v = (torch.randn(10, num_kv_heads, head_dim, generator=gen).to(device) for _ in "kv")
    old_slots = torch.tensor([2 * 8 + i for i in range(8)] + [0, 1], device=device)
    store_kv(old_k, old_v, k_cache, v_cache, old_slots, backend="triton")

    context_lens = [0, 10]  # chunks of 12 and 7 new tokens
    new_k, new_v = (torch.randn(19, num_kv_heads, head_dim, generator=gen).to(device) for _ in "kv")

    def slot_of(seq_idx: int, pos: int) -> int:
        return int(block_tables[seq_idx, pos // block_size]) * block_size + pos % block_size

    new_slots = [slot_of(0, p) for p in range(12)] + [slot_of(1, 10 + p) for p in range(7)]
    store_kv(
        new_k, new_v, k_cache, v_cache, torch.tensor(new_slots, device=device), backend="triton"
    )

    q = torch.randn(19, num_kv_heads * group, head_dim, generator=gen).to(device)
    as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    out = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        as_int32([0, 12, 19]),
        as_int32([12, 17]),
        as_int32(context_lens),
        1 / math.sqrt(head_dim),
        backend="triton",
    )
    scale = 1 / math.sqrt(head_dim)
    assert_close(out[:12], sdpa_attention(q[:12], new_k[:12], new_v[:12], scale), torch.float32)
    k1, v1 = torch.cat([old_k, new_k[12:]]), torch.cat([old_v, new_v[12:]])
    assert_close(out[12:], sdpa_attention(q[12:], k1, v1, scale), torch.float32)
