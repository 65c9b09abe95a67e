"""The requests an engine warms up with before it serves (``LLMEngine.warm_up``).

A short one always: one prefill and a few decodes pay the one-off lazy initialisation. The
shapes warm-up (``python -m engine run --warm-up shapes``) runs what a replay meets early:
every decode batch size up to ``max_num_seqs`` (request ``i`` of ``n`` decodes ``n - i`` tokens
after its prefill, so the decode batch shrinks one at a time from ``n`` to 1) over contexts from
a few to a few thousand tokens (one prompt in eight is long), under the engine's own policy, so
that chunked prefill mixes chunks into decode steps as it will.

Why it exists, and why it is off by default: on the H200 (2026-11-27) the eager engine's first
seconds of an ``example.csv`` replay ran slower than the rest (decode at batch 9: 18.5 ms in
the first second, 10.7 ms at second ten), and the engine with CUDA graphs, whose capture runs
every decode batch size once, did not. With the shapes warm-up, the next machine's eager runs
still started slow in one run of two, and the mixed steps of the engine with graphs were slower
(26-29 ms against 19-22 ms without it, on another machine): not shown to help, so it waits for
an A/B run on one machine (benchmarks/results/gpu-h200-2026-11-27/README.md)."""

from __future__ import annotations

SHORT_PROMPT_TOKENS = 32
SHORT_OUTPUT_TOKENS = 3
SHAPES_PROMPT_TOKENS = 32
SHAPES_LONG_PROMPT_TOKENS = (544, 1040, 2080, 4128)
SHAPES_LONG_EVERY = 8
SHAPES_CACHE_SHARE = 0.9  # of the usable KV cache, at most


def short_request(max_len: int) -> tuple[int, int]:
    """(prompt tokens, output tokens) of the short warm-up request under ``max_len``."""
    prompt = min(SHORT_PROMPT_TOKENS, max(1, max_len - SHORT_OUTPUT_TOKENS))
    return prompt, max(1, min(SHORT_OUTPUT_TOKENS, max_len - prompt))


def shape_requests(
    max_num_seqs: int, max_len: int, usable_blocks: int, block_size: int
) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of the shapes warm-up: ``n`` requests, ``n`` the largest
    of ``max_num_seqs``, its half, its quarter... whose blocks take at most
    ``SHAPES_CACHE_SHARE`` of ``usable_blocks`` (so none is preempted); empty when not even
    one request fits. Every request fits ``max_len``."""
    for positive, name in ((max_num_seqs, "max_num_seqs"), (max_len, "max_len"),
                           (block_size, "block_size")):  # fmt: skip
        if positive < 1:
            raise ValueError(f"{name} must be >= 1, got {positive}")
    budget = int(usable_blocks * SHAPES_CACHE_SHARE)
    n = max_num_seqs
    while n >= 1:
        requests = _shape_requests(n, max_len)
        if requests and sum(-(-(p + o) // block_size) for p, o in requests) <= budget:
            return requests
        n //= 2
    return []


def _shape_requests(n: int, max_len: int) -> list[tuple[int, int]]:
    requests = []
    for i in range(n):
        outputs = n - i + 1  # the first comes from the prefill: n - i decodes
        if i % SHAPES_LONG_EVERY == SHAPES_LONG_EVERY - 1:
            long = SHAPES_LONG_PROMPT_TOKENS[
                (i // SHAPES_LONG_EVERY) % len(SHAPES_LONG_PROMPT_TOKENS)
            ]
            prompt = long
        else:
            prompt = SHAPES_PROMPT_TOKENS
        prompt = min(prompt, max_len - outputs)
        if prompt < 1:
            continue  # a model too short for this many outputs: the request is left out
        requests.append((prompt, outputs))
    return requests
