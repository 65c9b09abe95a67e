"""Where one real decode-only engine step's thread-CPU time goes, part by part, timed in place
(inside ``LLMEngine.step``), against what ``engine.profiling``'s isolated microbenchmarks give
for the same shapes, timed in the same process right after.

The engine (tiny-llama, CPU, one torch thread) decodes ``--seqs`` sequences at about
``--context`` tokens. Every part of the step is wrapped with a thread-CPU timer: the
scheduler's schedule and update, the runner's input preparation (reading the batch, the
persistent buffers, metadata),
the KV cache's memory moves, each decoder layer's linear layers, norms, rotary, attention
(store + attend) and MLP activation, the embedding/final norm/LM head, and sampling. What the
wrappers do not cover is the glue between them (module calls, slicing, views, adds).

    python benchmarks/step_anatomy.py --seqs 1 --context 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch.nn.functional as F  # noqa: E402

import engine.llm_engine as llm_engine  # noqa: E402
import engine.model.llama as llama  # noqa: E402
import engine.model_runner as model_runner  # noqa: E402
from engine.profiling.grid import CalibrationGrid  # noqa: E402
from engine.profiling.parts import StepParts  # noqa: E402
from engine.profiling.timer import Timer  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)
CALLS = [0]
_DEPTH = [0]


@contextmanager
def _timed(name: str, outer: bool = False) -> Iterator[None]:
    """Adds the thread-CPU time of the block to SPENT[name]: the outermost part only, so a
    wrapped part inside another is not counted twice; an ``outer`` span (the model's whole
    forward) is counted beside the parts, not instead of them."""
    CALLS[0] += 1
    if not outer:
        _DEPTH[0] += 1
    start = time.thread_time()
    try:
        yield
    finally:
        if not outer:
            _DEPTH[0] -= 1
        if outer or _DEPTH[0] == 0:
            SPENT[name] += time.thread_time() - start


def _wrap(owner: Any, attr: str, name: str, outer: bool = False) -> None:
    original = getattr(owner, attr)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with _timed(name, outer):
            return original(*args, **kwargs)

    setattr(owner, attr, wrapped)


def instrument(engine: llm_engine.LLMEngine) -> None:
    """Wrap every part of the step that a calibrated term stands for."""
    _wrap(engine.scheduler, "schedule", "schedule")
    _wrap(engine.scheduler, "update", "update")
    _wrap(model_runner, "collect_rows", "prepare")
    _wrap(model_runner, "fill_host_step", "prepare")
    _wrap(engine.runner, "_upload", "prepare")
    _wrap(engine.kv_cache, "apply", "kv_apply")
    _wrap(model_runner, "sample", "sample")
    _wrap(llama, "apply_rope", "elementwise")
    _wrap(llama, "attend", "attention")
    _wrap(F, "silu", "elementwise")
    model = engine.model
    for layer in model.decoder_layers():
        for linear in (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        ):
            _wrap(linear, "forward", "linear")
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            _wrap(norm, "forward", "elementwise")
    _wrap(model.norm, "forward", "lm_head")
    # Inside a wrapped Linear, F.linear is nested and not counted again: what is left is the
    # LM head's matmul. Likewise the embedding lookup.
    _wrap(F, "linear", "lm_head")
    _wrap(F, "embedding", "embed")


def _run_step(engine: llm_engine.LLMEngine) -> tuple[float, dict[str, float]]:
    SPENT.clear()
    CALLS[0] = 0
    output = engine.step()
    assert output.record is not None
    return output.record.cpu_s, dict(SPENT, calls=CALLS[0])


def _timer_cost_s() -> float:
    """Thread-CPU seconds that one empty timed wrapper call costs (median of 2000)."""

    def empty() -> None:
        return None

    holder = type("Holder", (), {"fn": staticmethod(empty)})
    _wrap(holder, "fn", "empty")
    costs = []
    for _ in range(2000):
        start = time.thread_time()
        holder.fn()
        costs.append(time.thread_time() - start)
    SPENT.pop("empty", None)
    return statistics.median(costs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=1, help="decoding sequences")
    parser.add_argument("--context", type=int, default=300, help="context tokens at the start")
    parser.add_argument("--steps", type=int, default=40, help="decode steps timed")
    args = parser.parse_args(argv)
    config = llm_engine.EngineConfig(model="tiny-llama", weights="random", clock="cpu")
    engine = llm_engine.LLMEngine(config)
    engine.warm_up()
    vocab = engine.model.config.vocab_size
    for i in range(args.seqs):
        ids = [(13 * j + i) % vocab for j in range(args.context)]
        params = SamplingParams(max_tokens=args.steps + 10, ignore_eos=True)
        engine.add_request(f"r{i}", ids, params, arrival_s=0.0, now_s=0.0)
    engine.scheduler.mark_arrivals_done()
    while True:  # prefills first
        output = engine.step(now_s=0.0)
        if output.record is not None and all(
            not s.is_prefill for s in output.record.batch.requests
        ):
            break
    instrument(engine)
    # The model's whole forward, beside its wrapped parts.
    _wrap(engine.runner, "model", "forward", outer=True)
    wholes, parts = [], defaultdict(list)
    for _ in range(args.steps):
        whole, spent = _run_step(engine)
        wholes.append(whole)
        for name in set(spent) | set(parts):
            parts[name].append(spent.get(name, 0.0))
    print(f"# {' '.join(['python', 'benchmarks/step_anatomy.py', *sys.argv[1:]])}")
    print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# {args.seqs} sequences decoding from context {args.context}; {args.steps} steps;")
    print("# thread-CPU ms per step, in place (mean; median in brackets)")
    mean_whole, median_whole = statistics.mean(wholes), statistics.median(wholes)
    print(f"  whole step (cpu_s)   {mean_whole * 1e3:7.3f}  [{median_whole * 1e3:.3f}]")
    calls = statistics.mean(parts.pop("calls"))
    covered = 0.0
    for name in sorted(parts):
        mean = statistics.mean(parts[name])
        if name != "forward":
            covered += mean
        print(f"  {name:20s} {mean * 1e3:7.3f}  [{statistics.median(parts[name]) * 1e3:.3f}]")
    print(f"  not in a wrapped part {(mean_whole - covered) * 1e3:7.3f}")
    overhead = _timer_cost_s()
    print(f"  (of which the {calls:.0f} timers themselves, about {calls * overhead * 1e3:.3f})")
    print("# the same parts timed in isolation (engine.profiling, back to back, medians)")
    grid = CalibrationGrid(repeats=30, warmup=3)
    timer = Timer(engine.device, grid, "cpu")
    pieces = StepParts(engine, "torch")
    context = args.context + args.steps // 2
    layers = engine.model.config.num_layers
    isolated: dict[str, Callable[[], Any]] = {
        "linear x layers": pieces.linear(args.seqs),
        "elementwise x layers": pieces.elementwise(args.seqs),
        "decode_attention x layers": pieces.decode_attention(args.seqs, context),
        "store_kv x layers": pieces.store_kv(args.seqs),
    }
    total = 0.0
    for name, fn in isolated.items():
        total += timer.median_s(fn) * layers
        print(f"  {name:26s} {timer.median_s(fn) * layers * 1e3:7.3f}")
    for name, fn in (("lm_head (+ sampling)", pieces.lm_head), ("prepare", pieces.prepare)):
        total += (spent := timer.median_s(fn(args.seqs)))
        print(f"  {name:26s} {spent * 1e3:7.3f}")
    print(f"  {'sum of the isolated parts':26s} {total * 1e3:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
