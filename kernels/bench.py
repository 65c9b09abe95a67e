"""GPU benchmark of the kernels on a Llama-3-8B layer (32 query heads, 8 kv heads, head_dim 128,
bf16) next to the device's copy bandwidth and torch SDPA, plus small decode and the fused
elementwise kernels inside CUDA graphs (``kernels.bench_graph``); writes a JSON results file.
Run: python -m kernels.bench [--quick] [--out FILE]; --dry-run lists the sweep without a GPU."""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from kernels import bench_graph
from kernels.bench_setup import (
    DECODE_LARGE_TOKENS,
    DECODE_MEDIUM_TOKENS,
    ELEMENT_BYTES,
    HEAD_DIM,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    TARGETS,
    Row,
    paged_cache,
    time_us,
)

FAMILIES = ("decode", "prefill", "cache", "graph", "split", "fused")


def decode_shapes(quick: bool, max_kv_tokens: int) -> list[dict[str, int]]:
    batches = [1, 16, 128] if quick else [1, 4, 16, 64, 256]
    contexts = [1024, 8192] if quick else [512, 2048, 8192, 32768]
    return [
        {"batch": b, "context": c, "block_size": bs}
        for b in batches
        for c in contexts
        for bs in (16, 128)
        if b * c <= max_kv_tokens
    ]


def prefill_shapes(quick: bool) -> list[dict[str, int]]:
    # (sequences, new tokens each, cached context each): fresh prompts, chunks, prefix hits.
    shapes = [(1, 512, 0), (1, 2048, 0), (4, 2048, 0), (2, 4096, 2048)]
    if not quick:
        shapes += [(1, 8192, 0), (8, 1024, 0), (4, 2048, 6144), (16, 256, 3840)]
    return [{"seqs": s, "query_len": q, "context": c, "block_size": 16} for s, q, c in shapes]


def cache_op_shapes(quick: bool) -> list[dict[str, int]]:
    tokens = [4096, 262144] if quick else [1024, 16384, 262144]
    pairs = [64, 4096] if quick else [16, 512, 4096]
    return [{"tokens": t} for t in tokens] + [{"pairs": p} for p in pairs]


def copy_bandwidth_gbs() -> float:
    """The device's practical ceiling: a 1 GiB device-to-device copy, read plus write bytes."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / time_us(lambda: dst.copy_(src)) / 1e3


def sdpa_us(q_len: int, kv_len: int, batch: int) -> tuple[float, str]:
    """torch SDPA on contiguous KV, flash first; GQA via enable_gqa where the backend takes it."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    def make(heads: int, length: int) -> torch.Tensor:
        return torch.randn(batch, heads, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16)

    q, k, v = make(NUM_Q_HEADS, q_len), make(NUM_KV_HEADS, kv_len), make(NUM_KV_HEADS, kv_len)
    mask = causal_lower_right(q_len, kv_len) if q_len > 1 else None
    attempts = [
        ("flash+gqa", SDPBackend.FLASH_ATTENTION, True),
        ("flash (kv heads expanded)", SDPBackend.FLASH_ATTENTION, False),
        ("default", None, True),
    ]
    for name, backend, gqa in attempts:
        kk = k if gqa else k.repeat_interleave(NUM_Q_HEADS // NUM_KV_HEADS, dim=1)
        vv = v if gqa else v.repeat_interleave(NUM_Q_HEADS // NUM_KV_HEADS, dim=1)

        def run(kk: torch.Tensor = kk, vv: torch.Tensor = vv, gqa: bool = gqa) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=gqa)

        try:
            if backend is None:
                return time_us(run), name
            with sdpa_kernel([backend]):
                run()
                return time_us(run), name
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend ran")


def bench_decode(shape: dict[str, int], copy_gbs: float) -> Row:
    import torch

    from kernels.paged_attention import paged_decode_attention

    batch, context, block_size = shape["batch"], shape["context"], shape["block_size"]
    k_cache, v_cache, tables = paged_cache(batch, context, block_size)
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    us = time_us(lambda: paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale))
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * ELEMENT_BYTES
    qo_bytes = 2 * batch * NUM_Q_HEADS * HEAD_DIM * ELEMENT_BYTES
    bandwidth = (kv_bytes + qo_bytes) / us / 1e3
    row = Row("decode", shape, us, bandwidth_gbs=bandwidth)
    row.sdpa_us, row.sdpa_backend = sdpa_us(1, context, batch)
    tokens = batch * context
    if tokens >= DECODE_LARGE_TOKENS:
        row.verdicts["bw>=75%copy"] = bandwidth >= TARGETS["decode_large"] * copy_gbs
    elif tokens >= DECODE_MEDIUM_TOKENS:
        row.verdicts["bw>=55%copy"] = bandwidth >= TARGETS["decode_medium"] * copy_gbs
    else:
        row.verdicts["<=20us"] = us <= TARGETS["decode_small_us"]
    return row


def bench_prefill(shape: dict[str, int]) -> Row:
    import torch

    from kernels.prefill_attention import paged_prefill_attention

    seqs, q_len, context = shape["seqs"], shape["query_len"], shape["context"]
    seq_len = context + q_len
    k_cache, v_cache, tables = paged_cache(seqs, seq_len, shape["block_size"])
    q = torch.randn(seqs * q_len, NUM_Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)

    def lengths(value: int) -> torch.Tensor:
        return torch.full((seqs,), value, device="cuda", dtype=torch.int32)

    starts = torch.arange(seqs + 1, device="cuda", dtype=torch.int32) * q_len
    args = (q, k_cache, v_cache, tables, starts, lengths(seq_len), lengths(context), HEAD_DIM**-0.5)
    us = time_us(lambda: paged_prefill_attention(*args, max_query_len=q_len))
    causal_pairs = seqs * (q_len * context + q_len * (q_len + 1) // 2)
    flops = 4 * causal_pairs * NUM_Q_HEADS * HEAD_DIM
    row = Row("prefill", shape, us, tflops=flops / us / 1e6)
    row.sdpa_us, row.sdpa_backend = sdpa_us(q_len, seq_len, seqs)
    if seqs * q_len >= 2048:
        row.verdicts[">=70%sdpa"] = row.sdpa_us / us >= TARGETS["prefill_vs_sdpa"]
    return row


def bench_cache_op(shape: dict[str, int], copy_gbs: float) -> Row:
    import torch

    from kernels.cache_ops import copy_blocks, store_kv

    block_size = 16
    token_bytes = NUM_KV_HEADS * HEAD_DIM * ELEMENT_BYTES
    if "tokens" in shape:
        tokens = shape["tokens"]
        k_cache, v_cache, _ = paged_cache(1, tokens, block_size)
        k, v = torch.randn(2, tokens, NUM_KV_HEADS, HEAD_DIM, device="cuda").bfloat16().unbind(0)
        slots = torch.randperm(tokens, device="cuda")
        us = time_us(lambda: store_kv(k, v, k_cache, v_cache, slots))
        name, moved = "store_kv", 2 * 2 * tokens * token_bytes
    else:
        num_pairs = shape["pairs"]
        k_cache, v_cache, _ = paged_cache(1, 2 * num_pairs * block_size, block_size)
        perm = torch.randperm(2 * num_pairs, device="cuda")
        pairs = perm.view(num_pairs, 2)
        us = time_us(lambda: copy_blocks(k_cache, v_cache, pairs))
        name, moved = "copy_blocks", 2 * 2 * num_pairs * block_size * token_bytes
    bandwidth = moved / us / 1e3
    row = Row(name, shape, us, bandwidth_gbs=bandwidth)
    if moved >= 256 << 20:
        row.verdicts[">=60%copy"] = bandwidth >= TARGETS["cache_ops"] * copy_gbs
    return row


def block_size_verdicts(rows: list[Row]) -> dict[str, bool]:
    """Block size 16 at most 15% slower than 128 at each decode shape."""
    by_shape = {(r.shape["batch"], r.shape["context"], r.shape["block_size"]): r for r in rows}
    out = {}
    for (batch, context, block_size), row in by_shape.items():
        other = by_shape.get((batch, context, 128))
        if block_size == 16 and other is not None:
            ratio = row.median_us / other.median_us
            out[f"decode b={batch} ctx={context}: bs16/bs128={ratio:.2f}"] = ratio <= 1.15
    return out


def environment(argv: list[str]) -> dict[str, Any]:
    import torch
    import triton

    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "device": torch.cuda.get_device_name(),
        "driver": driver or "unknown",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": shlex.join([sys.executable, "-m", "kernels.bench", *argv]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def format_row(row: Row) -> str:
    metric = ""
    if row.bandwidth_gbs is not None:
        metric = f"{row.bandwidth_gbs:8.1f} GB/s"
    elif row.tflops is not None:
        metric = f"{row.tflops:8.1f} TF/s"
    parts = [f"{row.kernel:12s} {json.dumps(row.shape):58s} {row.median_us:10.1f} us {metric}"]
    if row.graph_us is not None:
        parts.append(f"graph {row.graph_us:8.2f} us")
    if row.torch_us is not None and row.torch_graph_us is not None:
        parts.append(f"torch {row.torch_us:8.1f} us, graph {row.torch_graph_us:8.2f} us")
    if row.baseline_graph_us is not None:
        parts.append(f"baseline graph {row.baseline_graph_us:8.2f} us")
    if row.sdpa_us is not None:
        parts.append(f"sdpa {row.sdpa_us:9.1f} us ({row.sdpa_backend})")
    parts.extend(f"{k}:{'PASS' if v else 'FAIL'}" for k, v in row.verdicts.items())
    return " ".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.bench",
        description="Time the paged-attention and cache kernels on a CUDA GPU (Llama-3-8B layer, "
        "bf16) against copy bandwidth and torch SDPA, and write the results as JSON.",
    )
    parser.add_argument("--out", default="kernels/bench_results.json", help="results file")
    parser.add_argument("--quick", action="store_true", help="a small subset of the sweep")
    parser.add_argument(
        "--max-kv-tokens",
        type=int,
        default=1 << 22,
        help="skip decode shapes with more cached tokens (default 4M = 16 GiB)",
    )
    parser.add_argument("--only", choices=FAMILIES, help="one family")
    parser.add_argument("--dry-run", action="store_true", help="list the sweep; needs no GPU")
    return parser.parse_args(argv)


def sweep_plan(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The shapes of every family to run, in order (one family with --only)."""
    plan = {
        "decode": decode_shapes(args.quick, args.max_kv_tokens),
        "prefill": prefill_shapes(args.quick),
        "cache": cache_op_shapes(args.quick),
        "graph": bench_graph.graph_decode_shapes(args.quick),
        "split": bench_graph.split_shapes(args.quick),
        "fused": bench_graph.fused_shapes(args.quick),
    }
    return {args.only: plan[args.only]} if args.only else plan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = sweep_plan(args)
    if args.dry_run:
        for family, shapes in plan.items():
            for shape in shapes:
                print(family, json.dumps(shape))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the benchmark needs a GPU (use --dry-run to list the sweep)")
        return 2
    copy_gbs = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: measured copy bandwidth {copy_gbs:.0f} GB/s")
    rows: list[Row] = []
    runners: dict[str, Callable[[dict[str, Any]], Row]] = {
        "decode": lambda s: bench_decode(s, copy_gbs),
        "prefill": bench_prefill,
        "cache": lambda s: bench_cache_op(s, copy_gbs),
        "graph": bench_graph.bench_decode_graph,
        "split": bench_graph.bench_split,
        "fused": bench_graph.bench_fused,
    }
    for family, shapes in plan.items():
        for shape in shapes:
            rows.append(runners[family](shape))
            print(format_row(rows[-1]))
            torch.cuda.empty_cache()
    block_checks = block_size_verdicts([r for r in rows if r.kernel == "decode"])
    for name, ok in block_checks.items():
        print(f"{name} {'PASS' if ok else 'FAIL'}")
    argv_used = sys.argv[1:] if argv is None else argv
    results = {
        "environment": environment(argv_used),
        "copy_bandwidth_gbs": copy_gbs,
        "targets": TARGETS,
        "rows": [asdict(r) for r in rows],
        "block_size_checks": block_checks,
    }
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
