"""The KV cache as one stacked tensor: every layer a view of it, and a step's swaps and
copy-on-write copies moving every layer at once, in as many operations for 2 layers as for 6,
in the order the core's decisions require (swap-out, swap-in, copies)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from engine.kv_cache import KVCache  # noqa: E402


def _cache(num_layers: int = 3, num_cpu_blocks: int = 4) -> KVCache:
    # (the torch path: under TRITON_INTERPRET=1 "auto" would count the interpreter's own ops)
    cache = KVCache.allocate(
        num_layers, 10, 4, 2, 16, torch.float32, "cpu", num_cpu_blocks, backend="torch"
    )
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(0)))
    return cache


def test_every_layer_is_a_view_of_one_tensor() -> None:
    cache = _cache()
    base = cache.kv.data_ptr()
    size = cache.kv.numel() * cache.kv.element_size()
    assert len(cache.layers) == 3
    for k, v in cache.layers:
        assert k.shape == v.shape == (10, 4, 2, 16) and k.is_contiguous() and v.is_contiguous()
        assert base <= k.data_ptr() < base + size and base <= v.data_ptr() < base + size
    k0, _ = cache.layers[0]
    k0[5, 1] = 42.0
    assert bool((cache.kv[0, 0, 5, 1] == 42.0).all())
    assert cache.cpu_layers[2][1].shape == (4, 4, 2, 16)
    assert KVCache.bytes_per_block(3, 4, 2, 16, torch.float32) == 2 * 3 * 4 * 2 * 16 * 4


def test_moves_apply_in_order_to_every_layer() -> None:
    cache = _cache()
    original = cache.kv.clone()
    cache.apply(swap_out=[(3, 0), (5, 1)], swap_in=[], copies=[])
    assert torch.equal(cache.cpu[:, :, 0], original[:, :, 3])
    assert torch.equal(cache.cpu[:, :, 1], original[:, :, 5])
    # One step: block 3 goes out to host block 2, host block 0 (old block 3) comes back into
    # the freed block 3, and a copy-on-write copy then reads the swapped-in content.
    cache.apply(swap_out=[(3, 2)], swap_in=[(0, 3), (1, 7)], copies=[(3, 9), (5, 8)])
    assert torch.equal(cache.cpu[:, :, 2], original[:, :, 3])
    assert torch.equal(cache.kv[:, :, 3], original[:, :, 3])
    assert torch.equal(cache.kv[:, :, 7], original[:, :, 5])
    assert torch.equal(cache.kv[:, :, 9], original[:, :, 3])
    assert torch.equal(cache.kv[:, :, 8], original[:, :, 5])
    untouched = [b for b in range(10) if b not in (3, 7, 8, 9)]
    assert torch.equal(cache.kv[:, :, untouched], original[:, :, untouched])


class _CountOps(TorchDispatchMode):
    """Counts the operations that move data (views and fresh constants are free)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and "lift_fresh" not in str(func):
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("move", ["swap_out", "swap_in", "copies"])
def test_a_move_costs_the_same_operations_whatever_the_layers(move: str) -> None:
    counts = []
    for num_layers in (2, 6):
        cache = _cache(num_layers)
        pairs = {"swap_out": [(1, 0), (4, 3)], "swap_in": [(0, 1), (3, 4)], "copies": [(1, 6)]}
        with _CountOps() as counter:
            cache.apply(**{m: pairs[m] if m == move else [] for m in pairs})
        counts.append(counter.ops)
    assert counts[0] == counts[1] and sum(counts[0].values()) <= 6, counts


def test_a_cache_is_one_stacked_tensor() -> None:
    with pytest.raises(ValueError, match="one \\[2, num_layers, num_blocks"):
        KVCache(torch.zeros(3, 1, 4, 4, 2, 16))
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        KVCache.allocate(2, 0, 4, 2, 16, torch.float32, "cpu")
