"""One step's inputs from its batch: which rows it computes (decodes first, then prefill
chunks), their tokens, positions and slots, the attention metadata and who samples, written
into the runner's persistent host buffers with numpy.

A sequence *samples* when the step brings its computed tokens up to its known tokens; before
the fork of an ``n > 1`` request the prompt is one sequence, and its last row gives the first
token of every sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from core.batch import ScheduledBatch
from core.request import Request
from engine.attention import HostMetadata
from engine.input_batch import BlockTables, StepBuffers
from engine.sampling import SampleSpec, SamplingParams

ParamsOf = Callable[[Request], tuple[SamplingParams, int]]


@dataclass(slots=True)
class ScheduledRows:
    """A batch read once, in plain lists: each decode row's table row, position and token;
    each chunk's table row, first position and length (its tokens flattened in
    ``chunk_tokens``); and every sample drawn, as ``(where, params, seed, sample_idx,
    position, owner sequence)`` with ``where`` the decode's index, or ``-1 - chunk index``."""

    decode_rows: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    decode_tokens: list[int] = field(default_factory=list)
    chunk_rows: list[int] = field(default_factory=list)
    chunk_starts: list[int] = field(default_factory=list)
    chunk_lens: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    samples: list[tuple[int, SamplingParams, int, int, int, int]] = field(default_factory=list)

    @property
    def num_decodes(self) -> int:
        return len(self.decode_rows)

    @property
    def num_tokens(self) -> int:
        return len(self.decode_rows) + len(self.chunk_tokens)


@dataclass(frozen=True, slots=True)
class HostStep:
    """One step's inputs on the host: views of the step buffers, and its samples with
    ``row`` the token row whose logits they read."""

    input_ids: np.ndarray
    positions: np.ndarray
    meta: HostMetadata
    specs: list[SampleSpec]
    owners: list[int]


def collect_rows(batch: ScheduledBatch, tables: BlockTables, params_of: ParamsOf) -> ScheduledRows:
    """Read the batch: one loop over its requests, a few list appends per decode row (the
    loop that runs at every step for every sequence, kept lean)."""
    rows = ScheduledRows()
    row_of = tables.row
    decode_rows, decode_positions = rows.decode_rows, rows.decode_positions
    decode_tokens = rows.decode_tokens
    for scheduled in batch.requests:
        request = scheduled.request
        start = scheduled.num_computed_tokens
        num_positions = scheduled.num_positions
        samples = start + num_positions == request.num_tokens
        if num_positions != 1:
            for seq_id in scheduled.seq_ids:
                end = start + num_positions
                rows.chunk_rows.append(row_of(seq_id))
                rows.chunk_starts.append(start)
                rows.chunk_lens.append(num_positions)
                rows.chunk_tokens.extend(_known_tokens(request, seq_id, start, end))
                if samples:
                    _add_samples(rows, request, seq_id, -len(rows.chunk_rows), params_of)
            continue
        prompt = request.prompt_token_ids
        if prompt is None:
            raise ValueError(f"request {request.request_id!r} has no prompt token ids")
        num_prompt = len(prompt)
        for seq_id in scheduled.seq_ids:
            decode_rows.append(row_of(seq_id))
            decode_positions.append(start)
            if start < num_prompt:
                decode_tokens.append(prompt[start])
            else:
                decode_tokens.append(request.output_token_ids[seq_id][start - num_prompt])
            if samples:
                _add_samples(rows, request, seq_id, len(decode_rows) - 1, params_of)
    return rows


def fill_host_step(
    rows: ScheduledRows,
    tables: BlockTables,
    buffers: StepBuffers,
    block_size: int,
    num_padded_decodes: int = 0,
) -> HostStep:
    """Write the step's inputs into the host buffers, vectorised. ``num_padded_decodes``
    extra decode rows (a CUDA graph's bucket; decode-only steps) get token 0 at position 0,
    slot -1 and length 0: they read and write nothing."""
    num_decodes = rows.num_decodes
    if num_padded_decodes and rows.chunk_rows:
        raise ValueError("only a decode-only step is padded")
    # Rows: decodes, then chunk tokens or (decode-only steps) padding, never both.
    num_real = num_decodes + len(rows.chunk_tokens)
    num_rows = num_real + num_padded_decodes
    ids = buffers.host("input_ids", num_rows)
    positions = buffers.host("positions", num_rows)
    slots = buffers.host("slot_mapping", num_rows)
    ids[:num_decodes] = rows.decode_tokens
    decode_rows = np.array(rows.decode_rows, dtype=np.int64)
    real_positions = positions[:num_real]
    real_positions[:num_decodes] = rows.decode_positions
    if rows.chunk_rows:
        ids[num_decodes:num_real] = rows.chunk_tokens
        lens = np.array(rows.chunk_lens, dtype=np.int64)
        starts = np.array(rows.chunk_starts, dtype=np.int64)
        # Each chunk's positions run on from its start.
        offsets = np.cumsum(lens) - lens
        real_positions[num_decodes:] = np.arange(num_real - num_decodes) + np.repeat(
            starts - offsets, lens
        )
        chunk_rows = np.array(rows.chunk_rows, dtype=np.int64)
        table_rows = np.concatenate((decode_rows, np.repeat(chunk_rows, lens)))
    else:
        lens = starts = chunk_rows = np.zeros(0, dtype=np.int64)
        table_rows = decode_rows
    blocks = tables.array[table_rows, real_positions // block_size].astype(np.int64)
    slots[:num_real] = blocks * block_size + real_positions % block_size
    if num_padded_decodes:
        ids[num_real:] = 0
        positions[num_real:] = 0
        slots[num_real:] = -1
    seq_lens = buffers.host("decode_seq_lens", num_decodes + num_padded_decodes)
    seq_lens[:num_decodes] = real_positions[:num_decodes] + 1
    seq_lens[num_decodes:] = 0
    decode_tables = buffers.host("decode_block_tables", num_decodes + num_padded_decodes)
    np.take(tables.array, decode_rows, axis=0, out=decode_tables[:num_decodes])
    meta = HostMetadata(
        slots, seq_lens, decode_tables, *_chunk_metadata(tables, buffers, chunk_rows, starts, lens),
        num_padding_tokens=num_padded_decodes,
    )  # fmt: skip
    specs, owners = _place_samples(rows, num_decodes + num_padded_decodes, lens)
    return HostStep(ids, positions, meta, specs, owners)


def _chunk_metadata(
    tables: BlockTables,
    buffers: StepBuffers,
    chunk_rows: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The prefill chunks' block tables, query start offsets, lengths after and before."""
    num_chunks = len(chunk_rows)
    block_tables = buffers.host("prefill_block_tables", num_chunks)
    query_start_loc = buffers.host("prefill_query_start_loc", num_chunks + 1)
    seq_lens = buffers.host("prefill_seq_lens", num_chunks)
    context_lens = buffers.host("prefill_context_lens", num_chunks)
    query_start_loc[0] = 0
    if num_chunks:
        np.take(tables.array, chunk_rows, axis=0, out=block_tables)
        np.cumsum(lens, out=query_start_loc[1:])
        seq_lens[:] = starts + lens
        context_lens[:] = starts
    return block_tables, query_start_loc, seq_lens, context_lens


def _place_samples(
    rows: ScheduledRows, num_decode_rows: int, chunk_lens: np.ndarray
) -> tuple[list[SampleSpec], list[int]]:
    """Each sample's token row: a decode's own row, a chunk's last row."""
    chunk_last = (num_decode_rows + np.cumsum(chunk_lens) - 1).tolist() if len(chunk_lens) else []
    specs: list[SampleSpec] = []
    owners: list[int] = []
    for where, params, seed, sample_idx, position, owner in rows.samples:
        row = where if where >= 0 else chunk_last[-1 - where]
        specs.append(SampleSpec(row, params, seed, sample_idx, position))
        owners.append(owner)
    return specs, owners


def _add_samples(
    rows: ScheduledRows, request: Request, seq_id: int, where: int, params_of: ParamsOf
) -> None:
    """The samples of ``seq_id``'s last row (``where``: see ``ScheduledRows``)."""
    params, seed = params_of(request)
    position = request.num_output_tokens
    if request.n == 1:
        rows.samples.append((where, params, seed, 0, position, seq_id))
        return
    # Before the fork, the one computed sequence samples the first token of every sample.
    sampling = request.live_seq_ids if not request.forked else [seq_id]
    for sample_seq in sampling:
        sample_idx = request.seq_ids.index(sample_seq)
        rows.samples.append((where, params, seed, sample_idx, position, sample_seq))


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
