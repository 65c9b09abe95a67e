"""Hand-checked scenarios, one per scheduling rule we take from vLLM v1's scheduler: prefix
blocks registered at schedule time, the null block, the watermark while something runs, and
a preempted request's recompute under ``continuous`` waiting until it fits whole.

Each expected number is worked out in the test's docstring; none needs vLLM installed
(``benchmarks/vllm_conformance.py`` checks the same rules against the real scheduler).
"""

from __future__ import annotations

import pytest

from core.batch import ScheduledBatch, StepResult
from core.config import CacheConfig, SchedulerConfig
from core.request import Request, RequestStatus
from core.scheduler import Scheduler


def make(
    policy: str,
    num_blocks: int,
    *,
    budget: int = 64,
    prefix_caching: bool = False,
    watermark: float | None = None,
) -> Scheduler:
    extra = {} if watermark is None else {"watermark": watermark}
    cache = CacheConfig(
        num_blocks=num_blocks,
        block_size=4,
        memory_model="paged",
        enable_prefix_caching=prefix_caching,
        max_model_len=4096,
        **extra,
    )
    return Scheduler(cache, SchedulerConfig(policy=policy, max_num_batched_tokens=budget))


def run_step(s: Scheduler, now_s: float) -> ScheduledBatch:
    batch = s.schedule(now_s)
    s.update(batch, StepResult(duration_s=0.01), now_s + 0.01)
    return batch


def positions(batch: ScheduledBatch) -> dict[str, int]:
    return {r.request_id: r.num_positions for r in batch.requests}


def test_blocks_enter_the_prefix_cache_when_scheduled() -> None:
    """Two 12-token requests with the same prompt, block size 4, both waiting at t=0.

    A is admitted first and computes all 12 tokens; its 3 full blocks are registered as it is
    scheduled. B, admitted next in the same step, may hit at most (12 - 1) // 4 = 2 blocks
    (its last token must be computed), so it computes 12 - 8 = 4 tokens in that step. Were
    blocks registered only after the step, B would hit nothing and compute 12.
    """
    s = make("chunked", 32, prefix_caching=True)
    prompt = tuple(range(100, 112))
    for rid in ("A", "B"):
        s.add_request(Request(rid, 0.0, 12, 4, prompt_token_ids=prompt), 0.0)
    free_before = s.kv.allocator.num_free_blocks  # type: ignore[attr-defined]
    batch = run_step(s, 0.0)
    assert positions(batch) == {"A": 12, "B": 4}
    b = next(r.request for r in batch.requests if r.request_id == "B")
    assert b.num_prefix_hit_tokens == 8
    # A holds 3 blocks, B shares 2 of them and holds 1 of its own: 4 taken.
    assert free_before - s.kv.allocator.num_free_blocks == 4  # type: ignore[attr-defined]


def test_blocks_of_a_chunk_are_hit_in_the_same_step() -> None:
    """Budget 10, block size 4, two requests with the same 16-token prompt.

    Step 0: A takes the whole budget (a 10-token chunk); B waits. Step 1: A computes its last
    6 tokens and registers blocks 2 and 3 as it is scheduled; B, admitted in the 4 tokens
    left, hits (16 - 1) // 4 = 3 blocks and computes the last 4: its prompt is done. Were
    blocks registered after the step, B would hit only A's first 2 blocks and compute 4 of
    its remaining 8.
    """
    s = make("chunked", 32, budget=10, prefix_caching=True)
    prompt = tuple(range(200, 216))
    for rid in ("A", "B"):
        s.add_request(Request(rid, 0.0, 16, 4, prompt_token_ids=prompt), 0.0)
    assert positions(run_step(s, 0.0)) == {"A": 10}
    batch = run_step(s, 0.01)
    assert positions(batch) == {"A": 6, "B": 4}
    b = next(r.request for r in batch.requests if r.request_id == "B")
    assert b.num_prefix_hit_tokens == 12
    assert b.num_computed_tokens == 16 and b.num_output_tokens == 1


def test_num_blocks_counts_the_null_block() -> None:
    """``num_blocks = 10`` is vLLM's ``num_gpu_blocks``: one is the null block, 9 are usable.

    A request of 36 tokens at its longest (32 prompt + 4 output) needs 9 blocks of 4: it is
    served. One of 37 tokens needs 10 and is rejected up front.
    """
    s = make("continuous", 10)
    assert s.kv.allocator.num_free_blocks == 9  # type: ignore[attr-defined]
    assert s.memory_snapshot().total_slots == 9 * 4
    assert s.add_request(Request("fits", 0.0, 32, 4), 0.0)
    too_long = Request("too-long", 0.0, 33, 4)
    assert not s.add_request(too_long, 0.0)
    assert too_long.reject_reason is not None and "null block" in too_long.reject_reason


def test_paged_cache_needs_a_block_besides_the_null_block() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        CacheConfig(num_blocks=1, memory_model="paged", max_model_len=4096)


def test_watermark_defaults_to_zero() -> None:
    assert CacheConfig(num_blocks=8, memory_model="paged", max_model_len=4096).watermark == 0.0


def test_watermark_applies_only_while_something_runs() -> None:
    """``num_blocks = 11`` (10 usable), watermark 0.2: 2 blocks kept free while anything runs.

    A (prompt 20: 5 blocks of 4) is admitted into the idle cache. B (prompt 16: 4 blocks) is
    then checked with A running: 5 free - 4 = 1 < 2, so B waits (without the watermark it
    would have joined). Step 1: A decodes into a 6th block and finishes; B still waits
    (4 - 4 = 0 < 2). Step 2: nothing runs, so no watermark: B gets in.
    C alone (prompt 36, 1 output: 37 tokens, 10 blocks) was rejected up front by the old rule
    (10 > 10 - 2); now the idle cache admits it, as vLLM does.
    """
    s = make("continuous", 11, watermark=0.2)
    s.add_request(Request("A", 0.0, 20, 2), 0.0)
    s.add_request(Request("B", 0.0, 16, 2), 0.0)
    assert positions(run_step(s, 0.0)) == {"A": 20}  # B held back by the watermark
    assert positions(run_step(s, 0.01)) == {"A": 1}  # A finishes (2 outputs)
    assert positions(run_step(s, 0.02)) == {"B": 16}  # idle again: no watermark
    s2 = make("continuous", 11, watermark=0.2)
    c = Request("C", 0.0, 36, 1)
    assert s2.add_request(c, 0.0)
    assert positions(run_step(s2, 0.0)) == {"C": 36}
    assert c.status is RequestStatus.FINISHED


def test_continuous_recompute_is_not_split() -> None:
    """``continuous``, budget 12, block size 4, plenty of blocks.

    V (prompt 8) computes its prompt and decodes twice (10 computed, 3 outputs); W, X, Y
    (1-token prompts) join at step 3, where V decodes once more (4 outputs). V is then
    preempted (by hand, as memory pressure would): it has 8 + 4 = 12 known tokens to
    recompute. While W, X and Y decode, 12 - 3 = 9 tokens are left in each step: V waits
    whole (the old rule split it: 9 tokens, then 3). W, X and Y finish at step 10 (8 outputs
    each); at step 11 V recomputes all 12 in one step.
    """
    s = make("continuous", 64, budget=12)
    v = Request("V", 0.0, 8, 8)
    s.add_request(v, 0.0)
    run_step(s, 0.0)  # V's prompt: 8 computed, 1 output
    run_step(s, 0.01)  # 9 computed, 2 outputs
    run_step(s, 0.02)  # 10 computed, 3 outputs
    for rid in ("W", "X", "Y"):
        s.add_request(Request(rid, 0.02, 1, 8), 0.03)
    assert positions(run_step(s, 0.03)) == {"V": 1, "W": 1, "X": 1, "Y": 1}
    s.preempt(v, ScheduledBatch(step_idx=-1, now_s=0.04))
    assert v.num_pending_positions == 12  # 8 prompt + 4 outputs
    # W, X, Y decode (3 tokens), 9 left < 12: V waits whole instead of computing 9.
    batch = run_step(s, 0.04)
    assert positions(batch) == {"W": 1, "X": 1, "Y": 1}
    assert v.status is RequestStatus.WAITING and v.num_computed_tokens == 0
    scheduled: list[dict[str, int]] = []
    for step_idx in range(5, 12):
        scheduled.append(positions(run_step(s, step_idx * 0.01)))
    assert scheduled[:6] == [{"W": 1, "X": 1, "Y": 1}] * 6
    assert scheduled[6] == {"V": 12}


def test_continuous_recompute_longer_than_the_budget_is_split() -> None:
    """Budget 8: V (prompt 8) decodes to 8 + 2 = 10 known tokens, then is preempted. 10 > 8
    could never fit whole in a step (vLLM would not run with such a budget): it is split
    into 8, then the last 2.
    """
    s = make("continuous", 64, budget=8)
    v = Request("V", 0.0, 8, 8)
    s.add_request(v, 0.0)
    run_step(s, 0.0)  # prompt: 1 output
    run_step(s, 0.01)  # 2 outputs, 9 computed
    s.preempt(v, ScheduledBatch(step_idx=-1, now_s=0.02))
    assert v.num_pending_positions == 10
    assert positions(run_step(s, 0.02)) == {"V": 8}
    assert positions(run_step(s, 0.03)) == {"V": 2}
