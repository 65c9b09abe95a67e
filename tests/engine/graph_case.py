"""The padded decode bucket of ``DecodeGraphs(replay=False)`` against the unpadded step, on
one backend: its real rows get the unpadded logits (bit-identical whatever the padding rows
hold), the padding rows read no unwritten slot and store nothing. Run in-process on the torch
backend (test_cuda_graphs.py) and, as ``python -m tests.engine.graph_case``, in a fresh
process on the Triton kernels under TRITON_INTERPRET=1 (test_triton_backend.py), where the
padding's slot -1 and length 0 meet the real store and decode kernels."""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass

import torch

from engine.attention import build_metadata, device_metadata
from engine.cuda_graphs import DecodeGraphs
from engine.input_batch import BlockTables, StepBuffers
from engine.kv_cache import KVCache
from engine.model.llama import LlamaForCausalLM
from engine.model.weights import load_model
from engine.step_inputs import ScheduledRows, fill_host_step

BLOCK_SIZE = 4
MAX_LEN = 64
LENGTHS = [9, 1, 14, 6, 21]  # tokens cached per sequence before the decode step


@dataclass
class DecodeCase:
    """Five sequences prefilled into a NaN-poisoned cache, and their next decode step."""

    model: LlamaForCausalLM
    kv: KVCache
    tables: BlockTables
    rows: ScheduledRows
    backend: str


def make_case(backend: str, device: str = "cpu") -> DecodeCase:
    model = load_model("tiny-llama", device=device, dtype=torch.float32, weights="random", seed=4)
    cfg = model.config
    kv = KVCache.allocate(
        cfg.num_layers, 40, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, model.dtype, device,
        backend=backend,
    )  # fmt: skip
    kv.kv.fill_(float("nan"))  # a slot read before it was written poisons the logits
    rng = random.Random(2)
    free = list(range(40))
    rng.shuffle(free)
    tables = BlockTables(-(-MAX_LEN // BLOCK_SIZE))
    seq_tables = {
        seq_id: [free.pop() for _ in range(-(-(length + 1) // BLOCK_SIZE))]
        for seq_id, length in enumerate(LENGTHS)
    }
    tables.update(seq_tables)
    meta = build_metadata(
        [], [], [(0, n) for n in LENGTHS], list(seq_tables.values()), BLOCK_SIZE, device, backend
    )
    ids = torch.tensor([rng.randrange(cfg.vocab_size) for _ in range(sum(LENGTHS))])
    positions = torch.cat([torch.arange(n) for n in LENGTHS])
    with torch.inference_mode():
        none = torch.zeros(0, dtype=torch.int64, device=device)
        model(ids.to(device), positions.to(device), kv.layers, meta, none)
    rows = ScheduledRows(
        decode_rows=[tables.row(s) for s in range(len(LENGTHS))],
        decode_positions=list(LENGTHS),
        decode_tokens=[rng.randrange(cfg.vocab_size) for _ in LENGTHS],
    )
    return DecodeCase(model, kv, tables, rows, backend)


def unpadded_logits(case: DecodeCase) -> torch.Tensor:
    buffers = StepBuffers(case.tables.max_blocks_per_seq, case.kv.device)
    host = fill_host_step(case.rows, case.tables, buffers, BLOCK_SIZE)
    meta = device_metadata(host.meta, buffers.upload, BLOCK_SIZE, case.backend)
    ids = buffers.upload("input_ids", host.input_ids)
    positions = buffers.upload("positions", host.positions)
    rows = torch.arange(len(LENGTHS), device=case.kv.device)
    with torch.inference_mode():
        out: torch.Tensor = case.model(ids, positions, case.kv.layers, meta, rows)
    return out.cpu()


def check_padded_bucket(case: DecodeCase, size: int, replay: bool = False) -> float:
    """Assert the bucket's properties (``replay``: on a captured CUDA graph); returns the
    largest difference to the unpadded step."""
    kv, tables, rows = case.kv, case.tables, case.rows
    unpadded = unpadded_logits(case)
    buffers = StepBuffers(tables.max_blocks_per_seq, kv.device)
    graphs = DecodeGraphs(case.model, kv, buffers, (size,), MAX_LEN, case.backend, replay=replay)
    assert graphs.batch_size_for(len(LENGTHS)) == size
    if replay:
        graphs.capture()
    before = kv.kv.to("cpu", copy=True)  # (.cpu() of a CPU tensor is the tensor itself)

    def run(stale_padding: bool) -> torch.Tensor:
        host = fill_host_step(rows, tables, buffers, BLOCK_SIZE, size - len(LENGTHS))
        if stale_padding:
            # Padding rows keep what earlier steps left in their table rows: real blocks.
            buffers.buffers["decode_block_tables"].np[len(LENGTHS) : size] = tables.array[0]
        return graphs.run(host, size).cpu()

    padded = run(stale_padding=False)
    assert padded.shape == (size, case.model.config.vocab_size)
    assert torch.isfinite(padded).all(), "a padding row read an unwritten (NaN) slot"
    # Every slot but the real rows' new ones (rewritten) is as it was: padding stored nothing.
    new_slots = torch.zeros(kv.num_blocks, BLOCK_SIZE, dtype=torch.bool)
    for row, pos in zip(rows.decode_rows, rows.decode_positions, strict=True):
        new_slots[int(tables.array[row, pos // BLOCK_SIZE]), pos % BLOCK_SIZE] = True
    kept = ~new_slots[None, None, :, :, None, None].expand_as(kv.kv)
    assert torch.equal(kv.kv.cpu()[kept].nan_to_num(7.0), before[kept].nan_to_num(7.0))
    real = padded[: len(LENGTHS)]
    torch.testing.assert_close(real, unpadded, rtol=0, atol=1e-4)
    assert torch.equal(real.argmax(-1), unpadded.argmax(-1))
    again = run(stale_padding=True)
    assert torch.equal(again[: len(LENGTHS)], real), "the padding rows changed the real rows"
    return float((real - unpadded).abs().max())


def main() -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    case = make_case("triton")
    worst = max(check_padded_bucket(case, size) for size in (8, 16))
    print(f"max abs difference {worst:.3g}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
