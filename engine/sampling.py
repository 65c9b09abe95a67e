"""Sampling parameters (vLLM's names) and the batched sampler: greedy, temperature, top-k,
top-p for a whole step in a few kernels and one device-to-host copy.

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
    the request's id (the same in every process).
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
    """Probabilities of one row [vocab] after temperature, top-k and top-p (fp32): the
    per-row reference the batched ``sample`` must equal bit for bit."""
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
    """Draw one token per spec from ``logits`` [rows, vocab], the whole batch at once:
    greedy rows by one argmax, the others through temperature, top-k and top-p as [rows]
    parameters over the batch, each with its own seeded generator for the noise; one
    device-to-host copy of the sampled ids. Each row's token is the one the per-row
    reference (``filtered_probs`` and its own draw) gives, whatever else is in the batch."""
    if not specs:
        return []
    device = logits.device
    rows = [s.row for s in specs]
    if rows == list(range(len(logits))):
        picked = logits  # (each row once, in order: the common case needs no gather)
    else:
        index = torch.tensor(rows, dtype=torch.int64, pin_memory=_pin(device))
        picked = logits.index_select(0, index.to(device, non_blocking=True))
    tokens = torch.argmax(picked, dim=-1)
    random = [i for i, s in enumerate(specs) if not s.params.greedy]
    if random:
        chosen = [specs[i] for i in random]
        where = torch.tensor(random, dtype=torch.int64, pin_memory=_pin(device))
        where = where.to(device, non_blocking=True)
        probs = _batched_probs(picked.index_select(0, where), [s.params for s in chosen])
        noise = torch.empty_like(probs)
        for row, spec in enumerate(chosen):
            generator = torch.Generator(device=device)
            generator.manual_seed(draw_seed(spec.seed, spec.sample_idx, spec.position))
            # Exponential-race sampling: argmax p / E with E ~ Exp(1) draws from p.
            noise[row].exponential_(generator=generator)
        tokens.index_copy_(0, where, torch.argmax(probs / noise, dim=-1))
    out: list[int] = tokens.tolist()
    return out


def _pin(device: torch.device) -> bool:
    return device.type == "cuda"


def _batched_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """``filtered_probs`` for every row at once (fp32): top-k and top-p touch only the rows
    that ask for them, so the other rows keep the reference's exact arithmetic."""
    device = logits.device
    pin = _pin(device)

    def column(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        host = torch.tensor(values, dtype=dtype, pin_memory=pin)
        return host.to(device, non_blocking=True)

    vocab = logits.shape[-1]
    temperatures = column([p.temperature for p in params], torch.float32)[:, None]
    if device.type == "cuda":
        # The reference divides by a Python float, which CUDA computes as a multiply by its
        # fp32 reciprocal (torch's div kernel for a CPU scalar divisor): the same bits here.
        scaled = logits.float() * temperatures.reciprocal()
    else:
        scaled = logits.float() / temperatures
    top_k = [i for i, p in enumerate(params) if p.top_k != -1 and p.top_k < vocab]
    if top_k:
        where = column(top_k, torch.int64)
        ks = column([params[i].top_k for i in top_k], torch.int64)
        sub = scaled.index_select(0, where)
        kth = torch.topk(sub, max(params[i].top_k for i in top_k)).values.gather(1, ks[:, None] - 1)
        scaled.index_copy_(0, where, sub.masked_fill(sub < kth, float("-inf")))
    probs = torch.softmax(scaled, dim=-1)
    top_p = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if top_p:
        where = column(top_p, torch.int64)
        sub = probs.index_select(0, where)
        sorted_probs, order = torch.sort(sub, descending=True, dim=-1)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = before >= column([params[i].top_p for i in top_p], torch.float32)[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        sub = sub.masked_fill(drop, 0.0)
        probs.index_copy_(0, where, sub / sub.sum(dim=-1, keepdim=True))
    return probs
