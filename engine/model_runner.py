"""The model runner: the engine's ``Executor``. It turns the core's ``ScheduledBatch`` into
tensors (token ids, positions, slot mapping, block tables, lengths), applies the step's memory
moves, runs the model and samples.

Rows are laid out decodes first (one row per sequence computing one position), then prefill
chunks (the rest), as ``engine.attention.AttentionMetadata`` expects. A sequence *samples* when
the step brings its computed tokens up to its known tokens; before the fork of an ``n > 1``
request the prompt is one sequence, and its last row gives the first token of every sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from core.batch import ScheduledBatch, ScheduledRequest, StepResult
from core.request import Request
from engine.attention import build_metadata
from engine.kv_cache import KVCache
from engine.sampling import SampleSpec, SamplingParams, sample


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Where one executed step's time went (seconds, wall clock)."""

    prepare_s: float  # building the inputs on the host
    execute_s: float  # memory moves, model and sampling, to the last token on the host


@dataclass(slots=True)
class _Rows:
    """One step's inputs as plain lists, before they become tensors."""

    token_ids: list[int]
    positions: list[int]
    decode_seq_lens: list[int]
    decode_tables: list[list[int]]
    chunks: list[tuple[int, int]]
    chunk_tables: list[list[int]]


class ModelRunner:
    """Runs the scheduler's batches on a model over a paged KV cache.

    ``block_tables`` is the scheduler's ``block_tables`` (the core owns them); ``params_of``
    gives each request's ``SamplingParams`` and its seed; ``eos_token_ids`` stop sequences
    whose params do not ignore it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        block_tables: Callable[[Request], tuple[Sequence[int], ...]],
        params_of: Callable[[Request], tuple[SamplingParams, int]],
        eos_token_ids: frozenset[int] = frozenset(),
        backend: str = "auto",
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_tables = block_tables
        self.params_of = params_of
        self.eos_token_ids = eos_token_ids
        self.backend = backend
        self.device = kv_cache.device
        self.last_timing = StepTiming(0.0, 0.0)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        start = time.perf_counter()
        rows, specs, owners = self._prepare(batch)
        device = self.device
        meta = build_metadata(
            rows.decode_seq_lens,
            rows.decode_tables,
            rows.chunks,
            rows.chunk_tables,
            self.kv_cache.block_size,
            device,
            self.backend,
        )
        input_ids = torch.tensor(rows.token_ids, dtype=torch.int64, device=device)
        positions = torch.tensor(rows.positions, dtype=torch.int64, device=device)
        logit_rows = sorted({spec.row for spec in specs})
        logits_indices = torch.tensor(logit_rows, dtype=torch.int64, device=device)
        prepared = time.perf_counter()
        self.kv_cache.apply(batch.swap_out, batch.swap_in, batch.copies)
        sampled: dict[int, int] = {}
        stopped: set[int] = set()
        if specs:
            with torch.inference_mode():
                logits = self.model(
                    input_ids, positions, self.kv_cache.layers, meta, logits_indices
                )
            where = {row: idx for idx, row in enumerate(logit_rows)}
            local = [
                SampleSpec(where[s.row], s.params, s.seed, s.sample_idx, s.position) for s in specs
            ]
            for seq_id, spec, token in zip(owners, specs, sample(logits, local), strict=True):
                sampled[seq_id] = token
                if token in self.eos_token_ids and not spec.params.ignore_eos:
                    stopped.add(seq_id)
        elif rows.token_ids:
            # No sequence samples (a prompt chunk mid-way): the KV must still be written.
            with torch.inference_mode():
                self.model(input_ids, positions, self.kv_cache.layers, meta, logits_indices)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        end = time.perf_counter()
        self.last_timing = StepTiming(prepared - start, end - prepared)
        return StepResult(end - start, sampled, frozenset(stopped))

    def _prepare(self, batch: ScheduledBatch) -> tuple[_Rows, list[SampleSpec], list[int]]:
        decodes: list[tuple[ScheduledRequest, int, int, Sequence[int]]] = []
        chunks: list[tuple[ScheduledRequest, int, int, Sequence[int]]] = []
        for scheduled in batch.requests:
            request = scheduled.request
            tables = self.block_tables(request)
            for slot, (seq_id, table) in enumerate(zip(scheduled.seq_ids, tables, strict=True)):
                group = decodes if scheduled.num_positions == 1 else chunks
                group.append((scheduled, seq_id, slot, table))
        rows = _Rows([], [], [], [], [], [])
        specs: list[SampleSpec] = []
        owners: list[int] = []
        for group in (decodes, chunks):
            for scheduled, seq_id, _, table in group:
                request = scheduled.request
                start = scheduled.num_computed_tokens
                end = start + scheduled.num_positions
                rows.token_ids.extend(_known_tokens(request, seq_id, start, end))
                rows.positions.extend(range(start, end))
                if group is decodes:
                    rows.decode_seq_lens.append(end)
                    rows.decode_tables.append(list(table))
                else:
                    rows.chunks.append((start, scheduled.num_positions))
                    rows.chunk_tables.append(list(table))
                if end == request.num_tokens:
                    self._add_samples(request, seq_id, len(rows.token_ids) - 1, specs, owners)
        return rows, specs, owners

    def _add_samples(
        self,
        request: Request,
        seq_id: int,
        row: int,
        specs: list[SampleSpec],
        owners: list[int],
    ) -> None:
        params, seed = self.params_of(request)
        position = request.num_output_tokens
        # Before the fork, the one computed sequence samples the first token of every sample.
        sampling = request.live_seq_ids if request.n > 1 and not request.forked else [seq_id]
        for sample_seq in sampling:
            sample_idx = request.seq_ids.index(sample_seq)
            specs.append(SampleSpec(row, params, seed, sample_idx, position))
            owners.append(sample_seq)


def _known_tokens(request: Request, seq_id: int, start: int, end: int) -> list[int]:
    """Tokens ``start .. end - 1`` of sequence ``seq_id``: its prompt, then its outputs."""
    prompt = request.prompt_token_ids
    if prompt is None:
        raise ValueError(f"request {request.request_id!r} has no prompt token ids")
    num_prompt = len(prompt)
    out = list(prompt[start : min(end, num_prompt)])
    if end > num_prompt:
        outputs = request.output_token_ids.get(seq_id, ())
        out.extend(outputs[max(start, num_prompt) - num_prompt : end - num_prompt])
    return out
