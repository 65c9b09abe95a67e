"""Whole decode steps of a real engine at a chosen batch and context: ``fill_decode_batch``
prefills a batch of synthetic requests until every one decodes, ``time_decode_steps`` times
the steps that follow, ``profile_decode_steps`` runs them under ``torch.profiler``: kernels and
launches per step, GPU time per step, and the host's time per step split into prepare,
forward and the rest of execute (sampling, memory moves and the wait for the GPU).

``python -m engine.profiling.decode --out FILE`` writes the profile of a few batch sizes as
JSON (``python -m engine gpu-check`` runs it)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from core.settings import build
from engine.llm_engine import EngineConfig, LLMEngine, StepRecord
from engine.sampling import SamplingParams

HOST_TOP_OPS = 8


def fill_decode_batch(engine: LLMEngine, batch: int, context: int, num_steps: int) -> str:
    """Add ``batch`` requests of ``context``-token prompts that each decode at least
    ``num_steps`` more steps, and step until none is prefilling. Returns the requests' id
    prefix. Raises ValueError when the engine's cache or budgets cannot hold the batch."""
    cache = engine.cache_config
    per_seq = -(-(context + num_steps + 2) // cache.block_size)
    if batch * per_seq > cache.num_usable_blocks:
        raise ValueError(
            f"a decode batch of {batch} x {context} tokens needs {batch * per_seq} KV blocks, "
            f"the engine has {cache.num_blocks}"
        )
    if (
        batch > engine.scheduler_config.max_num_seqs
        or context + num_steps + 2 > cache.resolved_max_model_len
    ):
        raise ValueError(
            f"a decode batch of {batch} x {context} tokens exceeds the engine's limits"
        )
    prefix = f"decode{batch}x{context}."
    vocab = engine.model.config.vocab_size
    params = SamplingParams(max_tokens=num_steps + 2, ignore_eos=True)
    for i in range(batch):
        ids = [(7 * i + 13 * j + 1) % vocab for j in range(context)]
        engine.add_request(f"{prefix}{i}", ids, params, arrival_s=0.0, now_s=0.0)
    # Every step makes progress, so the prompts are in after at most their tokens' steps.
    for _ in range(batch * context + 16):
        record = engine.step().record
        if record is None or len(record.batch.requests) != batch:
            continue
        if not any(r.is_prefill for r in record.batch.requests):
            return prefix
    raise RuntimeError(f"a decode batch of {batch} x {context} never came to decode together")


def finish(engine: LLMEngine) -> None:
    """Step ``engine`` until its requests are done."""
    while engine.has_unfinished():
        engine.step()


def time_decode_steps(engine: LLMEngine, num_steps: int) -> list[float]:
    """Wall seconds of each of the next ``num_steps`` steps (a step ends with its sampled
    tokens on the host, so the GPU's work is inside)."""
    times = []
    for _ in range(num_steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


@contextmanager
def _forward_timer(model: torch.nn.Module, spans: list[float]) -> Iterator[None]:
    """Host seconds inside each call of ``model`` (hooks; none when a CUDA graph replays it)."""
    started: list[float] = []
    pre = model.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
    post = model.register_forward_hook(lambda *_: spans.append(time.perf_counter() - started.pop()))
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def profile_decode_steps(engine: LLMEngine, num_steps: int) -> dict[str, Any]:
    """The next ``num_steps`` steps under ``torch.profiler``: per step, CUDA kernels and
    launch calls (a CUDA graph replay is one launch), GPU kernel time, and the host's time
    split into the runner's timing fields, the forward and the update; what one launch costs
    the host (the launch call alone, and the forward's host time per launch); and the host
    ops that take the most of its time (``host_top_ops``: self CPU us per step, by name)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    records: list[StepRecord] = []
    forward: list[float] = []
    wall_start = time.perf_counter()
    with profile(activities=activities) as prof, _forward_timer(engine.model, forward):
        for _ in range(num_steps):
            record = engine.step().record
            if record is not None:
                records.append(record)
    wall_s = time.perf_counter() - wall_start
    events = list(prof.events())
    gpu = [e for e in events if e.device_type.name == "CUDA"]
    launches = [e for e in events if "LaunchKernel" in e.name or "GraphLaunch" in e.name]
    n = max(1, len(records))
    forward_ms = 1e3 * sum(forward) / n if forward else None
    launches_per_step = len(launches) / n if gpu else None
    top = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)
    host = {
        f.name.removesuffix("_s") + "_ms": _mean_ms(f.name, records)
        for f in fields(records[0].timing)
    }
    return {
        "num_steps": len(records),
        "num_seqs": len(records[0].batch.requests),
        "wall_ms_per_step_profiled": 1e3 * wall_s / n,
        "step_ms_median": 1e3 * statistics.median(r.duration_s for r in records),
        "host_ms_per_step": {
            **host,
            "forward_ms": forward_ms,
            "update_ms": 1e3 * statistics.fmean(r.update_s for r in records),
        },
        "forward_calls_per_step": len(forward) / n,
        "cuda_kernels_per_step": len(gpu) / n if gpu else None,
        "cuda_kernel_ms_per_step": sum(e.time_range.elapsed_us() for e in gpu) / 1e3 / n
        if gpu
        else None,
        "launch_calls_per_step": launches_per_step,
        "launch_call_us_mean": statistics.fmean(e.time_range.elapsed_us() for e in launches)
        if gpu and launches
        else None,
        "forward_host_us_per_launch": 1e3 * forward_ms / launches_per_step
        if forward_ms is not None and launches_per_step
        else None,
        "host_top_ops": {a.key: a.self_cpu_time_total / n for a in top[:HOST_TOP_OPS]},
        "cpu_ops_per_step": sum(1 for e in events if e.name.startswith("aten::")) / n,
    }


def _mean_ms(name: str, records: Sequence[StepRecord]) -> float:
    return 1e3 * statistics.fmean(float(asdict(r.timing)[name]) for r in records)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.profiling.decode",
        description="torch.profiler over whole decode steps of the engine (random weights).",
    )
    parser.add_argument("--model", default="llama-3-8b", help="model (default: %(default)s)")
    parser.add_argument("--device", default="cuda", help="cpu or cuda (default: %(default)s)")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--batches", default="1,32", help="decode batch sizes (default: 1,32)")
    parser.add_argument("--context", type=int, default=512, help="context tokens per sequence")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps per batch size")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--out", required=True, help="JSON file to write")
    return parser


def engine_config(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """The engine of a benchmark: random weights, graphs off with ``--enforce-eager`` where the
    engine has them (``EngineConfig.enforce_eager``)."""
    settings: dict[str, Any] = dict(
        model=args.model, device=args.device, dtype=args.dtype, weights="random", **overrides
    )
    if "enforce_eager" in EngineConfig.__dataclass_fields__:
        settings["enforce_eager"] = bool(args.enforce_eager)
    return build(EngineConfig, settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    engine = LLMEngine(engine_config(args, max_num_seqs=max(batches)))
    engine.warm_up()
    results: dict[str, Any] = {
        "model": args.model,
        "device": torch.cuda.get_device_name(engine.device)
        if engine.device.type == "cuda"
        else "cpu",
        "context": args.context,
        "graphs": "enforce_eager" in EngineConfig.__dataclass_fields__ and not args.enforce_eager,
        "batches": {},
    }
    for batch in batches:
        fill_decode_batch(engine, batch, args.context, 2 * args.steps)
        time_decode_steps(engine, 2)  # warm: the first steps at a new batch size
        results["batches"][str(batch)] = profile_decode_steps(engine, args.steps)
        finish(engine)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
