"""Synthetic traces: seeded determinism, arrival rate and burstiness, length distributions,
shared system prompts that really share prefix ids / token ids, and n > 1 sampling."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from traces import LengthTable
from traces.generators import (
    FixedLengths,
    GammaArrivals,
    LognormalLengths,
    PoissonArrivals,
    SharedPrefix,
    TableLengths,
    UniformLengths,
    generate_trace,
    trace_from_length_table,
)
from traces.schema import Trace


def _gaps(trace: Trace) -> list[float]:
    times = [r.arrival_s for r in trace.requests]
    return [b - a for a, b in itertools.pairwise(times)]


def test_same_seed_same_trace_different_seed_different() -> None:
    def make(seed: int) -> Trace:
        return generate_trace(
            300,
            GammaArrivals(3.0, cv=2.0),
            LognormalLengths(),
            seed=seed,
            num_samples=[1, 2],
            shared_prefix=SharedPrefix(3, 100),
        )

    assert make(11) == make(11)
    assert make(11) != make(12)
    assert make(11).requests[0].arrival_s == 0.0


@pytest.mark.parametrize(
    ("arrivals", "cv"),
    [(PoissonArrivals(5.0), 1.0), (GammaArrivals(5.0, 3.0), 3.0), (GammaArrivals(5.0, 0.5), 0.5)],
)
def test_rate_and_burstiness(arrivals: PoissonArrivals | GammaArrivals, cv: float) -> None:
    # 100k gaps: the rate's standard error is cv/316 (<1%), the cv's about 1.5%; the bounds
    # are several standard errors wide yet fail for a wrong rate or an ignored cv.
    trace = generate_trace(100_000, arrivals, FixedLengths(1, 1), seed=3)
    gaps = _gaps(trace)
    assert all(gap >= 0 for gap in gaps)
    assert trace.mean_rate_per_s == pytest.approx(5.0, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    prompts, outputs = UniformLengths(10, 20, 1, 3).sample(5000, rng)
    assert (min(prompts), max(prompts), min(outputs), max(outputs)) == (10, 20, 1, 3)
    prompts, outputs = LognormalLengths(200, 0.5, 50, 0.5, 4000, 4000).sample(20_000, rng)
    assert statistics.median(prompts) == pytest.approx(200, rel=0.05)
    assert statistics.median(outputs) == pytest.approx(50, rel=0.05)
    prompts, outputs = LognormalLengths(200, 2.0, 50, 2.0, 300, 60).sample(2000, rng)
    assert max(prompts) == 300 and max(outputs) == 60 and min(prompts + outputs) >= 1
    assert FixedLengths(7, 9).sample(3, rng) == ([7, 7, 7], [9, 9, 9])
    table = LengthTable("t", (1, 2, 3), (10, 20, 30))
    prompts, outputs = TableLengths(table).sample(1000, rng)
    assert {(p, o) for p, o in zip(prompts, outputs, strict=True)} == {(1, 10), (2, 20), (3, 30)}


def test_shared_prefix_hash_ids_are_shared() -> None:
    shared = SharedPrefix(num_prefixes=3, prefix_tokens=100, hash_block_tokens=16)
    lengths = UniformLengths(1, 200, 1, 10)
    trace = generate_trace(500, PoissonArrivals(4.0), lengths, seed=5, shared_prefix=shared)
    full_blocks = 100 // 16
    heads: Counter[tuple[int, ...]] = Counter()
    tails: list[int] = []
    for request in trace.requests:
        ids = request.prefix_hash_ids
        assert ids is not None and request.hash_block_tokens == 16
        assert request.prompt_tokens >= 101
        assert len(ids) == math.ceil(request.prompt_tokens / 16)
        heads[ids[:full_blocks]] += 1
        tails.extend(ids[full_blocks:])
    assert len(heads) == 3 and min(heads.values()) > 100  # every system prompt is reused
    assert len(tails) == len(set(tails))  # own blocks (incl. the straddling one) never hit
    assert not set(tails) & {i for head in heads for i in head}
    assert trace.length_stats()["hash_block_reuse"] > 0.0


def test_shared_prefix_token_ids() -> None:
    shared = SharedPrefix(num_prefixes=2, prefix_tokens=30, ids="tokens", vocab_size=1000)
    trace = generate_trace(50, PoissonArrivals(1.0), FixedLengths(5, 3), shared_prefix=shared)
    prefixes = set()
    for request in trace.requests:
        assert request.prompt_token_ids is not None and request.prefix_hash_ids is None
        assert len(request.prompt_token_ids) == request.prompt_tokens == 35
        assert all(0 <= t < 1000 for t in request.prompt_token_ids)
        prefixes.add(request.prompt_token_ids[:30])
    assert len(prefixes) == 2


def test_parallel_sampling() -> None:
    fixed = generate_trace(20, PoissonArrivals(1.0), FixedLengths(), num_samples=4)
    assert {r.num_samples for r in fixed.requests} == {4}
    mixed = generate_trace(500, PoissonArrivals(1.0), FixedLengths(), num_samples=(1, 2, 8))
    assert {r.num_samples for r in mixed.requests} == {1, 2, 8}
    with pytest.raises(ValueError, match="num_samples"):
        generate_trace(5, PoissonArrivals(1.0), FixedLengths(), num_samples=0)


def test_trace_from_length_table_order_and_shuffle() -> None:
    table = LengthTable("t", tuple(range(1, 11)), tuple(range(11, 21)))
    trace = trace_from_length_table(table, PoissonArrivals(2.0), num_requests=4)
    assert [r.prompt_tokens for r in trace.requests] == [1, 2, 3, 4]
    assert trace.name == "t+arrivals"
    shuffled = trace_from_length_table(table, PoissonArrivals(2.0), shuffle=True, seed=1)
    assert sorted(r.prompt_tokens for r in shuffled.requests) == list(range(1, 11))
    assert [r.prompt_tokens for r in shuffled.requests] != list(range(1, 11))
    assert all(r.output_tokens == r.prompt_tokens + 10 for r in shuffled.requests)
    with pytest.raises(ValueError, match="num_requests"):
        trace_from_length_table(table, PoissonArrivals(2.0), num_requests=11)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: PoissonArrivals(0.0), "rate_per_s"),
        (lambda: GammaArrivals(1.0, cv=-1.0), "cv"),
        (lambda: UniformLengths(10, 5), "max_prompt_tokens"),
        (lambda: LognormalLengths(prompt_sigma=-0.1), "prompt_sigma"),
        (lambda: SharedPrefix(num_prefixes=0), "num_prefixes"),
        (lambda: generate_trace(0, PoissonArrivals(1.0), FixedLengths()), "num_requests"),
    ],
)
def test_bad_generator_arguments_name_the_field(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()
