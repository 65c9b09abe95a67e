"""Benchmark of the shared core: scheduler request-steps per second at 256 running requests in
steady state (continuous and chunked), and block-allocator operations per second.

Run: python benchmarks/bench_core.py [--steps N]   (results: benchmarks/results/core.txt)
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import random
import time

from core.batch import StepResult
from core.block_allocator import BlockAllocator, OutOfBlocksError
from core.config import CacheConfig, SchedulerConfig
from core.request import Request
from core.scheduler import Scheduler

NUM_RUNNING = 256


def bench_scheduler(policy: str, num_steps: int, prefix_caching: bool) -> tuple[float, int]:
    """Steady state: whenever a request finishes, a new one arrives, so 256 keep running."""
    rng = random.Random(0)
    cache = CacheConfig(
        num_blocks=NUM_RUNNING * 80,
        max_model_len=4096,
        enable_prefix_caching=prefix_caching,
        memory_model="paged",
    )
    sched = Scheduler(
        cache,
        SchedulerConfig(policy=policy, max_num_seqs=NUM_RUNNING),
    )
    counter = 0

    def arrive(now_s: float) -> None:
        nonlocal counter
        sched.add_request(
            Request(str(counter), now_s, rng.randint(64, 512), rng.randint(32, 512)), now_s
        )
        counter += 1

    now_s = 0.0
    for _ in range(NUM_RUNNING):
        arrive(now_s)
    # Warm up until every request has been admitted and prefilled.
    for _ in range(50):
        batch = sched.schedule(now_s)
        now_s += 0.01
        for _ in sched.update(batch, StepResult(0.01), now_s):
            arrive(now_s)
    request_steps = 0
    start = time.perf_counter()
    for _ in range(num_steps):
        batch = sched.schedule(now_s)
        request_steps += len(batch.requests)
        now_s += 0.01
        for _ in sched.update(batch, StepResult(0.01), now_s):
            arrive(now_s)
    return time.perf_counter() - start, request_steps


def bench_allocator(num_ops: int) -> float:
    """Mixed allocate / append / fork / free on a 4096-block pool; returns ops per second."""
    rng = random.Random(1)
    alloc = BlockAllocator(num_blocks=4096, block_size=16, num_cpu_blocks=0)
    live: list[int] = []
    next_id = 0
    ops = 0
    start = time.perf_counter()
    while ops < num_ops:
        roll = rng.random()
        if live and (roll < 0.6):
            seq = live[rng.randrange(len(live))]
            with contextlib.suppress(OutOfBlocksError):  # (changes nothing if it raises)
                alloc.append_slots(seq, 1)
        elif live and roll < 0.65 and alloc.num_free_blocks > 64:
            alloc.fork(live[rng.randrange(len(live))], next_id)
            live.append(next_id)
            next_id += 1
        elif roll < 0.85 and alloc.num_free_blocks > 64:
            alloc.allocate(next_id, rng.randint(1, 512))
            live.append(next_id)
            next_id += 1
        elif live:
            alloc.free(live.pop(rng.randrange(len(live))))
        ops += 1
    return num_ops / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000, help="measured steps per policy")
    parser.add_argument("--allocator-ops", type=int, default=500_000)
    args = parser.parse_args()
    print(f"# python {platform.python_version()} on {platform.machine()}, {NUM_RUNNING} running")
    for policy in ("continuous", "chunked"):
        for prefix in (False, True):
            elapsed, request_steps = bench_scheduler(policy, args.steps, prefix)
            print(
                f"scheduler {policy:<10} prefix_caching={prefix!s:<5} "
                f"{request_steps / elapsed:>10,.0f} request-steps/s  "
                f"({args.steps / elapsed:,.0f} steps/s, {request_steps / args.steps:.0f} req/step)"
            )
    print(f"allocator mixed ops      {bench_allocator(args.allocator_ops):>10,.0f} ops/s")


if __name__ == "__main__":
    main()
