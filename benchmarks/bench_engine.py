"""Real-engine speed: decode step time against batch size and context, prefill throughput and
output tokens/s on a bundled trace, each beside its memory-bandwidth and tensor-core bound.

    python benchmarks/bench_engine.py                       # tiny-llama on CPU (quick)
    python benchmarks/bench_engine.py --device cuda --model llama-3-8b --dtype bfloat16 \
        --hardware H100-SXM --out benchmarks/results/engine_h100.txt

The model's forward runs directly on hand-built decode/prefill metadata (the step shapes the
scheduler would produce), so each figure is the model step alone; the trace figure runs the whole
engine (scheduler, runner, sampler). On CUDA, times are CUDA-event medians after warm-up; on CPU,
medians of the process's CPU time (``time.process_time``, one torch thread), which a machine
shared with other work inflates less than wall time; the load average is printed beside them.
Bounds (CUDA only, from the ``--hardware`` preset's datasheet figures): a decode step must read
every weight and every sequence's KV once (bytes / HBM bandwidth); a step computes 2 FLOPs per
weight per token plus attention (FLOPs / dense peak).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from core.config import CacheConfig
from core.settings import build

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.attention import build_metadata  # noqa: E402
from engine.model.weights import load_model  # noqa: E402


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``fn`` after two warm-up calls."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.process_time()
            fn()
            samples.append((time.process_time() - t0) * 1e3)
    return statistics.median(samples)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters of the matrices a token multiplies through (no embedding lookup table)."""
    config = model.config
    total = sum(p.numel() for p in model.parameters())
    return total - config.vocab_size * config.hidden_size * (0 if config.tie_word_embeddings else 1)


def decode_case(
    model: torch.nn.Module, batch: int, context: int, block_size: int
) -> Callable[[], object]:
    config = model.config
    device = next(model.parameters()).device
    blocks_per_seq = -(-(context + 1) // block_size)
    caches = model.make_kv_caches(batch * blocks_per_seq + 1, block_size)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
    meta = build_metadata([context + 1] * batch, tables, [], [], block_size, device)
    ids = torch.randint(0, config.vocab_size, (batch,), device=device)
    positions = torch.full((batch,), context, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)

    def run() -> object:
        with torch.inference_mode():
            return model(ids, positions, caches, meta, rows)

    return run


def prefill_case(model: torch.nn.Module, tokens: int, block_size: int) -> Callable[[], object]:
    config = model.config
    device = next(model.parameters()).device
    blocks = -(-tokens // block_size)
    caches = model.make_kv_caches(blocks + 1, block_size)
    meta = build_metadata([], [], [(0, tokens)], [list(range(blocks))], block_size, device)
    ids = torch.randint(0, config.vocab_size, (tokens,), device=device)
    positions = torch.arange(tokens, device=device)
    last = torch.tensor([tokens - 1], device=device)

    def run() -> object:
        with torch.inference_mode():
            return model(ids, positions, caches, meta, last)

    return run


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    c = model.config
    element = next(model.parameters()).element_size()
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * element


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--hardware", default=None, help="sim hardware preset for the bounds")
    parser.add_argument("--block-size", type=int, default=CacheConfig().block_size)
    parser.add_argument("--batches", default="1,4,16,64,256")
    parser.add_argument("--contexts", default="512,2048,8192")
    parser.add_argument("--prefill-tokens", default="128,512,2048")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--trace", default=str(ROOT / "traces" / "data" / "example.csv"))
    parser.add_argument("--trace-requests", type=int, default=40)
    parser.add_argument("--out", default=None, help="also write the printed lines here")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = load_model(args.model, device=device, dtype=dtype, weights="random")
    hbm = peak = None
    if args.hardware:
        from sim.specs.hardware import get_hardware_preset

        spec = get_hardware_preset(args.hardware)
        element = next(model.parameters()).element_size()
        hbm, peak = spec.hbm_bandwidth_bytes_per_s, spec.peak_flops(element)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    env = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "dtype": str(next(model.parameters()).dtype),
        "command": " ".join(["python", "benchmarks/bench_engine.py", *(argv or sys.argv[1:])]),
        "timer": "CUDA events" if device.type == "cuda" else "process CPU time, 1 thread",
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    say(json.dumps(env))
    weights = weight_bytes(model)
    flops_per_token = 2 * matmul_params(model)
    kv_token = kv_bytes_per_token(model)
    say("decode step (ms) | batch | context | ms | tokens/s | HBM bound ms | % of HBM bound")
    for context in (int(c) for c in args.contexts.split(",")):
        if context + 1 > model.config.max_position_embeddings:
            continue
        for batch in (int(b) for b in args.batches.split(",")):
            ms = time_ms(decode_case(model, batch, context, args.block_size), device, args.repeats)
            bound = (weights + batch * (context + 1) * kv_token) / hbm * 1e3 if hbm else None
            share = f"{100 * bound / ms:.0f}%" if bound else "n/a"
            bound_text = f"{bound:.3f}" if bound else "n/a"
            rate = batch / ms * 1e3
            say(f"decode | {batch} | {context} | {ms:.3f} | {rate:.0f} | {bound_text} | {share}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    say("prefill (one chunk) | tokens | ms | tokens/s | tensor-core bound ms | % of bound")
    for tokens in (int(t) for t in args.prefill_tokens.split(",")):
        if tokens > model.config.max_position_embeddings:
            continue
        ms = time_ms(prefill_case(model, tokens, args.block_size), device, args.repeats)
        bound = tokens * flops_per_token / peak * 1e3 if peak else None
        share = f"{100 * bound / ms:.0f}%" if bound else "n/a"
        bound_text = f"{bound:.3f}" if bound else "n/a"
        say(f"prefill | {tokens} | {ms:.2f} | {tokens / ms * 1e3:.0f} | {bound_text} | {share}")

    from engine.llm_engine import EngineConfig
    from engine.replay import ReplayConfig, replay
    from traces.loaders import load_trace
    from traces.schema import Trace

    trace = load_trace(args.trace)
    trace = Trace(trace.name, trace.requests[: args.trace_requests])
    config = ReplayConfig(
        engine=build(
            EngineConfig, model=args.model, device=args.device, dtype=args.dtype,
            weights="random", block_size=args.block_size, max_num_batched_tokens=2048,
        ),
        time_scale=0.0,
    )  # fmt: skip
    cpu_start = time.process_time()
    result = replay(trace, config)
    cpu_s = time.process_time() - cpu_start
    outputs = sum(r.num_output_tokens * r.n for r in result.requests)
    say(
        f"trace {trace.name}: first {len(trace)} requests all at t=0, chunked, budget 2048: "
        f"{outputs} output tokens in {result.wall_s:.2f} s wall ({cpu_s:.2f} s CPU) = "
        f"{outputs / result.wall_s:.0f} tokens/s"
    )
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
