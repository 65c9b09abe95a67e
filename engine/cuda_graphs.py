"""Decode-only steps on CUDA graphs, as vLLM and nano-vllm run them: one graph per padded
batch size (``graph_batch_sizes``: 1, 2, 4, 8, then steps of 8 up to ``max_num_seqs``, at most
512), captured at start-up over inputs at fixed addresses, with a fixed decode split count and
its scratch planned at capture. A decode step of ``n`` rows replays the smallest graph of at
least ``n`` rows; the padding rows get slot -1 and length 0, so they never touch the KV cache,
and their logits are never read. Prefill and mixed steps, and larger batches, run eagerly.

``DecodeGraphs(replay=False)`` runs the same padded buckets eagerly (CPU, tests): the padding
and the bucket choice are tested without a GPU.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np
import torch

from core.decode_split import DEFAULT_SPLIT, check_split_mode, padded_batch_size
from core.decode_split import GRAPH_MAX_BATCH as GRAPH_MAX_BATCH
from core.decode_split import graph_batch_sizes as graph_batch_sizes
from engine.attention import AttentionMetadata, device_metadata
from engine.input_batch import StepBuffers
from engine.kv_cache import KVCache
from engine.model.llama import LlamaForCausalLM
from engine.step_inputs import HostStep

# The inputs a decode graph reads, copied in from the step's host buffers.
_GRAPH_INPUTS = ("input_ids", "positions", "slot_mapping", "decode_seq_lens", "decode_block_tables")


@dataclass(frozen=True, slots=True)
class GraphStats:
    """What capturing cost: graphs, seconds and device bytes (inputs, scratch, graph pool)."""

    num_graphs: int
    capture_s: float
    memory_bytes: int


class DecodeGraphs:
    """The decode graphs of one model and KV cache, with their own input buffers (the
    largest bucket's rows) and one logits buffer that every graph writes."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        buffers: StepBuffers,
        sizes: tuple[int, ...],
        max_model_len: int,
        backend: str,
        replay: bool,
        decode_split: str = DEFAULT_SPLIT,
    ) -> None:
        if replay and kv_cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {kv_cache.device}")
        self.model, self.kv_cache, self.buffers = model, kv_cache, buffers
        self.sizes, self.max_model_len, self.backend = sizes, max_model_len, backend
        self.replay = replay
        self.decode_split = check_split_mode(decode_split)
        device, largest = kv_cache.device, sizes[-1]
        width = buffers.max_blocks_per_seq
        self.inputs = {
            "input_ids": torch.zeros(largest, dtype=torch.int64, device=device),
            "positions": torch.zeros(largest, dtype=torch.int64, device=device),
            "slot_mapping": torch.full((largest,), -1, dtype=torch.int64, device=device),
            "decode_seq_lens": torch.zeros(largest, dtype=torch.int32, device=device),
            "decode_block_tables": torch.zeros((largest, width), dtype=torch.int32, device=device),
        }
        self.rows = torch.arange(largest, dtype=torch.int64, device=device)
        vocab = model.config.vocab_size
        self.logits = torch.zeros((largest, vocab), dtype=torch.float32, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._metas: dict[int, AttentionMetadata] = {}

    def batch_size_for(self, num_decodes: int) -> int | None:
        return padded_batch_size(self.sizes, num_decodes)

    def capture(self) -> GraphStats:
        """Capture every bucket, largest first into one shared memory pool (a smaller graph
        reuses the larger's intermediates: only one replays at a time, and each copies its
        logits out into ``self.logits``)."""
        if not self.replay:
            raise ValueError("capture needs replay=True")
        device = self.kv_cache.device
        # torch.cuda.graph collects garbage and empties the allocator's cache as it enters:
        # done first, so that memory a dropped engine still held is not counted as freed by
        # the capture (a second calibration once measured -109 GiB and sized its cache at
        # 219 GiB of a 140 GiB device).
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info(device)[0]
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            meta = self._graph_metadata(size)
            self._forward(size, meta)  # compiles the kernels, plans the launches (splits, scratch)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(size, meta)
            self._graphs[size], self._metas[size] = graph, meta
        torch.cuda.synchronize(device)
        used = free_before - torch.cuda.mem_get_info(device)[0]
        return GraphStats(len(self._graphs), time.perf_counter() - start, used)

    def num_splits(self, size: int) -> int:
        """The decode split count the bucket's graph was captured with."""
        launches = self._metas[size].launches
        if launches is None or launches.decode is None:
            raise ValueError(f"no captured decode launch for batch size {size}")
        return launches.decode.num_splits

    def run(self, step: HostStep, size: int) -> torch.Tensor:
        """Logits [size, vocab] (fp32) of a decode-only step padded to ``size`` rows: its
        inputs are copied into the graph's buffers, then the graph replays (or, with
        ``replay=False``, the model runs on the same padded buffers)."""
        for name in _GRAPH_INPUTS:
            source = self.buffers.buffers[name].host[:size]
            self.inputs[name][:size].copy_(source, non_blocking=True)
        if self.replay:
            self._graphs[size].replay()
        else:
            self._forward(size, self._eager_metadata(step, size))
        return self.logits[:size]

    def _forward(self, size: int, meta: AttentionMetadata) -> None:
        with torch.inference_mode():
            logits = self.model(
                self.inputs["input_ids"][:size],
                self.inputs["positions"][:size],
                self.kv_cache.layers,
                meta,
                self.rows[:size],
            )
            self.logits[:size].copy_(logits)

    def _graph_metadata(self, size: int) -> AttentionMetadata:
        """A bucket's fixed metadata: views of the graph's buffers, its split plan sized for
        the model's whole length (so one count serves every context)."""
        inputs = self.inputs
        empty = inputs["decode_seq_lens"][:0]
        return AttentionMetadata(
            slot_mapping=inputs["slot_mapping"][:size],
            num_decode_tokens=size,
            decode_block_tables=inputs["decode_block_tables"][:size],
            decode_seq_lens=inputs["decode_seq_lens"][:size],
            max_decode_seq_len=self.max_model_len,
            prefill_block_tables=inputs["decode_block_tables"][:0],
            prefill_query_start_loc=torch.zeros(1, dtype=torch.int32, device=empty.device),
            prefill_seq_lens=empty,
            prefill_context_lens=empty,
            max_prefill_query_len=0,
            backend=self.backend,
            decode_split=self.decode_split,
        )

    def _eager_metadata(self, step: HostStep, size: int) -> AttentionMetadata:
        """The padded step's metadata on the graph's buffers, rebuilt each step: the torch
        backend's gather plans depend on the lengths."""
        inputs = self.inputs

        def upload(name: str, host: np.ndarray) -> torch.Tensor:
            if name in inputs:
                return inputs[name][: len(host)]
            return torch.from_numpy(host.copy()).to(self.kv_cache.device)

        return device_metadata(
            step.meta,
            upload,
            self.kv_cache.block_size,
            self.backend,
            max_decode_seq_len=self.max_model_len,
            decode_split=self.decode_split,
        )
