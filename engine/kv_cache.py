"""The KV cache tensors: one K and one V tensor per layer on the device, exactly the core's
``num_blocks`` blocks, plus a host-side swap cache of ``num_cpu_blocks`` blocks (pinned on CUDA).

It applies a step's memory moves in the order the core's decisions require: swap-outs first
(they free device blocks that swap-ins and copy-on-write copies of the same step may reuse), then
swap-ins, then the copy-on-write block copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BlockPair = tuple[int, int]


class KVCache:
    """Per-layer paged K/V caches ``[num_blocks, block_size, num_kv_heads, head_dim]``."""

    def __init__(
        self,
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        num_cpu_blocks: int = 0,
        backend: str = "auto",
    ) -> None:
        if not layers:
            raise ValueError("a KV cache needs at least one layer")
        self.layers = layers
        self.backend = backend
        k0 = layers[0][0]
        self.num_blocks, self.block_size = int(k0.shape[0]), int(k0.shape[1])
        self.device = k0.device
        shape = (num_cpu_blocks, *k0.shape[1:])
        pin = self.device.type == "cuda"
        self.cpu_layers = [
            (
                torch.zeros(shape, dtype=k0.dtype, pin_memory=pin),
                torch.zeros(shape, dtype=k0.dtype, pin_memory=pin),
            )
            for _ in layers
        ]

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
            self._move(swap_out, to_host=True)
        if swap_in:
            self._move(swap_in, to_host=False)
        if copies:
            # Imported on first use: it imports triton (see engine.attention.attend).
            from kernels.cache_ops import copy_blocks

            pairs = torch.tensor(copies, dtype=torch.int64, device=self.device).reshape(-1, 2)
            for k_cache, v_cache in self.layers:
                copy_blocks(k_cache, v_cache, pairs, backend=self.backend)

    def _move(self, pairs: Sequence[BlockPair], to_host: bool) -> None:
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
        for (k_dev, v_dev), (k_host, v_host) in zip(self.layers, self.cpu_layers, strict=True):
            if to_host:
                index = src.to(self.device)
                k_host[dst] = k_dev[index].to("cpu", non_blocking=False)
                v_host[dst] = v_dev[index].to("cpu", non_blocking=False)
            else:
                index = dst.to(self.device)
                k_dev[index] = k_host[src].to(self.device, non_blocking=True)
                v_dev[index] = v_host[src].to(self.device, non_blocking=True)
