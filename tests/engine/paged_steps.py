"""Test helper: runs a model step by step over a paged cache with shuffled (non-contiguous)
block tables, the way the model runner will, and says which (sequence, position) each logits
row belongs to."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from engine.attention import build_metadata
from engine.model.llama import LlamaForCausalLM


@dataclass
class PagedSteps:
    """Sequences are fixed token lists; each step advances some by one token (decodes) and
    some by a chunk, rows ordered decodes first, then chunks."""

    model: LlamaForCausalLM
    tokens: dict[int, list[int]]
    block_size: int = 4
    num_blocks: int = 96
    seed: int = 0
    backend: str = "torch"
    caches: list[tuple[torch.Tensor, torch.Tensor]] = field(init=False)
    free_blocks: list[int] = field(init=False)
    tables: dict[int, list[int]] = field(init=False, default_factory=dict)
    num_computed: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.caches = self.model.make_kv_caches(self.num_blocks, self.block_size)
        # NaN in every slot: a read of a slot the step did not write poisons the logits.
        for k_cache, v_cache in self.caches:
            k_cache.fill_(float("nan"))
            v_cache.fill_(float("nan"))
        self.free_blocks = list(range(self.num_blocks))
        random.Random(self.seed).shuffle(self.free_blocks)

    def _grow(self, seq_id: int, num_tokens: int) -> list[int]:
        table = self.tables.setdefault(seq_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free_blocks.pop())
        return table

    def step(
        self, decodes: list[int], chunks: list[tuple[int, int]], sampling_rows_only: bool = False
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Run one step; returns the logits and each logits row's (seq_id, position)."""
        ids: list[int] = []
        rows: list[tuple[int, int]] = []
        sampled: list[int] = []
        decode_lens, decode_tables = [], []
        for seq_id in decodes:
            pos = self.num_computed[seq_id]
            decode_lens.append(pos + 1)
            decode_tables.append(list(self._grow(seq_id, pos + 1)))
            ids.append(self.tokens[seq_id][pos])
            rows.append((seq_id, pos))
            sampled.append(len(rows) - 1)
        chunk_spans, chunk_tables = [], []
        for seq_id, num_new in chunks:
            context = self.num_computed.get(seq_id, 0)
            chunk_spans.append((context, num_new))
            chunk_tables.append(list(self._grow(seq_id, context + num_new)))
            for pos in range(context, context + num_new):
                ids.append(self.tokens[seq_id][pos])
                rows.append((seq_id, pos))
            sampled.append(len(rows) - 1)
        meta = build_metadata(
            decode_lens, decode_tables, chunk_spans, chunk_tables, self.block_size, "cpu",
            backend=self.backend,
        )  # fmt: skip
        for seq_id in decodes:
            self.num_computed[seq_id] += 1
        for seq_id, num_new in chunks:
            self.num_computed[seq_id] = self.num_computed.get(seq_id, 0) + num_new
        keep = sampled if sampling_rows_only else list(range(len(rows)))
        logits = self.model(
            torch.tensor(ids, dtype=torch.int64),
            torch.tensor([pos for _, pos in rows], dtype=torch.int64),
            self.caches,
            meta,
            torch.tensor(keep, dtype=torch.int64),
        )
        return logits, [rows[i] for i in keep]
