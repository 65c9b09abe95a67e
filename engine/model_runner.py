"""The model runner: the engine's ``Executor``. It keeps every sequence's block table between
steps (updated from the tables each batch names), writes the step's inputs into persistent
buffers (``engine.step_inputs``), applies the step's memory moves, runs the model (a captured
CUDA graph for decode-only steps that fit one, piecewise graphs for the other steps where
they are on) and samples the whole batch at once.

Rows are laid out decodes first (one row per sequence computing one position), then prefill
chunks (the rest), as ``engine.attention.AttentionMetadata`` expects.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from core.batch import ScheduledBatch, StepResult
from core.decode_split import DEFAULT_SPLIT, check_split_mode
from engine.attention import AttentionMetadata, device_metadata
from engine.cuda_graphs import DecodeGraphs
from engine.input_batch import BlockTables, StepBuffers
from engine.kv_cache import KVCache
from engine.mixed_graphs import MixedGraphs
from engine.model.llama import LlamaForCausalLM
from engine.sampling import SampleSpec, sample
from engine.step_inputs import HostStep, ParamsOf, collect_rows, fill_host_step
from kernels.contracts import resolve_backend

# The model's forward arguments: ids, positions, the KV cache's layers, metadata, sample rows.
ForwardInputs = tuple[
    torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], AttentionMetadata,
    torch.Tensor,
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Where one executed step's time went (seconds, wall clock, on the host), and the input
    preparation's in the engine thread's CPU time too (a run on the CPU clock measures its
    host on that clock: ``StepRecord.prepare_s``)."""

    prepare_s: float  # building the inputs on the host
    execute_s: float  # memory moves, model and sampling, to the last token on the host
    forward_s: float = 0.0  # issuing the model (on CUDA it runs on after this)
    sample_s: float = 0.0  # sampling, and waiting for the device to give the tokens
    prepare_cpu_s: float = 0.0  # building the inputs, in the engine thread's CPU time


class ModelRunner:
    """Runs the scheduler's batches on a model over a paged KV cache.

    The scheduler must record block tables (``Scheduler(record_block_tables=True)``): the
    runner learns every table from the batches. ``params_of`` gives each request's
    ``SamplingParams`` and its seed; ``eos_token_ids`` stop sequences whose params do not
    ignore it. ``graphs`` (None: every step eager) runs the decode-only steps that fit;
    ``mixed_graphs`` (None: eager) runs the other steps that fit on piecewise graphs.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        params_of: ParamsOf,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
        backend: str = "auto",
        decode_split: str = DEFAULT_SPLIT,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.params_of = params_of
        self.eos_token_ids = eos_token_ids
        self.device = kv_cache.device
        self.backend = resolve_backend(self.device, backend)
        self.decode_split = check_split_mode(decode_split)
        self.block_size = kv_cache.block_size
        max_blocks = -(-max_model_len // self.block_size)
        self.tables = BlockTables(max_blocks)
        self.buffers = StepBuffers(max_blocks, self.device)
        self.graphs: DecodeGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None
        self.last_timing = StepTiming(0.0, 0.0)

    def forget(self, seq_ids: Iterable[int]) -> None:
        """Drop the tables of sequences that will not run again (finished requests)."""
        self.tables.forget(seq_ids)

    def swap_tables(self, tables: BlockTables) -> BlockTables:
        """Run on ``tables`` from now on (a scratch scheduler's sequences); returns the old."""
        old, self.tables = self.tables, tables
        return old

    def execute(self, batch: ScheduledBatch) -> StepResult:
        start, start_cpu = time.perf_counter(), time.thread_time()
        if batch.block_tables:
            self.tables.update(batch.block_tables)
        rows = collect_rows(batch, self.tables, self.params_of)
        size = None
        if self.graphs is not None and not rows.chunk_rows:
            size = self.graphs.batch_size_for(rows.num_decodes)
        padding = size - rows.num_decodes if size is not None else 0
        host = fill_host_step(rows, self.tables, self.buffers, self.block_size, padding)
        specs = host.specs
        if size is None:
            inputs, specs = self._upload(host)
        prepared, prepared_cpu = time.perf_counter(), time.thread_time()
        self.kv_cache.apply(batch.swap_out, batch.swap_in, batch.copies)
        logits = None
        if size is not None:
            assert self.graphs is not None
            logits = self.graphs.run(host, size)
        elif rows.num_tokens:
            mixed = self.mixed_graphs
            with torch.inference_mode():
                if mixed is not None and mixed.size_for(rows.num_tokens) is not None:
                    logits = mixed.run(*inputs)
                else:
                    logits = self.model(*inputs)
        forwarded = time.perf_counter()
        sampled: dict[int, int] = {}
        stopped: set[int] = set()
        if specs and logits is not None:
            tokens = sample(logits, specs)
            for seq_id, spec, token in zip(host.owners, specs, tokens, strict=True):
                sampled[seq_id] = token
                if token in self.eos_token_ids and not spec.params.ignore_eos:
                    stopped.add(seq_id)
        elif self.device.type == "cuda":
            # No sequence samples (a prompt chunk mid-way): the step ends when its KV is written.
            torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        self.last_timing = StepTiming(
            prepared - start,
            end - prepared,
            forwarded - prepared,
            end - forwarded,
            prepared_cpu - start_cpu,
        )
        return StepResult(end - start, sampled, frozenset(stopped))

    def _upload(self, host: HostStep) -> tuple[ForwardInputs, list[SampleSpec]]:
        """An eager step's device inputs (one copy per buffer), and its samples re-rowed to
        the logits of the distinct rows that sample."""
        buffers = self.buffers
        rows = np.fromiter((s.row for s in host.specs), np.int64, len(host.specs))
        if len(rows) < 2 or bool((rows[1:] > rows[:-1]).all()):
            logit_rows, where = rows, np.arange(len(rows))  # (each row once, in order)
        else:
            # Before an n > 1 request forks, its last prompt row samples several times.
            logit_rows, where = np.unique(rows, return_inverse=True)
        indices = buffers.host("logits_indices", len(logit_rows))
        indices[:] = logit_rows
        meta = device_metadata(
            host.meta, buffers.upload, self.block_size, self.backend,
            decode_split=self.decode_split,
        )  # fmt: skip
        inputs: ForwardInputs = (
            buffers.upload("input_ids", host.input_ids),
            buffers.upload("positions", host.positions),
            self.kv_cache.layers,
            meta,
            buffers.upload("logits_indices", indices),
        )
        if np.array_equal(rows, where):
            return inputs, host.specs  # (the first rows sample, each once: already indices)
        specs = [
            SampleSpec(int(row), s.params, s.seed, s.sample_idx, s.position)
            for row, s in zip(where, host.specs, strict=True)
        ]
        return inputs, specs
