"""Real-engine speed: decode step time against batch size and context, prefill throughput,
whole engine decode steps and output tokens/s on a bundled trace, each beside its
memory-bandwidth and tensor-core bound.

    python benchmarks/bench_engine.py                       # tiny-llama on CPU (quick)
    python benchmarks/bench_engine.py --device cuda --model llama-3-8b --dtype bfloat16 \
        --hardware H100-SXM --out benchmarks/results/engine_h100.txt [--json FILE]

Sections (``--sections``): ``decode`` and ``prefill`` run the model's forward directly on
hand-built metadata (the step shapes the scheduler would produce), so each figure is the model
step alone; ``steps`` times whole engine decode steps (schedule, prepare, model, sample,
update) of a batch brought to decode first, so CUDA graphs count where the engine has them
(``--enforce-eager`` turns them off); ``trace`` runs the whole engine on a trace. The forward
sections' times are, on CUDA, CUDA-event medians after warm-up; on CPU, medians of the
process's CPU time (``time.process_time``, one torch thread), which a machine shared with other
work inflates less than wall time; the load average is printed beside them. Whole engine steps
are wall-clock medians (a step ends with its sampled tokens on the host).
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


SECTIONS = ("decode", "prefill", "steps", "trace")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--hardware", default=None, help="sim hardware preset for the bounds")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batches", default="1,4,16,64,256")
    parser.add_argument("--contexts", default="512,2048,8192")
    parser.add_argument("--prefill-tokens", default="128,512,2048")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--step-batches", default="1,32,64", help="whole engine decode steps: batch sizes"
    )
    parser.add_argument(
        "--step-contexts", default="512,2048", help="whole engine decode steps: contexts"
    )
    parser.add_argument("--trace", default=str(ROOT / "traces" / "data" / "example.csv"))
    parser.add_argument("--trace-requests", type=int, default=40)
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"which figures, of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="engine sections without CUDA graphs (where the engine has them)",
    )
    parser.add_argument("--out", default=None, help="also write the printed lines here")
    parser.add_argument("--json", default=None, help="also write every figure here as JSON")
    return parser


class Bench:
    """One run's model, bounds and output: each section prints lines and adds JSON rows."""

    def __init__(self, args: argparse.Namespace, argv: list[str] | None) -> None:
        self.args = args
        self.device = torch.device(args.device)
        if self.device.type == "cpu":
            torch.set_num_threads(1)
        self.dtype = getattr(torch, args.dtype) if args.dtype else None
        self.model: torch.nn.Module | None = load_model(
            args.model, device=self.device, dtype=self.dtype, weights="random"
        )
        self.hbm = self.peak = None
        if args.hardware:
            from sim.specs.hardware import get_hardware_preset

            spec = get_hardware_preset(args.hardware)
            element = next(self.model.parameters()).element_size()
            self.hbm, self.peak = spec.hbm_bandwidth_bytes_per_s, spec.peak_flops(element)
        self.weights = weight_bytes(self.model)
        self.flops_per_token = 2 * matmul_params(self.model)
        self.kv_token = kv_bytes_per_token(self.model)
        self.max_positions = self.model.config.max_position_embeddings
        self.lines: list[str] = []
        self.rows: dict[str, list[dict[str, object]]] = {name: [] for name in SECTIONS}
        from engine.llm_engine import EngineConfig

        self.has_graphs = "enforce_eager" in EngineConfig.__dataclass_fields__
        self.env = {
            "device": torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else platform.processor() or "cpu",
            "torch": torch.__version__,
            "model": args.model,
            "dtype": str(next(self.model.parameters()).dtype),
            "command": " ".join(["python", "benchmarks/bench_engine.py", *(argv or sys.argv[1:])]),
            "timer": "CUDA events" if self.device.type == "cuda" else "process CPU time, 1 thread",
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "cuda_graphs": self.has_graphs and not args.enforce_eager,
        }
        self.say(json.dumps(self.env))

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def decode_bound_ms(self, batch: int, context: int) -> float | None:
        """A decode step reads every weight and every sequence's KV once."""
        if not self.hbm:
            return None
        return (self.weights + batch * (context + 1) * self.kv_token) / self.hbm * 1e3

    def decode(self) -> None:
        args, model = self.args, self.model
        assert model is not None
        self.say(
            "decode step (ms) | batch | context | ms | tokens/s | HBM bound ms | % of HBM bound"
        )
        for context in _ints(args.contexts):
            if context + 1 > self.max_positions:
                continue
            for batch in _ints(args.batches):
                case = decode_case(model, batch, context, args.block_size)
                ms = time_ms(case, self.device, args.repeats)
                self._row("decode", batch=batch, context=context, ms=ms)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()

    def prefill(self) -> None:
        args, model = self.args, self.model
        assert model is not None
        self.say("prefill (one chunk) | tokens | ms | tokens/s | tensor-core bound ms | % of bound")
        for tokens in _ints(args.prefill_tokens):
            if tokens > self.max_positions:
                continue
            ms = time_ms(prefill_case(model, tokens, args.block_size), self.device, args.repeats)
            bound = tokens * self.flops_per_token / self.peak * 1e3 if self.peak else None
            share = 100 * bound / ms if bound else None
            self.rows["prefill"].append(
                {"tokens": tokens, "ms": ms, "bound_ms": bound, "share_pct": share}
            )
            self.say(
                f"prefill | {tokens} | {ms:.2f} | {tokens / ms * 1e3:.0f} | {_text(bound, 3)} | "
                f"{_pct(share)}"
            )

    def _row(self, section: str, batch: int, context: int, ms: float) -> None:
        bound = self.decode_bound_ms(batch, context)
        share = 100 * bound / ms if bound else None
        self.rows[section].append(
            {"batch": batch, "context": context, "ms": ms, "bound_ms": bound, "share_pct": share}
        )
        rate = batch / ms * 1e3
        self.say(
            f"{section} | {batch} | {context} | {ms:.3f} | {rate:.0f} | {_text(bound, 3)} | "
            f"{_pct(share)}"
        )

    def release_model(self) -> None:
        """The engine sections build their own model: this one's memory goes first."""
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def engine_config(self, **overrides: object) -> object:
        from engine.profiling.decode import engine_config

        return engine_config(self.args, block_size=self.args.block_size, **overrides)

    def steps(self) -> None:
        from engine.llm_engine import LLMEngine
        from engine.profiling.decode import fill_decode_batch, finish, time_decode_steps

        args = self.args
        batches = _ints(args.step_batches)
        engine = LLMEngine(self.engine_config(max_num_seqs=max(batches)))  # type: ignore[arg-type]
        engine.warm_up()
        self.say(
            "engine decode step (whole step, wall ms) | batch | context | ms | tokens/s | "
            "HBM bound ms | % of HBM bound"
        )
        for context in _ints(args.step_contexts):
            for batch in batches:
                try:
                    fill_decode_batch(engine, batch, context, args.repeats + 2)
                except ValueError as error:
                    self.say(f"steps | {batch} | {context} | skipped: {error}")
                    continue
                time_decode_steps(engine, 2)
                ms = 1e3 * statistics.median(time_decode_steps(engine, args.repeats))
                finish(engine)
                self._row("steps", batch=batch, context=context, ms=ms)

    def trace(self) -> None:
        from engine.replay import ReplayConfig, replay
        from traces.loaders import load_trace
        from traces.schema import Trace

        args = self.args
        trace = load_trace(args.trace)
        trace = Trace(trace.name, trace.requests[: args.trace_requests])
        config = ReplayConfig(
            engine=self.engine_config(max_num_batched_tokens=2048),  # type: ignore[arg-type]
            time_scale=0.0,
        )
        cpu_start = time.process_time()
        result = replay(trace, config)
        cpu_s = time.process_time() - cpu_start
        outputs = sum(r.num_output_tokens * r.n for r in result.requests)
        rate = outputs / result.wall_s
        self.rows["trace"].append(
            {"trace": trace.name, "requests": len(trace), "output_tokens": outputs,
             "wall_s": result.wall_s, "cpu_s": cpu_s, "tokens_per_s": rate}
        )  # fmt: skip
        self.say(
            f"trace {trace.name}: first {len(trace)} requests all at t=0, chunked, budget 2048: "
            f"{outputs} output tokens in {result.wall_s:.2f} s wall ({cpu_s:.2f} s CPU) = "
            f"{rate:.0f} tokens/s"
        )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _text(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"error: --sections: unknown {unknown}; choose from {SECTIONS}")
    bench = Bench(args, argv)
    for name in ("decode", "prefill"):
        if name in sections:
            getattr(bench, name)()
    bench.release_model()
    for name in ("steps", "trace"):
        if name in sections:
            getattr(bench, name)()
    if args.out:
        Path(args.out).write_text("\n".join(bench.lines) + "\n")
    if args.json:
        payload = {"environment": bench.env, **{k: v for k, v in bench.rows.items() if v}}
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
