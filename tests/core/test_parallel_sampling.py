"""n > 1 as vLLM v1 runs it (``parallel_sampling="fan_out"``, the default): n child requests,
named and queued as vLLM's front end adds them, each scheduled on its own and sharing only
through the prefix cache; the parent is reported once, when its last child finishes. The
copy-on-write fork stays a choice (``"fork"``)."""

from __future__ import annotations

import pytest

from core.config import CacheConfig, SchedulerConfig
from core.policies import POLICIES
from core.request import Request, RequestStatus
from tests.core.driver import make_workload, replay
from tests.core.scheduler_setup import assert_all_free, make_scheduler, step
from tests.core.test_policies import assert_cache_empty


def test_the_default_follows_vllm_v1() -> None:
    assert SchedulerConfig().parallel_sampling == "fan_out"
    with pytest.raises(ValueError, match=r"parallel_sampling must be one of"):
        SchedulerConfig(parallel_sampling="clone")  # type: ignore[arg-type]


def test_children_are_queued_as_vllms_front_end_adds_them() -> None:
    s = make_scheduler("chunked", parallel_sampling="fan_out", budget=64)
    parent = Request("p", 0.0, 20, 3, n=3)
    assert s.add_request(parent, 0.0)
    assert [r.request_id for r in s.waiting] == ["0_p", "1_p", "2_p"]
    assert all(r.n == 1 and r.num_prompt_tokens == 20 for r in s.waiting)
    assert parent not in s.waiting and s.num_unfinished == 3
    # Without prefix caching each child computes the whole prompt, in its own share.
    batch, finished, _ = step(s, 0.0)
    assert [(r.request.request_id, r.num_new_tokens) for r in batch.requests] == [
        ("0_p", 20),
        ("1_p", 20),
        ("2_p", 20),
    ]
    assert not batch.copies and not finished
    assert len({s.block_tables(r.request)[0][0] for r in batch.requests}) == 3


def test_children_share_the_prompt_only_through_the_prefix_cache() -> None:
    s = make_scheduler(
        "chunked", parallel_sampling="fan_out", prefix_caching=True, block_size=4, budget=64
    )
    ids = tuple(range(100, 122))  # 22 tokens: 5 full blocks of 4
    parent = Request("p", 0.0, 22, 2, n=3, prompt_token_ids=ids)
    assert s.add_request(parent, 0.0)
    batch, _, _ = step(s, 0.0)
    # The first child's full blocks enter the cache when it is scheduled, so the later
    # children of the same step find them (vLLM v1 caches blocks at allocation).
    shares = [
        (r.request.request_id, r.num_computed_tokens, r.num_new_tokens) for r in batch.requests
    ]
    assert shares == [("0_p", 0, 22), ("1_p", 20, 2), ("2_p", 20, 2)]
    tables = [s.block_tables(r.request)[0] for r in batch.requests]
    assert tables[0][:5] == tables[1][:5] == tables[2][:5]
    assert len({t[5] for t in tables}) == 3  # each child's own last block: no copy-on-write
    assert not batch.copies


def test_children_of_unknown_content_still_have_one_prompt() -> None:
    """A trace of lengths only names blocks by request; a parent's children share its name."""
    s = make_scheduler(
        "chunked", parallel_sampling="fan_out", prefix_caching=True, block_size=4, budget=64
    )
    parent, other = Request("p", 0.0, 22, 2, n=2), Request("q", 0.0, 22, 2)
    assert s.add_request(parent, 0.0) and s.add_request(other, 0.0)
    batch, _, _ = step(s, 0.0)
    shares = [(r.request.request_id, r.num_computed_tokens) for r in batch.requests]
    assert shares == [("0_p", 0), ("1_p", 20), ("q", 0)]


def test_the_parent_is_reported_once_with_what_its_children_did() -> None:
    s = make_scheduler("continuous", parallel_sampling="fan_out", budget=24)
    parent = Request("p", 0.0, 10, 3, n=3)
    assert s.add_request(parent, 0.0)
    reported: list[Request] = []
    now_s = 0.0
    while s.has_unfinished():
        _, finished, now_s = step(s, now_s)
        reported += finished
    assert reported == [parent]
    assert parent.status is RequestStatus.FINISHED
    assert parent.num_output_tokens == 3 and parent.tokens.num_emissions == 3
    # A budget of 24 tokens admits two 10-token prompts a step: the third child starts later.
    assert parent.first_token_s == pytest.approx(0.01)
    assert parent.finish_s == pytest.approx(0.04)
    assert parent.tokens.last_s == parent.finish_s
    assert_all_free(s)


def test_a_parent_no_child_fits_is_rejected_and_an_abort_stops_every_child() -> None:
    s = make_scheduler("continuous", parallel_sampling="fan_out", max_model_len=32)
    too_long = Request("long", 0.0, 30, 5, n=2)
    assert not s.add_request(too_long, 0.0)
    assert too_long.status is RequestStatus.REJECTED and "32" in (too_long.reject_reason or "")
    assert not s.waiting
    parent = Request("p", 0.0, 10, 8, n=2)
    assert s.add_request(parent, 0.0)
    step(s, 0.0)
    assert s.abort("p", 0.02) is parent
    assert parent.status is RequestStatus.ABORTED and not s.has_unfinished()
    assert_all_free(s)


def test_fork_stays_a_choice() -> None:
    s = make_scheduler("continuous", parallel_sampling="fork")
    parent = Request("p", 0.0, 10, 3, n=3)
    assert s.add_request(parent, 0.0)
    assert list(s.waiting) == [parent]
    batch, _, _ = step(s, 0.0)
    assert parent.forked and [r.request.request_id for r in batch.requests] == ["p"]


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_fanned_out_request_finishes_and_frees_its_memory(
    policy: str, prefix_caching: bool
) -> None:
    requests = make_workload(
        3, 25, rate_per_s=100.0, prompt_tokens=(8, 120), output_tokens=(2, 30), max_n=3,
        num_prefixes=2 if prefix_caching else 0,
    )  # fmt: skip
    assert any(r.n > 1 for r in requests)
    cache = CacheConfig(
        num_blocks=120,
        block_size=16,
        memory_model="paged",
        enable_prefix_caching=prefix_caching,
        max_model_len=512,
    )
    config = SchedulerConfig(policy=policy, max_num_batched_tokens=256, batch_size=4)
    result = replay(requests, cache, config, max_steps=20_000)
    assert {r.request_id for r in result.finished} == {r.request_id for r in requests}
    for request in requests:
        assert request.status is RequestStatus.FINISHED
        assert request.num_output_tokens == request.max_output_tokens
        assert request.tokens.num_emissions == request.max_output_tokens
        assert request.first_token_s is not None and request.finish_s is not None
        assert request.first_token_s <= request.tokens.first_s <= request.finish_s  # type: ignore[operator]
    scheduled = {e.request_id for b in result.batches for e in b.entries}
    for request in requests:
        if request.n > 1:
            assert {f"{i}_{request.request_id}" for i in range(request.n)} <= scheduled
            assert request.request_id not in scheduled
    assert_cache_empty(result.scheduler)
