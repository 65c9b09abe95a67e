"""The prefix cache's index over the GPU blocks: which full block holds which content key, the
blocks computed twice, and the cached-free blocks in eviction order. ``BlockAllocator`` owns
one and decides when a block enters or leaves it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class CachedBlocks:
    """Content keys of full blocks (``block_key`` by block id, ``by_key`` the other way) and
    the cached-free blocks (ref count 0, content kept for a hit), least recently freed
    first."""

    __slots__ = ("block_key", "by_key", "duplicates", "evictable")

    def __init__(self, num_blocks: int) -> None:
        self.block_key: list[int | None] = [None] * num_blocks
        self.by_key: dict[int, int] = {}
        # Further blocks caching a key that another block caches already (computed twice),
        # oldest first: as vLLM's BlockPool they stay cached, and one takes over the key when
        # the block holding it is evicted.
        self.duplicates: dict[int, list[int]] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()

    def match(self, keys: Iterable[int]) -> list[int]:
        """Blocks holding the longest cached run of ``keys``."""
        hits: list[int] = []
        for key in keys:
            block_id = self.by_key.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def add(self, block_id: int, key: int) -> bool:
        """Record that the full ``block_id`` holds ``key``. False when another block caches
        that content already: that one stays the one hits take, this one a duplicate."""
        current = self.block_key[block_id]
        if current is not None:
            if current != key:
                raise ValueError(f"block {block_id} already caches key {current}, not {key}")
            return True
        self.block_key[block_id] = key
        if key in self.by_key:
            self.duplicates.setdefault(key, []).append(block_id)
            return False
        self.by_key[key] = block_id
        return True

    def restore(self, block_id: int, key: int) -> None:
        """``block_id`` holds ``key`` again (swapped back in): cached unless another block
        took the key meanwhile."""
        if key not in self.by_key:
            self.block_key[block_id] = key
            self.by_key[key] = block_id

    def evict(self) -> int:
        """Take the least recently freed cached-free block out of the cache; returns it."""
        block_id, _ = self.evictable.popitem(last=False)
        key = self.block_key[block_id]
        assert key is not None
        self.block_key[block_id] = None
        duplicates = self.duplicates.get(key)
        if self.by_key[key] == block_id:
            if duplicates:
                self.by_key[key] = duplicates.pop(0)  # a duplicate takes over the key
            else:
                del self.by_key[key]
        else:
            assert duplicates is not None
            duplicates.remove(block_id)
        if duplicates is not None and not duplicates:
            del self.duplicates[key]
        return block_id
