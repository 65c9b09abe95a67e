"""Reproduce the vLLM paper's KV-memory table (Figure 2): the share of KV cache memory that
holds real tokens under contiguous reservation (Orca Max / Pow2 / Oracle) and under paged
blocks, for OPT-13B on one A100-40GB serving ShareGPT-length requests.

Setting: ShareGPT request lengths (the etalon ShareGPT table in ../shared/traces, rows whose
prompt + output fit OPT-13B's 2048-token context), Poisson arrivals fast enough to keep the
cache full, iteration-level (continuous) batching in every case so only the memory model
differs. The share is real-token slots over all KV slots, averaged over the steps in which
requests were waiting (the cache was the bottleneck).

Run: python benchmarks/vllm_memory_table.py [--rate 4] [--requests 2000]
(results committed in benchmarks/results/vllm_memory_table.txt)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.settings import build, with_settings
from records.schema import SLOT_COLUMNS
from sim.run import RunConfig, RunResult, simulate
from traces.distributions import PoissonArrivals
from traces.generators import trace_from_length_table
from traces.loaders import load_length_table
from traces.schema import LengthTable

ROOT = Path(__file__).resolve().parents[1]
SHAREGPT = (
    ROOT.parent / "shared/traces/etalon_processed/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
)
PAPER = {"max": 20.4, "pow2": 26.8, "oracle": 38.2, "paged": 96.3}
MAX_MODEL_LEN = 2048  # OPT-13B


def saturated_share(result: RunResult) -> tuple[float, float]:
    """(real-token share of all KV slots, share of steps) over steps with a waiting queue."""
    steps = result.steps.to_frame()
    busy = steps[steps["num_waiting"] > 0]
    kinds = list(SLOT_COLUMNS)
    total = busy[kinds].to_numpy().sum()
    return busy["real_token_slots"].sum() / total, busy["num_steps"].sum() / steps[
        "num_steps"
    ].sum()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharegpt", type=Path, default=SHAREGPT, help="ShareGPT length table")
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    if not args.sharegpt.exists():
        print(f"error: ShareGPT length table not found at {args.sharegpt}", file=sys.stderr)
        return 2
    table = load_length_table(args.sharegpt)
    keep = [
        (p, o)
        for p, o in zip(table.prompt_tokens, table.output_tokens, strict=True)
        if p + o <= MAX_MODEL_LEN
    ]
    fitted = LengthTable("sharegpt<=2048", tuple(p for p, _ in keep), tuple(o for _, o in keep))
    trace = trace_from_length_table(
        fitted, PoissonArrivals(args.rate), seed=0, num_requests=args.requests, shuffle=True
    )
    base = build(
        RunConfig,
        policy="continuous",
        model="OPT-13B",
        hardware="A100-40GB",
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_MODEL_LEN,
    )
    print(
        f"# OPT-13B on A100-40GB, {len(trace)} ShareGPT requests (of {len(keep)} rows with "
        f"prompt+output <= {MAX_MODEL_LEN}), Poisson {args.rate}/s, continuous batching"
    )
    prompts = [r.prompt_tokens for r in trace.requests]
    outputs = [r.output_tokens for r in trace.requests]
    print(
        f"# mean prompt {sum(prompts) / len(prompts):.0f} tokens, mean output "
        f"{sum(outputs) / len(outputs):.0f} tokens (the paper's ShareGPT: 161 and 338)"
    )
    print(
        f"{'memory':<22}{'real tokens (ours)':>20}{'paper':>8}{'saturated steps':>17}"
        f"{'KV blocks':>11}{'req/s':>8}{'preempt':>9}"
    )
    cases = [("contiguous", r) for r in ("max", "pow2", "oracle")] + [("paged", "max")]
    for memory, reservation in cases:
        config = with_settings(base, memory_model=memory, reservation=reservation)
        result = simulate(trace, config)
        share, saturated = saturated_share(result)
        label = f"contiguous ({reservation})" if memory == "contiguous" else "paged (block 16)"
        key = reservation if memory == "contiguous" else "paged"
        print(
            f"{label:<22}{share:>19.1%}{PAPER[key]:>7.1f}%{saturated:>16.0%}"
            f"{result.num_blocks:>11}{result.summary['request_throughput']:>8.2f}"
            f"{result.summary['num_preemptions']:>9}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
