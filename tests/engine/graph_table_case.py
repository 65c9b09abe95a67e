"""Run by test_triton_backend.py in a fresh process with TRITON_INTERPRET=1: calibration's
decode table on a decode graph's plan (``StepParts.decode_attention_graph``). Its call pads
the batch to the graph's bucket with rows of length 0, plans the splits for the model's whole
length under the engine's split mode, and gives the real rows what the unpadded batch gets;
the calibration times it only for the batches a graph holds, and lays the table out on them.
Prints "ok"."""

from __future__ import annotations

import os
from typing import Any

# Must precede the first triton import: triton.jit reads it when a kernel is decorated.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import kernels.paged_attention as paged
from core.config import CacheConfig, SchedulerConfig
from engine.llm_engine import EngineConfig, LLMEngine
from engine.profiling.grid import SMALL_GRID
from engine.profiling.measure import Measurements, _fill_tables, _table_points
from engine.profiling.parts import StepParts
from engine.profiling.timer import PointTime


def main() -> None:
    config = EngineConfig(
        cache=CacheConfig(block_size=16, num_blocks=512, max_model_len=512, swap_space_gib=0.25),
        scheduler=SchedulerConfig(max_num_seqs=8, preemption_mode="swap"),
        backend="triton",
        weights="random",
        decode_split="per_sequence",
    )
    engine = LLMEngine(config)
    parts = StepParts(engine, "triton")
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    real = paged.paged_decode_attention

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((args, kwargs))
        out: torch.Tensor = real(*args, **kwargs)
        return out

    paged.paged_decode_attention = recorded
    # Three decodes of 20 tokens replay the 4-row graph: one padding row, of length 0.
    call = parts.decode_attention_graph(3, 20)
    assert call is not None
    out = call()
    ((args, kwargs),) = calls
    q, k, v, tables, lens, scale = args
    assert q.shape[0] == tables.shape[0] == 4 and lens.tolist() == [20, 20, 20, 0], lens
    assert kwargs["max_seq_len"] == 512 and kwargs["split_mode"] == "per_sequence", kwargs
    # The real rows get what the unpadded batch gets, split as the graph splits.
    paged.paged_decode_attention = real
    alone = real(q[:3], k, v, tables[:3], lens[:3], scale, **kwargs)
    assert out.shape[0] == 4
    torch.testing.assert_close(out[:3], alone, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out[:3]).all()
    # Past the largest graph (8 rows), a step runs eagerly: no graph point.
    assert parts.decode_attention_graph(9, 20) is None
    # Calibration: the graph points only where the engine replays graphs, and only for the
    # batches a graph holds.
    grid = SMALL_GRID.__class__(**{**_fields(SMALL_GRID), "decode_seqs": (1, 4, 16)})
    eager_points, _ = _table_points(parts, grid, 512)
    assert not any(key[0] == "decode_attention_graph" for key in eager_points)
    points, layout = _table_points(parts, grid, 512, graphs=True)
    assert layout["graph_seqs"] == [1, 4]
    graph_keys = sorted(key[1:] for key in points if key[0] == "decode_attention_graph")
    assert graph_keys == [(b, c) for b in (1, 4) for c in layout["decode_context"]]
    timed = {key: PointTime(1e-6 * (i + 1), 1e-7, 3) for i, key in enumerate(points)}
    out_tables = Measurements()
    _fill_tables(out_tables, timed, grid, layout, parts)
    xs, ys, rows = out_tables.tables_2d["decode_attention_graph"]
    assert xs == [1.0, 4.0] and ys == [float(c) for c in layout["decode_context"]]
    assert rows[1][0] == timed["decode_attention_graph", 4, layout["decode_context"][0]].median_s
    print("ok")


def _fields(grid: Any) -> dict[str, Any]:
    return {name: getattr(grid, name) for name in grid.__dataclass_fields__}


if __name__ == "__main__":
    main()
