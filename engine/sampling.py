"""Sampling parameters (vLLM's names) and the sampler: greedy, temperature, top-k, top-p.

Every random draw is keyed by (request seed, sample index, output position) alone, so a request's
tokens do not depend on which other requests share its batches, nor on when it was preempted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request's outputs.

    ``temperature`` 0 is greedy. ``top_k`` -1 and ``top_p`` 1.0 keep every token. ``n`` samples
    run as the scheduler's ``parallel_sampling`` says: n child requests as in vLLM v1 (a seed
    given becomes seed + index for child index), or the prompt's KV forked copy-on-write.
    Generation stops at ``max_tokens`` or, unless
    ``ignore_eos``, at the model's end-of-sequence token. ``seed`` None takes the engine's seed and
    the request's index.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """One token to draw: from logits row ``row``, for sample ``sample_idx`` of a request whose
    random stream is ``seed``, at output position ``position``."""

    row: int
    params: SamplingParams
    seed: int
    sample_idx: int
    position: int


def draw_seed(seed: int, sample_idx: int, position: int) -> int:
    # Hashes of int tuples are the same in every process (no hash randomisation for ints).
    return hash((seed, sample_idx, position)) & 0x7FFF_FFFF_FFFF_FFFF


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities of one row [vocab] after temperature, top-k and top-p (fp32)."""
    scaled = logits.float() / params.temperature
    if params.top_k != -1 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop_sorted = before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def sample(logits: torch.Tensor, specs: list[SampleSpec]) -> list[int]:
    """Draw one token per spec from ``logits`` [rows, vocab]."""
    greedy_rows = [s.row for s in specs if s.params.greedy]
    greedy_tokens: dict[int, int] = {}
    if greedy_rows:
        picked = torch.argmax(logits[greedy_rows], dim=-1).tolist()
        greedy_tokens = dict(zip(greedy_rows, picked, strict=True))
    out: list[int] = []
    for spec in specs:
        if spec.params.greedy:
            out.append(greedy_tokens[spec.row])
            continue
        probs = filtered_probs(logits[spec.row], spec.params)
        generator = torch.Generator(device=probs.device)
        generator.manual_seed(draw_seed(spec.seed, spec.sample_idx, spec.position))
        # Exponential-race sampling: argmax p / E with E ~ Exp(1) draws from p.
        noise = torch.empty_like(probs).exponential_(generator=generator)
        out.append(int(torch.argmax(probs / noise).item()))
    return out
