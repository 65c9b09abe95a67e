"""The engine's parts timed in isolation (``StepParts``): one decoder layer's linear layers and
elementwise ops, paged decode and prefill attention, the KV store, block copies, swaps each way,
LM head + sampling and the per-step input preparation, each a closure on the engine's own model
and cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from core.batch import ScheduledBatch, ScheduledRequest
from core.decode_split import graph_batch_sizes, padded_batch_size
from core.request import Request
from engine.input_batch import BlockTables
from engine.llm_engine import LLMEngine
from engine.model.llama import step_ops
from engine.sampling import SampleSpec, SamplingParams, sample
from engine.step_inputs import collect_rows, fill_host_step
from kernels.torch_attention import (
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    plan_decode,
    plan_prefill,
)


class StepParts:
    """Closures that run one part of one step on the engine's own model and cache."""

    def __init__(self, engine: LLMEngine, backend: str) -> None:
        self.engine, self.backend = engine, backend
        self.model = engine.model
        self.layer = engine.model.decoder_layers()[0]
        cfg = engine.model.config
        self.cfg = cfg
        self.device, self.dtype = engine.device, engine.dtype
        self.k_cache, self.v_cache = engine.kv_cache.layers[0]
        self.block_size = engine.kv_cache.block_size
        self.num_cache_blocks = engine.kv_cache.num_blocks
        self.max_model_len = engine.cache_config.resolved_max_model_len
        element = torch.empty((), dtype=self.dtype).element_size()
        self.kv_bytes_per_token_per_layer = 2 * cfg.num_kv_heads * cfg.head_dim * element
        self.block_bytes = self.block_size * self.kv_bytes_per_token_per_layer * cfg.num_layers
        self.generator = torch.Generator().manual_seed(0)

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator).to(self.device, self.dtype)

    def _blocks(self, num: int) -> torch.Tensor:
        """``num`` distinct, scattered block ids (block 0 is the null block)."""
        if num >= self.num_cache_blocks:
            raise ValueError(
                f"calibration needs {num} KV blocks, the engine has {self.num_cache_blocks}; "
                "lower the grid or raise the cache size"
            )
        perm = torch.randperm(self.num_cache_blocks - 1, generator=self.generator)[:num] + 1
        return perm.to(self.device)

    def linear(self, n: int) -> Callable[[], Any]:
        attn, mlp, cfg = self.layer.self_attn, self.layer.mlp, self.cfg
        x, xq = self._rand(n, cfg.hidden_size), self._rand(n, cfg.q_size)
        xi = self._rand(n, cfg.intermediate_size)
        return lambda: (attn.qkv_proj(x), attn.o_proj(xq), mlp.gate_up_proj(x), mlp.down_proj(xi))

    def elementwise(self, n: int) -> Callable[[], Any]:
        """One layer's elementwise work as the model runs it on this backend (``step_ops``: the
        fused kernels on Triton): two add+norms, the rotation of q and k, SiLU x up."""
        layer, cfg = self.layer, self.cfg
        x, residual = self._rand(n, cfg.hidden_size), self._rand(n, cfg.hidden_size)
        qk = self._rand(n, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
        gate_up = self._rand(n, 2 * cfg.intermediate_size)
        positions = torch.arange(n, device=self.device) % cfg.max_position_embeddings
        ops = step_ops(positions, self.model.cos_sin_cache, self.backend)

        def run() -> Any:
            h, _ = ops.add_rms_norm(x, residual, layer.input_layernorm)
            ops.rotate(qk, cfg.num_heads)
            ops.add_rms_norm(h, residual, layer.post_attention_layernorm)
            return ops.silu_and_mul(gate_up)

        return run

    def store_kv(self, n: int) -> Callable[[], Any]:
        cfg = self.cfg
        k, v = (self._rand(n, cfg.num_kv_heads, cfg.head_dim) for _ in range(2))
        blocks = self._blocks(-(-n // self.block_size))
        slots = blocks[:, None] * self.block_size + torch.arange(
            self.block_size, device=self.device
        )
        slot_mapping = slots.reshape(-1)[:n].contiguous()
        from kernels.cache_ops import store_kv  # imports triton (see engine.attention.attend)

        return lambda: store_kv(
            k, v, self.k_cache, self.v_cache, slot_mapping, backend=self.backend
        )

    def _tables(self, num_seqs: int, num_tokens: int) -> torch.Tensor:
        width = -(-num_tokens // self.block_size)
        blocks = self._blocks(num_seqs * width)
        return blocks.reshape(num_seqs, width).to(torch.int32)

    def decode_attention(self, b: int, context: int) -> Callable[[], Any]:
        return self.decode_attention_at([context] * b)

    def decode_attention_at(self, contexts: list[int]) -> Callable[[], Any]:
        """One decode batch whose sequences have these contexts (each its own blocks)."""
        cfg, b, longest = self.cfg, len(contexts), max(contexts)
        q = self._rand(b, cfg.num_heads, cfg.head_dim)
        tables = self._tables(b, longest)
        lens = torch.tensor(contexts, dtype=torch.int32, device=self.device)
        scale = cfg.head_dim**-0.5
        if self.backend == "torch":
            # As the engine runs it: the gather plan is built once per step (input preparation),
            # each layer only attends.
            plan = plan_decode(tables, contexts, self.block_size)
            return lambda: paged_decode_attention_torch(q, self.k_cache, self.v_cache, plan, scale)
        from kernels.paged_attention import paged_decode_attention  # imports triton

        return lambda: paged_decode_attention(
            q, self.k_cache, self.v_cache, tables, lens, scale,
            backend=self.backend, max_seq_len=longest,
        )  # fmt: skip

    def decode_attention_graph(self, b: int, context: int) -> Callable[[], Any] | None:
        """``b`` decodes of ``context`` tokens each as a decode graph runs them: padded to its
        batch bucket (``core.decode_split.graph_batch_sizes``: padding rows of length 0, which
        read nothing), the split plan sized for the model's whole length, the engine's split
        mode. Launched eagerly: the tables time the kernels alone, so the launch is not what
        they measure, the plan is. None past the largest bucket (such a step runs eagerly)."""
        config = self.engine.config
        sizes = graph_batch_sizes(config.scheduler.max_num_seqs)
        padded = padded_batch_size(sizes, b)
        if padded is None:
            return None
        cfg = self.cfg
        q = self._rand(padded, cfg.num_heads, cfg.head_dim)
        tables = torch.zeros((padded, -(-context // self.block_size)), dtype=torch.int32)
        tables[:b] = self._tables(b, context).cpu()
        lens = torch.tensor([context] * b + [0] * (padded - b), dtype=torch.int32)
        tables, lens = tables.to(self.device), lens.to(self.device)
        from kernels.paged_attention import paged_decode_attention  # imports triton

        return lambda: paged_decode_attention(
            q, self.k_cache, self.v_cache, tables, lens, cfg.head_dim**-0.5,
            backend=self.backend, max_seq_len=self.max_model_len,
            split_mode=config.decode_split,
        )  # fmt: skip

    def prefill_attention(self, query: int, context: int) -> Callable[[], Any]:
        cfg = self.cfg
        q = self._rand(query, cfg.num_heads, cfg.head_dim)
        tables = self._tables(1, context + query)

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        start_loc, seq_lens, ctx = ints([0, query]), ints([context + query]), ints([context])
        scale = cfg.head_dim**-0.5
        if self.backend == "torch":  # the plan once per step, as in the engine
            chunks = plan_prefill(tables, [0, query], [context + query], [context], self.block_size)
            return lambda: paged_prefill_attention_torch(
                q, self.k_cache, self.v_cache, chunks, scale
            )
        from kernels.prefill_attention import paged_prefill_attention  # imports triton

        return lambda: paged_prefill_attention(
            q, self.k_cache, self.v_cache, tables, start_loc, seq_lens, ctx, scale,
            backend=self.backend, max_query_len=query,
        )  # fmt: skip

    def lm_head(self, num_seqs: int) -> Callable[[], Any]:
        model = self.model
        x = self._rand(num_seqs, self.cfg.hidden_size)
        greedy = SamplingParams(max_tokens=1)
        specs = [SampleSpec(i, greedy, 0, 0, 0) for i in range(num_seqs)]

        def run() -> Any:
            logits = F.linear(model.norm(x), model.lm_head).float()
            return sample(logits, specs)

        return run

    def copy_blocks(self, n: int) -> Callable[[], Any]:
        ids = self._blocks(2 * n).tolist()
        pairs = list(zip(ids[:n], ids[n:], strict=True))
        return lambda: self.engine.kv_cache.apply([], [], pairs)

    def _swap(self, n: int, to_host: bool) -> Callable[[], Any]:
        cache = self.engine.kv_cache
        host = cache.cpu_layers[0][0].shape[0]
        if host < n:
            raise ValueError(
                f"calibration swaps {n} blocks, the engine's host cache holds {host}; "
                "raise swap_space_gib or lower the grid"
            )
        device_ids = self._blocks(n).tolist()
        pairs = (
            [(d, h) for h, d in enumerate(device_ids)]
            if to_host
            else [(h, d) for h, d in enumerate(device_ids)]
        )
        return lambda: cache.apply(pairs, [], []) if to_host else cache.apply([], pairs, [])

    def swap_out(self, n: int) -> Callable[[], Any]:
        return self._swap(n, to_host=True)

    def swap_in(self, n: int) -> Callable[[], Any]:
        return self._swap(n, to_host=False)

    def prepare(self, num_seqs: int) -> Callable[[], Any]:
        """The host work of preparing one decode step's inputs as the runner does it (reading
        the batch, filling its persistent buffers, the metadata and the copies), for
        ``num_seqs`` sequences decoding at a 256-token context."""
        context = 256
        width = -(-context // self.block_size)
        runner = self.engine.runner
        tables = BlockTables(runner.tables.max_blocks_per_seq)
        batch = ScheduledBatch(step_idx=0, now_s=0.0)
        for seq_id in range(num_seqs):
            request = Request(
                f"p{seq_id}", 0.0, context - 1, 2, prompt_token_ids=(1,) * (context - 1)
            )
            request.seq_ids, request.live_seq_ids = [seq_id], [seq_id]
            request.num_output_tokens, request.output_token_ids = 1, {seq_id: [1]}
            batch.requests.append(ScheduledRequest(request, 1, context - 1, (seq_id,), False))
            tables.update({seq_id: range(1 + seq_id * width, 1 + (seq_id + 1) * width)})
        greedy = (SamplingParams(), 0)

        def run() -> Any:
            rows = collect_rows(batch, tables, lambda _: greedy)
            host = fill_host_step(rows, tables, runner.buffers, self.block_size)
            return runner._upload(host)

        return run
