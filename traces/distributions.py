"""Seeded random draws for synthetic traces: arrival processes (Poisson, Gamma) and length
distributions (fixed, uniform, lognormal, sampled from a `LengthTable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from traces.schema import LengthTable

Seed = int | np.random.Generator


def make_rng(seed: Seed) -> np.random.Generator:
    """A numpy Generator from an int seed (or the Generator itself, to share one stream)."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _positive(owner: str, field: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{owner}.{field} must be > 0, got {value!r}")


class ArrivalProcess(Protocol):
    """Draws arrival times in seconds: non-decreasing, the first at 0.0."""

    def sample(self, num_requests: int, rng: np.random.Generator) -> list[float]: ...


class LengthDistribution(Protocol):
    """Draws (prompt_tokens, output_tokens) lists, every count >= 1."""

    def sample(
        self, num_requests: int, rng: np.random.Generator
    ) -> tuple[list[int], list[int]]: ...


def _arrivals_from_gaps(gaps: np.ndarray) -> list[float]:
    times: list[float] = np.concatenate(([0.0], np.cumsum(gaps))).tolist()
    return times


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Exponential gaps with mean 1 / `rate_per_s`."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("PoissonArrivals", "rate_per_s", self.rate_per_s)

    def sample(self, num_requests: int, rng: np.random.Generator) -> list[float]:
        return _arrivals_from_gaps(rng.exponential(1.0 / self.rate_per_s, num_requests - 1))


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gamma gaps with mean 1 / `rate_per_s` and coefficient of variation `cv` (std / mean):
    `cv=1` is Poisson, larger is burstier, smaller is more regular."""

    rate_per_s: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        _positive("GammaArrivals", "rate_per_s", self.rate_per_s)
        _positive("GammaArrivals", "cv", self.cv)

    def sample(self, num_requests: int, rng: np.random.Generator) -> list[float]:
        shape = 1.0 / self.cv**2
        scale = 1.0 / (self.rate_per_s * shape)
        return _arrivals_from_gaps(rng.gamma(shape, scale, num_requests - 1))


def _ints(values: np.ndarray) -> list[int]:
    result: list[int] = values.astype(np.int64).tolist()
    return result


@dataclass(frozen=True, slots=True)
class FixedLengths:
    """Every request has the same prompt and output length."""

    prompt_tokens: int = 256
    output_tokens: int = 128

    def __post_init__(self) -> None:
        _positive("FixedLengths", "prompt_tokens", self.prompt_tokens)
        _positive("FixedLengths", "output_tokens", self.output_tokens)

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        return [self.prompt_tokens] * num_requests, [self.output_tokens] * num_requests


@dataclass(frozen=True, slots=True)
class UniformLengths:
    """Prompt and output lengths drawn independently and uniformly from inclusive ranges."""

    min_prompt_tokens: int = 32
    max_prompt_tokens: int = 2048
    min_output_tokens: int = 16
    max_output_tokens: int = 1024

    def __post_init__(self) -> None:
        for kind in ("prompt", "output"):
            low = getattr(self, f"min_{kind}_tokens")
            high = getattr(self, f"max_{kind}_tokens")
            _positive("UniformLengths", f"min_{kind}_tokens", low)
            if high < low:
                raise ValueError(f"UniformLengths.max_{kind}_tokens must be >= {low}, got {high}")

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        prompts = rng.integers(self.min_prompt_tokens, self.max_prompt_tokens + 1, num_requests)
        outputs = rng.integers(self.min_output_tokens, self.max_output_tokens + 1, num_requests)
        return _ints(prompts), _ints(outputs)


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Lognormal lengths given by median and sigma (of the log), rounded and clipped to
    [1, max]. The defaults give moderate ShareGPT-like chat lengths."""

    prompt_median: float = 256.0
    prompt_sigma: float = 0.9
    output_median: float = 128.0
    output_sigma: float = 0.8
    max_prompt_tokens: int = 2048
    max_output_tokens: int = 1024

    def __post_init__(self) -> None:
        for field in ("prompt_median", "output_median", "max_prompt_tokens", "max_output_tokens"):
            _positive("LognormalLengths", field, getattr(self, field))
        for field in ("prompt_sigma", "output_sigma"):
            if getattr(self, field) < 0:
                raise ValueError(
                    f"LognormalLengths.{field} must be >= 0, got {getattr(self, field)!r}"
                )

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        prompts = rng.lognormal(np.log(self.prompt_median), self.prompt_sigma, num_requests)
        outputs = rng.lognormal(np.log(self.output_median), self.output_sigma, num_requests)
        prompts = np.clip(np.rint(prompts), 1, self.max_prompt_tokens)
        outputs = np.clip(np.rint(outputs), 1, self.max_output_tokens)
        return _ints(prompts), _ints(outputs)


@dataclass(frozen=True, slots=True)
class TableLengths:
    """(prompt, output) pairs drawn with replacement from the rows of a `LengthTable`."""

    table: LengthTable

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        rows = rng.integers(0, len(self.table), num_requests)
        prompts = np.asarray(self.table.prompt_tokens)[rows]
        outputs = np.asarray(self.table.output_tokens)[rows]
        return _ints(prompts), _ints(outputs)
