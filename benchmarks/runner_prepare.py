"""The runner's host work per decode step on CPU: preparing the step's inputs from its batch,
and sampling it, for N requests decoding together (tiny-llama, one torch thread, thread-CPU
time, the best of 5 rounds of 50 calls).

    python benchmarks/runner_prepare.py --seqs 1,16,64,256
    python benchmarks/runner_prepare.py --tree /path/to/an/older/checkout   # the same, there

``--tree`` runs an older checkout's engine instead: before the persistent batch (8d1f2ca) the
preparation was ``ModelRunner._prepare`` plus ``build_metadata`` and the input tensors, which
is what this times there.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def best_us(fn: Callable[[], Any], calls: int = 50, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return 1e6 * best


def decoding_engine(num_seqs: int) -> Any:
    """An engine with ``num_seqs`` requests, all past their prompts."""
    from engine import LLM, SamplingParams

    engine = LLM(model="tiny-llama", weights="random", max_num_seqs=max(num_seqs, 1)).engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    for i in range(num_seqs):
        prompt = [1 + (i * 7 + j) % 8000 for j in range(200)]
        engine.add_request(f"r{i}", prompt, params, 0.0)
    engine.scheduler.mark_arrivals_done()
    while True:
        batch = engine.step().batch
        if len(batch.requests) == num_seqs and not any(r.is_prefill for r in batch.requests):
            return engine


def prepare_fn(engine: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(prepare, sample) closures for the engine's next batch, in whichever runner it has."""
    import torch

    runner = engine.runner
    batch = engine.scheduler.schedule(0.0)
    if hasattr(runner, "_prepare"):  # the runner before the persistent batch
        from engine.attention import build_metadata
        from engine.sampling import sample

        def prepare() -> Any:
            rows, specs, _ = runner._prepare(batch)
            meta = build_metadata(
                rows.decode_seq_lens, rows.decode_tables, rows.chunks, rows.chunk_tables,
                runner.kv_cache.block_size, runner.device, runner.backend,
            )  # fmt: skip
            ids = torch.tensor(rows.token_ids, dtype=torch.int64)
            positions = torch.tensor(rows.positions, dtype=torch.int64)
            return meta, ids, positions, torch.tensor(sorted({s.row for s in specs}))

        specs = runner._prepare(batch)[1]
    else:
        from engine.model_runner import sample
        from engine.step_inputs import collect_rows, fill_host_step

        if batch.block_tables:
            runner.tables.update(batch.block_tables)

        def prepare() -> Any:
            rows = collect_rows(batch, runner.tables, runner.params_of)
            host = fill_host_step(rows, runner.tables, runner.buffers, runner.block_size)
            return runner._upload(host)

        specs = prepare()[1]
    logits = torch.randn(len(batch.requests), engine.model.config.vocab_size)
    return prepare, lambda: sample(logits, specs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="1,16,64,256")
    parser.add_argument("--tree", default=str(ROOT), help="the checkout whose engine runs")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    import torch

    torch.set_num_threads(1)
    for num_seqs in [int(s) for s in args.seqs.split(",")]:
        prepare, sample = prepare_fn(decoding_engine(num_seqs))
        print(
            f"{num_seqs:4d} sequences: prepare {best_us(prepare):8.0f} us, "
            f"sample {best_us(sample):8.0f} us"
        )


if __name__ == "__main__":
    main()
