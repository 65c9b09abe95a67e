"""A mixed step through ``MixedGraphs`` against the model's own forward, on one backend: three
decodes, a chunk that continues a cached prompt, and a new prompt's first chunk, padded to a
larger token count. Its sampling rows get the forward's logits (to fp32 rounding: the padded
GEMMs have more rows), it stores the same K/V in the same slots and no other, and stale
padding rows do not change the real rows. Run in-process on the torch backend
(test_mixed_graphs.py), as ``python -m tests.engine.mixed_case`` in a fresh process on the
Triton kernels under TRITON_INTERPRET=1 (test_triton_backend.py), and replayed from captured
graphs on a GPU (test_gpu_graphs.py)."""

from __future__ import annotations

import os
import random
import sys

import torch

from engine.attention import device_metadata
from engine.input_batch import StepBuffers
from engine.kv_cache import KVCache
from engine.mixed_graphs import MixedGraphs
from engine.step_inputs import ScheduledRows, fill_host_step
from tests.engine.graph_case import BLOCK_SIZE, LENGTHS, DecodeCase, make_case

NEW_PROMPT = 11  # tokens of the new prompt's first chunk
CONTINUED = 4  # the sequence whose cached prompt goes on, by CHUNK tokens
CHUNK = 3


def mixed_rows(case: DecodeCase) -> tuple[ScheduledRows, list[int]]:
    """The step's rows (a new sequence's table added to ``case.tables``), and the rows that
    sample: the decodes and the last row of each chunk."""
    tables, rng = case.tables, random.Random(5)
    used = {int(b) for s in range(len(LENGTHS)) for b in tables.array[tables.row(s)][:8]}
    free = [b for b in range(case.kv.num_blocks) if b not in used]
    new_seq = len(LENGTHS)
    tables.update({new_seq: free[: -(-NEW_PROMPT // BLOCK_SIZE)]})
    vocab = case.model.config.vocab_size
    rows = ScheduledRows(
        decode_rows=[tables.row(s) for s in range(3)],
        decode_positions=list(LENGTHS[:3]),
        decode_tokens=[rng.randrange(vocab) for _ in range(3)],
        chunk_rows=[tables.row(CONTINUED), tables.row(new_seq)],
        chunk_starts=[LENGTHS[CONTINUED], 0],
        chunk_lens=[CHUNK, NEW_PROMPT],
        chunk_tokens=[rng.randrange(vocab) for _ in range(CHUNK + NEW_PROMPT)],
    )
    return rows, [0, 1, 2, 3 + CHUNK - 1, 3 + CHUNK + NEW_PROMPT - 1]


def _step(
    case: DecodeCase,
    rows: ScheduledRows,
    sampling: list[int],
    kv: KVCache,
    mixed: MixedGraphs | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of the sampling rows, the KV cache after the step)."""
    buffers = StepBuffers(case.tables.max_blocks_per_seq, kv.device)
    host = fill_host_step(rows, case.tables, buffers, BLOCK_SIZE)
    meta = device_metadata(host.meta, buffers.upload, BLOCK_SIZE, case.backend)
    ids = buffers.upload("input_ids", host.input_ids)
    positions = buffers.upload("positions", host.positions)
    indices = torch.tensor(sampling, device=kv.device)
    with torch.inference_mode():
        if mixed is None:
            logits = case.model(ids, positions, kv.layers, meta, indices)
        else:
            logits = mixed.run(ids, positions, kv.layers, meta, indices)
    return logits.to("cpu", copy=True), kv.kv.to("cpu", copy=True)


def check_mixed_step(case: DecodeCase, sizes: tuple[int, ...], replay: bool = False) -> float:
    """Assert the piecewise step's properties (``replay``: captured graphs); returns the
    largest logit difference to the forward."""
    rows, sampling = mixed_rows(case)
    assert rows.num_tokens == 3 + CHUNK + NEW_PROMPT
    kv = KVCache(case.kv.kv.clone(), backend=case.kv.backend)  # (the forward's: a copy)
    mixed = MixedGraphs(case.model, case.kv.layers, sizes, case.backend, replay=replay)
    size = mixed.size_for(rows.num_tokens)
    assert size is not None and size > rows.num_tokens, "the case must pad"
    if replay:
        mixed.capture()
        assert torch.equal(case.kv.kv.nan_to_num(7.0), kv.kv.nan_to_num(7.0)), "capture stored"
    want, want_kv = _step(case, rows, sampling, kv, None)
    got, got_kv = _step(case, rows, sampling, case.kv, mixed)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # The same slots written (NaN where nothing was), with the same K/V.
    assert torch.equal(got_kv.isnan(), want_kv.isnan()), "the padding stored K/V"
    torch.testing.assert_close(got_kv.nan_to_num(7.0), want_kv.nan_to_num(7.0), rtol=0, atol=1e-5)
    # Stale padding (another step's ids, positions and slots) changes no real row and no slot.
    mixed.bufs.input_ids[rows.num_tokens : size] = 3
    mixed.bufs.positions[rows.num_tokens : size] = 40
    mixed.bufs.attn_out[rows.num_tokens : size] = 1.5
    mixed.bufs.slot_mapping[rows.num_tokens : size] = 0  # a real slot: the run must reset it
    again, again_kv = _step(case, rows, sampling, case.kv, mixed)
    assert torch.equal(again, got), "the padding rows changed the real rows"
    assert torch.equal(again_kv.nan_to_num(7.0), got_kv.nan_to_num(7.0)), "the padding stored"
    return float((got - want).abs().max())


def main() -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    worst = check_mixed_step(make_case("triton"), (8, 32))
    print(f"max abs difference {worst:.3g}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
