"""The KV cache: one device tensor ``[2, num_layers, num_blocks, block_size, num_kv_heads,
head_dim]`` for every layer's K and V (each layer reads a view of it), exactly the core's
``num_blocks`` blocks, plus a host swap cache of ``num_cpu_blocks`` blocks laid out the same
(pinned on CUDA).

It applies a step's memory moves in the order the core's decisions require: swap-outs first
(they free device blocks that swap-ins and copy-on-write copies of the same step may reuse), then
swap-ins, then the copy-on-write block copies. Each move covers every layer at once: a swap is
one gather, one copy between host and device and one scatter; copy-on-write is one launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BlockPair = tuple[int, int]
# The block dimension of the stacked cache ([2, layers, blocks, ...]).
BLOCK_DIM = 2


class KVCache:
    """One stacked K/V tensor and its per-layer views ``layers[i] = (k_cache, v_cache)``, each
    ``[num_blocks, block_size, num_kv_heads, head_dim]``."""

    def __init__(self, kv: torch.Tensor, num_cpu_blocks: int = 0, backend: str = "auto") -> None:
        if kv.dim() != 6 or kv.shape[0] != 2 or kv.shape[1] < 1:
            raise ValueError(
                "a KV cache is one [2, num_layers, num_blocks, block_size, num_kv_heads, "
                f"head_dim] tensor with at least one layer, got {tuple(kv.shape)}"
            )
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks!r}")
        self.kv = kv
        self.backend = backend
        self.layers = [(kv[0, i], kv[1, i]) for i in range(kv.shape[1])]
        self.num_blocks, self.block_size = int(kv.shape[2]), int(kv.shape[3])
        self.device = kv.device
        shape = (2, kv.shape[1], num_cpu_blocks, *kv.shape[3:])
        self._pin = self.device.type == "cuda"
        self.cpu = torch.zeros(shape, dtype=kv.dtype, pin_memory=self._pin)

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        num_cpu_blocks: int = 0,
        backend: str = "auto",
    ) -> KVCache:
        """An uninitialised cache: every attention path reads only slots a sequence has
        written (the kernel tests poison the rest with NaN), and zeroing a CPU cache of a GiB
        cost seconds of page faults before the first step."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        shape = (2, num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        return cls(torch.empty(shape, dtype=dtype, device=device), num_cpu_blocks, backend)

    @property
    def cpu_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer views of the host swap cache, as ``layers``."""
        return [(self.cpu[0, i], self.cpu[1, i]) for i in range(self.cpu.shape[1])]

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Device bytes one block takes over all layers, K and V."""
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * element

    def apply(
        self,
        swap_out: Sequence[BlockPair],
        swap_in: Sequence[BlockPair],
        copies: Sequence[BlockPair],
    ) -> None:
        """Make a step's memory moves: ``swap_out`` (device, host), ``swap_in`` (host, device)
        and copy-on-write ``copies`` (src, dst)."""
        if swap_out:
            self._swap_out(swap_out)
        if swap_in:
            self._swap_in(swap_in)
        if copies:
            # Imported on first use: it imports triton (see engine.attention.attend).
            from kernels.cache_ops import copy_blocks_all_layers

            pairs = torch.tensor(copies, dtype=torch.int64, pin_memory=self._pin).reshape(-1, 2)
            pairs = pairs.to(self.device, non_blocking=True)
            copy_blocks_all_layers(self.kv[0], self.kv[1], pairs, backend=self.backend)

    def _swap_out(self, pairs: Sequence[BlockPair]) -> None:
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64).to(self.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
        # One gather of the blocks over every layer, one copy to the host (it waits: the host
        # scatter below reads it), one scatter into the swap cache.
        staged = self.kv.index_select(BLOCK_DIM, src).to("cpu")
        self.cpu.index_copy_(BLOCK_DIM, dst, staged)

    def _swap_in(self, pairs: Sequence[BlockPair]) -> None:
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64).to(self.device)
        shape = (*self.cpu.shape[:BLOCK_DIM], len(pairs), *self.cpu.shape[BLOCK_DIM + 1 :])
        # Gathered into pinned memory (a fresh block of torch's caching host allocator, which
        # is not reused before the copy from it has run), so the copy does not wait.
        staged = torch.empty(shape, dtype=self.cpu.dtype, pin_memory=self._pin)
        torch.index_select(self.cpu, BLOCK_DIM, src, out=staged)
        self.kv.index_copy_(BLOCK_DIM, dst, staged.to(self.device, non_blocking=True))
