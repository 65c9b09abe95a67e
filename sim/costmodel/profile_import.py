"""`python -m sim profile import-vidur`: Vidur's measured CSVs turned into our profile format
(docs/profile_format.md), so `--profile` can run on public measurements without a GPU. Ops the
files do not time (LM head, KV store, copies, swaps) are left out: the roofline prices them."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from core.model.spec import ModelSpec, check_tp
from sim.costmodel.layer_ops import ELEMENTWISE_CALLS, LINEAR_OPS
from sim.costmodel.profile import FORMAT_VERSION
from sim.costmodel.vidur_profiles import (
    AttentionRow,
    VidurFileError,
    find_vidur_files,
    read_allreduce_csv,
    read_attention_csv,
    read_mlp_csv,
)

UNKNOWN = "unknown (Vidur profile)"


def _median_by(pairs: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    """Sorted x, and the median time where a size was measured more than once."""
    grouped: dict[int, list[float]] = defaultdict(list)
    for x, t in pairs:
        grouped[x].append(t)
    xs = sorted(x for x in grouped if x > 0)
    return xs, [statistics.median(grouped[x]) for x in xs]


def _grid(cells: dict[tuple[int, int], float]) -> dict[str, Any] | None:
    """The full grid, inside the measured cells, that covers the largest area: for each cut
    K of the first axis, the x values up to K and the y values measured at every one of them
    (Vidur measures a triangle, chunk + context <= max_model_len). None when fewer than two
    of either remain."""
    xs_all = sorted({x for x, _ in cells})
    ys_all = sorted({y for _, y in cells})
    best: tuple[int, list[int], list[int]] | None = None
    for cut in xs_all:
        xs = [x for x in xs_all if x <= cut]
        ys = [y for y in ys_all if all((x, y) in cells for x in xs)]
        if len(xs) >= 2 and len(ys) >= 2:
            area = xs[-1] * max(ys[-1], 1)
            if best is None or area > best[0]:
                best = (area, xs, ys)
    if best is None:
        return None
    _, xs, ys = best
    return {"xs": xs, "ys": ys, "time_s": [[cells[(x, y)] for y in ys] for x in xs]}


def _attention_tables(rows: list[AttentionRow], tp: int) -> dict[str, Any]:
    prefill: dict[tuple[int, int], float] = {}
    decode: dict[tuple[int, int], float] = {}
    for row in rows:
        if row.tp != tp:
            continue
        if row.is_prefill:
            prefill.setdefault((row.prefill_chunk_size, row.kv_cache_size), row.time_s)
        elif row.kv_cache_size > 0:
            decode.setdefault((row.batch_size, row.kv_cache_size), row.time_s)
    tables: dict[str, Any] = {}
    if (grid := _grid(prefill)) is not None:
        tables["prefill_attention"] = {
            "num_query_tokens": grid["xs"],
            "num_context_tokens": grid["ys"],
            "time_s": grid["time_s"],
        }
    if (grid := _grid(decode)) is not None:
        tables["decode_attention"] = {
            "num_seqs": grid["xs"],
            "context_tokens": grid["ys"],
            "time_s": grid["time_s"],
        }
    return tables


def vidur_profile(
    vidur_dir: str | Path,
    model: ModelSpec,
    tp: int,
    command: str,
    gpu: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """The profile (a JSON-ready dict) for `model` at `tp` from the files present."""
    check_tp(model, tp)
    found = find_vidur_files(vidur_dir, model, gpu)
    ops: dict[str, Any] = {}
    block_size = 16  # vLLM's default; the attention file says its own
    if found.mlp is not None:
        rows = [row for row in read_mlp_csv(found.mlp) if row.tp == tp]
        linear = [(r.num_tokens, sum(r.op_s[op] for op in LINEAR_OPS)) for r in rows]
        if rows and all(op in rows[0].op_s for op in LINEAR_OPS):
            xs, times = _median_by(linear)
            ops["linear"] = {"num_tokens": xs, "time_s": times}
        wanted = [op for op in ELEMENTWISE_CALLS if rows and op in rows[0].op_s]
        if wanted:
            # The embedding runs once a step; spread over the layers, as the format is per layer.
            emb = [r.op_s.get("emb", 0.0) / model.num_layers for r in rows]
            elementwise = [
                (r.num_tokens, sum(ELEMENTWISE_CALLS[op] * r.op_s[op] for op in wanted) + e)
                for r, e in zip(rows, emb, strict=True)
            ]
            xs, times = _median_by(elementwise)
            ops["elementwise"] = {"num_tokens": xs, "time_s": times}
    if found.attention is not None:
        attention_rows = read_attention_csv(found.attention)
        ops |= _attention_tables(attention_rows, tp)
        sizes = {row.block_size for row in attention_rows if row.tp == tp}
        if len(sizes) == 1:
            block_size = sizes.pop()
    if node is not None and node not in found.networks:
        there = ", ".join(sorted(found.networks)) or "none"
        raise VidurFileError(
            f"{vidur_dir}: no network/{found.gpu}_{node}/all_reduce.csv (--node: {there})"
        )
    if tp > 1 and found.networks:
        node = node or ("dgx" if "dgx" in found.networks else sorted(found.networks)[0])
        network = read_allreduce_csv(found.networks[node])
        pairs = [
            (r.size_bytes, r.time_s) for r in network if r.num_workers == r.devices_per_node == tp
        ]
        if pairs:
            xs, times = _median_by(pairs)
            ops["allreduce"] = {"num_bytes": xs, "time_s": times}
    if not ops:
        raise VidurFileError(f"{vidur_dir}: no measured op fits {model.name} at tp={tp}")
    return {
        "format_version": FORMAT_VERSION,
        "device": {"name": f"{found.gpu} ({node or 'single GPU'})", "driver": UNKNOWN},
        "software": {"torch": UNKNOWN, "triton": UNKNOWN, "cuda": UNKNOWN},
        "command": command,
        "model": model.name,
        "tp": tp,
        "block_size": block_size,
        "ops": ops,
    }


def write_vidur_profile(profile: dict[str, Any], out: str | Path) -> None:
    Path(out).write_text(json.dumps(profile, indent=1) + "\n")
