"""The workloads of ``vllm_conformance.py``: a trace's first requests with token ids made up
from their prefix hashes, as both schedulers get them (``Item``), the n requests vLLM's front
end makes of one with n > 1, and the cut that fits them to a ``max_model_len``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from traces.loaders import load_trace

OUTPUT_TOKEN_BASE = 1_000_000  # a request's sampled tokens: one id per request


@dataclass(frozen=True, slots=True)
class Item:
    """One request of a workload, as both schedulers get it."""

    request_id: str
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    output_token: int
    # Samples: our core gets one request with n and fans it out itself (workloads marked
    # "n>1"); vLLM gets the n child requests its front end makes (``children``).
    n: int = 1
    # Under --scheduling priority: lower is served first (``with_priorities``).
    priority: int = 0


def token_ids(index: int, prompt_tokens: int, hash_ids: Sequence[int] | None, hb: int) -> list[int]:
    """Prompt token ids: equal hash-block ids give equal tokens, the rest is unique."""
    ids: list[int] = []
    for pos in range(prompt_tokens):
        block = pos // hb
        if hash_ids is not None and block < len(hash_ids):
            ids.append(10 + hash_ids[block] * hb + pos % hb)
        else:
            ids.append(500_000_000 + index * 100_000 + pos)
    return ids


def load_items(
    path: Path, limit: int, at_zero: bool, max_output: int, samples: bool = False
) -> list[Item]:
    """The trace's first ``limit`` requests. vLLM v1 fans n > 1 out into n requests with the
    same prompt before its scheduler (the frontend's ``ParentRequest``): without ``samples``
    both schedulers get those n requests; with it our core gets one request with n, which its
    own fan-out (``parallel_sampling="fan_out"``, its default) must turn into the same."""
    trace = load_trace(path)
    items: list[Item] = []
    for index, r in enumerate(trace.requests[:limit]):
        ids = token_ids(index, r.prompt_tokens, r.prefix_hash_ids, r.hash_block_tokens)
        if r.prompt_token_ids is not None:
            ids = list(r.prompt_token_ids)
        arrival = 0.0 if at_zero else r.arrival_s - trace.requests[0].arrival_s
        output = min(r.output_tokens, max_output)
        if samples:
            token = OUTPUT_TOKEN_BASE + len(items) * 16
            items.append(Item(r.request_id, arrival, tuple(ids), output, token, r.num_samples))
            continue
        for sample in range(r.num_samples):
            rid = r.request_id if r.num_samples == 1 else f"{r.request_id}_{sample}"
            items.append(Item(rid, arrival, tuple(ids), output, OUTPUT_TOKEN_BASE + len(items)))
    return items


def children(it: Item) -> list[Item]:
    """The requests vLLM's front end makes of ``it``: ``{index}_{request_id}`` for n > 1
    (``ParentRequest.get_child_info``), each sampling its own token id."""
    if it.n == 1:
        return [it]
    return [
        Item(f"{i}_{it.request_id}", it.arrival_s, it.prompt_token_ids, it.max_tokens,
             it.output_token + i, 1, it.priority)
        for i in range(it.n)
    ]  # fmt: skip


def fit_to(items: list[Item], max_model_len: int) -> list[Item]:
    """Cut outputs to a quarter of max_model_len at most, then prompts so that prompt + output
    <= max_model_len (both sides alike): vLLM ends a request at max_model_len."""
    out: list[Item] = []
    for it in items:
        max_tokens = min(it.max_tokens, max(1, max_model_len // 4))
        prompt = it.prompt_token_ids[: max_model_len - max_tokens]
        out.append(dataclasses.replace(it, prompt_token_ids=prompt, max_tokens=max_tokens))
    return out


def with_priorities(items: list[Item]) -> list[Item]:
    """The same requests in three priority classes, 0 to 2, drawn by position so that later
    arrivals often outrank earlier ones (priority scheduling reorders them and preempts by it)."""
    return [dataclasses.replace(it, priority=(7 * idx + 2) % 3) for idx, it in enumerate(items)]
