"""``Policy.reads`` tells the truth: a setting a policy does not list leaves its runs
byte-for-byte the same at any value (so the note "it has no effect on this run" is true), and
one it lists changes them (so the list misses nothing the policy reads)."""

from __future__ import annotations

import pytest

from core.flags import unused_settings
from core.policies import POLICIES
from core.settings import build
from sim.run import RunConfig, simulate
from traces.schema import Trace, TraceRequest

# Bursts of arrivals with gaps: a batch size of 2 or 16 and a wait of 1 ms or 1 s change when
# static and dynamic batches start.
TRACE = Trace(
    "bursts",
    tuple(
        TraceRequest(f"r{i}", 0.3 * (i // 5) + 0.001 * i, 30 + 7 * i, 3 + i % 4) for i in range(20)
    ),
)
BASE = {"model": "Llama-2-7B", "hardware": "A100-80GB", "num_blocks": 400, "fast_forward": False}
VALUES = {"batch_size": (2, 16), "max_wait_s": (0.001, 1.0)}
# The other setting, held where the varied one shows: dynamic waits only while its batch is
# short of its size, and starts a batch at its size only before its wait is up.
HELD = {"batch_size": {"max_wait_s": 0.05}, "max_wait_s": {"batch_size": 16}}


def _rows(policy: str, **settings: object) -> list[tuple[object, ...]]:
    result = simulate(TRACE, build(RunConfig, **{**BASE, "policy": policy, **settings}))
    frame = result.steps.to_frame()
    return list(frame.itertuples(index=False))


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", sorted(VALUES))
def test_a_setting_matters_exactly_where_the_policy_reads_it(policy: str, name: str) -> None:
    low, high = VALUES[name]
    fixed = HELD[name]
    differ = _rows(policy, **fixed, **{name: low}) != _rows(policy, **fixed, **{name: high})
    assert differ == (name in POLICIES[policy].reads)
    named = unused_settings({name: low}, policy, "recompute")
    assert bool(named) == (name not in POLICIES[policy].reads), named
