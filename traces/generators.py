"""Synthetic traces from an arrival process and a length distribution (or a `LengthTable`),
optionally with shared system prompts (so prefix caching can hit) and n > 1 sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from traces.distributions import (
    ArrivalProcess,
    FixedLengths,
    GammaArrivals,
    LengthDistribution,
    LognormalLengths,
    PoissonArrivals,
    Seed,
    TableLengths,
    UniformLengths,
    make_rng,
)
from traces.schema import LengthTable, Trace, TraceRequest

__all__ = [
    "ArrivalProcess",
    "FixedLengths",
    "GammaArrivals",
    "LengthDistribution",
    "LognormalLengths",
    "PoissonArrivals",
    "Seed",
    "SharedPrefix",
    "TableLengths",
    "UniformLengths",
    "generate_trace",
    "make_rng",
    "trace_from_length_table",
]

NumSamples = int | Sequence[int]


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """`num_prefixes` system prompts of `prefix_tokens` tokens; each request starts with one
    of them (chosen uniformly) followed by its own prompt, so its prompt is longer by
    `prefix_tokens`.

    `ids="hash"` gives `prefix_hash_ids` over `hash_block_tokens`-token blocks: blocks wholly
    inside the system prompt share ids across requests, every later block (including one that
    straddles the boundary) is unique. `ids="tokens"` gives `prompt_token_ids` instead: the
    same random system-prompt tokens, then random tokens below `vocab_size`.
    """

    num_prefixes: int = 4
    prefix_tokens: int = 512
    ids: Literal["hash", "tokens"] = "hash"
    hash_block_tokens: int = 16
    vocab_size: int = 32000

    def __post_init__(self) -> None:
        for field in ("num_prefixes", "prefix_tokens", "hash_block_tokens", "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SharedPrefix.{field} must be an int >= 1, got {value!r}")
        if self.ids not in ("hash", "tokens"):
            raise ValueError(f"SharedPrefix.ids must be 'hash' or 'tokens', got {self.ids!r}")

    def apply(self, requests: list[TraceRequest], rng: np.random.Generator) -> list[TraceRequest]:
        """The requests with the prefix prepended (lengths grow by `prefix_tokens`)."""
        choices: list[int] = rng.integers(0, self.num_prefixes, len(requests)).tolist()
        prefixes: list[list[int]] = []
        if self.ids == "tokens":
            prefixes = [
                rng.integers(0, self.vocab_size, self.prefix_tokens).tolist()
                for _ in range(self.num_prefixes)
            ]
        blocks_per_prefix = self.prefix_tokens // self.hash_block_tokens
        next_unique_id = self.num_prefixes * blocks_per_prefix
        result: list[TraceRequest] = []
        for request, choice in zip(requests, choices, strict=True):
            prompt_tokens = self.prefix_tokens + request.prompt_tokens
            token_ids = hash_ids = None
            if self.ids == "tokens":
                own = rng.integers(0, self.vocab_size, request.prompt_tokens).tolist()
                token_ids = tuple(prefixes[choice] + own)
            else:
                num_blocks = -(-prompt_tokens // self.hash_block_tokens)
                shared = range(choice * blocks_per_prefix, (choice + 1) * blocks_per_prefix)
                unique = range(next_unique_id, next_unique_id + num_blocks - blocks_per_prefix)
                next_unique_id += len(unique)
                hash_ids = (*shared, *unique)
            result.append(
                TraceRequest(
                    request.request_id,
                    request.arrival_s,
                    prompt_tokens,
                    request.output_tokens,
                    request.num_samples,
                    prompt_token_ids=token_ids,
                    prefix_hash_ids=hash_ids,
                    hash_block_tokens=self.hash_block_tokens,
                )
            )
        return result


def _num_samples(num_samples: NumSamples, count: int, rng: np.random.Generator) -> list[int]:
    choices = [num_samples] if isinstance(num_samples, int) else list(num_samples)
    if not choices or any(not isinstance(n, int) or n < 1 for n in choices):
        raise ValueError(f"num_samples must be an int >= 1 or a list of them, got {num_samples!r}")
    if len(choices) == 1:
        return choices * count
    picked: list[int] = rng.choice(np.asarray(choices), count).tolist()
    return picked


def _assemble(
    name: str,
    arrival_times: list[float],
    lengths: tuple[list[int], list[int]],
    rng: np.random.Generator,
    num_samples: NumSamples,
    shared_prefix: SharedPrefix | None,
    priorities: Sequence[int] | None = None,
) -> Trace:
    samples = _num_samples(num_samples, len(arrival_times), rng)
    requests = [
        TraceRequest(str(idx), arrival, prompt, output, n)
        for idx, (arrival, prompt, output, n) in enumerate(
            zip(arrival_times, lengths[0], lengths[1], samples, strict=True)
        )
    ]
    if shared_prefix is not None:
        requests = shared_prefix.apply(requests, rng)
    if priorities is not None:
        # (drawn last, so that the rest of a seeded trace is the same with or without them)
        choices = list(priorities)
        if not choices or any(not isinstance(p, int) or isinstance(p, bool) for p in choices):
            raise ValueError(f"priorities must be a non-empty list of ints, got {priorities!r}")
        picked: list[int] = rng.choice(np.asarray(choices), len(requests)).tolist()
        requests = [replace(r, priority=p) for r, p in zip(requests, picked, strict=True)]
    return Trace(name=name, requests=tuple(requests), format="synthetic")


def generate_trace(
    num_requests: int,
    arrivals: ArrivalProcess,
    lengths: LengthDistribution,
    *,
    seed: Seed = 0,
    name: str = "synthetic",
    num_samples: NumSamples = 1,
    shared_prefix: SharedPrefix | None = None,
    priorities: Sequence[int] | None = None,
) -> Trace:
    """A synthetic trace; the same arguments and int seed always give an equal trace.

    `num_samples` is n for every request, or a list of n values drawn uniformly per request.
    With `shared_prefix`, each prompt is a system prompt plus a drawn-length own part. With
    `priorities`, each request's priority is drawn uniformly from them.
    """
    if not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an int >= 1, got {num_requests!r}")
    rng = make_rng(seed)
    arrival_times = arrivals.sample(num_requests, rng)
    drawn = lengths.sample(num_requests, rng)
    return _assemble(name, arrival_times, drawn, rng, num_samples, shared_prefix, priorities)


def trace_from_length_table(
    table: LengthTable,
    arrivals: ArrivalProcess,
    *,
    seed: Seed = 0,
    num_requests: int | None = None,
    shuffle: bool = False,
    name: str | None = None,
    num_samples: NumSamples = 1,
    shared_prefix: SharedPrefix | None = None,
    priorities: Sequence[int] | None = None,
) -> Trace:
    """Give a length table's rows arrival times: the first `num_requests` rows (all by
    default) in file order, or a seeded random permutation of them with `shuffle=True`."""
    count = len(table) if num_requests is None else num_requests
    if not isinstance(count, int) or not 1 <= count <= len(table):
        raise ValueError(f"num_requests must be in [1, {len(table)}], got {num_requests!r}")
    rng = make_rng(seed)
    rows = rng.permutation(len(table))[:count] if shuffle else np.arange(count)
    prompts: list[int] = np.asarray(table.prompt_tokens)[rows].tolist()
    outputs: list[int] = np.asarray(table.output_tokens)[rows].tolist()
    arrival_times = arrivals.sample(count, rng)
    trace_name = name or f"{table.name}+arrivals"
    return _assemble(
        trace_name, arrival_times, (prompts, outputs), rng, num_samples, shared_prefix, priorities
    )
