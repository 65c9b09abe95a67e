"""The batch-1 decode step of the real engine on CPU: one request alone, prefilled, then decoded
step by step through ``LLMEngine.step`` (scheduler, input preparation, model, sampling and
bookkeeping all included). This is the step that bounds the bundled example trace's tail.

    python benchmarks/engine_lone_decode.py --prompt 1723 --output 792   # the last request
    python benchmarks/engine_lone_decode.py --prompt 64 --output 800

Prints the median and mean per step by the engine thread's CPU time (``time.thread_time``, which
other work on the machine inflates less than the wall) and by the wall clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--prompt", type=int, default=1723, help="prompt tokens")
    parser.add_argument("--output", type=int, default=792, help="output tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LLM(model=args.model, weights="random").engine
    engine.warm_up()
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)
    engine.add_request("lone", list(range(1, args.prompt + 1)), params, 0.0)
    engine.scheduler.mark_arrivals_done()
    engine.step()  # the prefill
    cpu, wall = [], []
    while engine.has_unfinished():
        c0, w0 = time.thread_time(), time.perf_counter()
        engine.step()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{args.model} prompt {args.prompt} output {args.output}, {args.threads} thread(s), "
        f"load {load:.2f}: {len(cpu)} decode steps, thread CPU median "
        f"{1e3 * statistics.median(cpu):.2f} ms mean {1e3 * statistics.mean(cpu):.2f} ms, "
        f"wall median {1e3 * statistics.median(wall):.2f} ms"
    )


if __name__ == "__main__":
    main()
