"""The prefix hit rate is hit tokens over looked-up tokens, summed over every admission: within
[0, 1] even when recompute preemptions make requests look their own blocks up again."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.request import Request, RequestStatus
from core.settings import build
from records.metrics import summarize
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"


def _finished(request_id: str, prompt: int, hits: int, lookups: int) -> Request:
    request = Request(request_id, 0.0, num_prompt_tokens=prompt, max_output_tokens=1)
    request.status = RequestStatus.FINISHED
    request.num_prefix_hit_tokens = hits
    request.num_prefix_lookup_tokens = lookups
    return request


def test_rate_is_hits_over_lookups_of_every_admission() -> None:
    # b was admitted twice (recomputed once): 96 tokens looked up, 80 of them hits.
    requests = [_finished("a", 64, 32, 64), _finished("b", 48, 80, 96)]
    summary = summarize(requests, 1.0)
    assert summary["num_prefix_hit_tokens"] == 112
    assert summary["prefix_hit_rate"] == pytest.approx(112 / 160)


def test_no_lookups_gives_zero() -> None:
    assert summarize([_finished("a", 8, 0, 0)], 1.0)["prefix_hit_rate"] == 0.0


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@pytest.mark.parametrize("num_blocks", [64, 100])
def test_rate_stays_within_one_under_recompute(policy: str, num_blocks: int) -> None:
    """parallel_sampling.csv with a small cache preempts (recompute) hundreds of times; the
    old definition (hits over the finished requests' prompt tokens) read 862% to 1430% here
    (its samples forked, as then: fanned out, each child's hits count against its own
    lookups)."""
    trace = load_trace(str(DATA / "parallel_sampling.csv"))
    config = build(
        RunConfig,
        policy=policy,
        enable_prefix_caching=True,
        num_blocks=num_blocks,
        parallel_sampling="fork",
    )
    result = simulate(trace, config)
    summary = result.summary
    assert summary["num_preemptions"] > 100
    hits = summary["num_prefix_hit_tokens"]
    input_tokens = summary["total_input_tokens"]
    assert isinstance(hits, int) and isinstance(input_tokens, int)
    assert hits > input_tokens  # what made the old rate exceed 100%
    rate = summary["prefix_hit_rate"]
    assert isinstance(rate, float) and 0.0 < rate <= 1.0
    lookups = sum(r.num_prefix_lookup_tokens for r in result.requests)
    assert rate == pytest.approx(hits / lookups)
