"""Targeted scheduler scenarios where sequences share blocks: parallel sampling with
copy-on-write (paged and contiguous), the token ids each sample draws, samples that stop early,
and prefix caching."""

from __future__ import annotations

import pytest

from core.batch import StepResult
from core.config import CacheConfig, SchedulerConfig
from core.policies import POLICIES
from core.request import Request, RequestStatus
from tests.core.driver import replay
from tests.core.scheduler_setup import (
    STATIC_POLICIES,
    assert_all_free,
    make_scheduler,
    paged,
    step,
)

# -- parallel sampling ---------------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "expected_copies"), [(10, 2), (8, 0)])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_parallel_sampling_shares_prompt_and_copies_on_write(
    policy: str, prompt: int, expected_copies: int
) -> None:
    s = make_scheduler(policy)
    request = Request("par", 0.0, prompt, 4, n=3)
    assert s.add_request(request, 0.0)
    s.mark_arrivals_done()
    batch, finished, now_s = step(s, 0.0)
    assert [r.num_new_tokens for r in batch.requests] == [prompt]
    assert request.forked and not finished
    alloc = paged(s).allocator
    tables = [list(alloc.block_table(seq)) for seq in request.seq_ids]
    assert tables[0] == tables[1] == tables[2]
    for block_id in tables[0]:
        assert alloc.ref_count(block_id) == 3
    num_full = prompt // 4
    assert paged(s).snapshot(None).shared_saved_slots == 2 * len(tables[0]) * 4

    batch, _, now_s = step(s, now_s)
    assert len(batch.copies) == expected_copies == request.num_cow_copies
    assert [r.num_new_tokens for r in batch.requests] == [3]
    for src, dst in batch.copies:
        assert src == tables[0][-1] and alloc.ref_count(dst) == 1
    new_tables = [list(alloc.block_table(seq)) for seq in request.seq_ids]
    for block_id in tables[0][:num_full]:
        assert alloc.ref_count(block_id) == 3
    assert len({t[-1] for t in new_tables}) == 3, "each sample writes its own last block"
    assert batch.memory is not None and batch.memory.shared_saved_slots == 2 * num_full * 4
    while not finished:
        assert request.status is RequestStatus.RUNNING
        _, finished, now_s = step(s, now_s)
    assert finished == [request] and request.tokens.num_emissions == 4
    assert_all_free(s)


def test_parallel_sampling_contiguous_copies_the_prompt_range() -> None:
    s = make_scheduler(memory_model="contiguous")
    request = Request("par", 0.0, 10, 4, n=3)
    assert s.add_request(request, 0.0)
    _, _, now_s = step(s, 0.0)
    batch, _, _ = step(s, now_s)
    starts = [s.kv.allocator.range_of(seq)[0] for seq in request.seq_ids]  # type: ignore[attr-defined]
    assert batch.range_copies == [(starts[0], starts[1], 10), (starts[0], starts[2], 10)]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_sample_stopped_early_frees_its_sequence(policy: str) -> None:
    holds = POLICIES[policy].holds_until_batch_end
    s = make_scheduler(policy)
    request = Request("par", 0.0, 8, 6, n=3)
    assert s.add_request(request, 0.0)
    s.mark_arrivals_done()
    _, _, now_s = step(s, 0.0)
    stopped_seq = request.seq_ids[1]
    _, finished, now_s = step(s, now_s, stopped=frozenset({stopped_seq}))
    assert not finished and request.live_seq_ids == [request.seq_ids[0], request.seq_ids[2]]
    # Static batching keeps a finished sequence's memory until the batch ends.
    assert paged(s).allocator.has_table(stopped_seq) == holds
    batch, finished, now_s = step(s, now_s)
    assert [r.seq_ids for r in batch.requests] == [(request.seq_ids[0], request.seq_ids[2])]
    assert batch.num_batched_tokens == 2
    while not finished:
        _, finished, now_s = step(s, now_s)
    assert finished == [request] and request.tokens.num_emissions == 6
    assert_all_free(s)


def test_sampled_token_ids_go_to_each_requests_own_map() -> None:
    """Each request keeps the ids sampled for its own sequences, in a dict of its own; the
    shared empty default they all start with stays empty."""
    s = make_scheduler()
    requests = [Request("A", 0.0, 8, 3, n=2), Request("B", 0.0, 5, 4)]
    for request in requests:
        assert s.add_request(request, 0.0)
    assert requests[0].output_token_ids is requests[1].output_token_ids  # the shared default
    default = requests[0].output_token_ids
    late = Request("C", 0.01, 6, 2)
    expected: dict[int, list[int]] = {}
    now_s = 0.0
    while s.has_unfinished():
        batch = s.schedule(now_s)
        # A distinct id per (sequence, step), for every sample of every scheduled request.
        sampled = {
            seq_id: 1000 * seq_id + batch.step_idx
            for scheduled in batch.requests
            for seq_id in scheduled.request.seq_ids
        }
        for seq_id, token_id in sampled.items():
            expected.setdefault(seq_id, []).append(token_id)
        now_s += 0.01
        s.update(batch, StepResult(0.01, sampled_token_ids=sampled), now_s)
        if batch.step_idx == 0:  # one request arrives while the others run
            assert s.add_request(late, now_s)
            requests.append(late)
    assert len(requests) == 3 and all(r.status is RequestStatus.FINISHED for r in requests)
    for request in requests:
        assert all(len(expected[seq]) == request.max_output_tokens for seq in request.seq_ids)
        assert isinstance(request.output_token_ids, dict)
        assert request.output_token_ids == {seq: expected[seq] for seq in request.seq_ids}
    maps = [r.output_token_ids for r in requests]
    assert all(a is not b for i, a in enumerate(maps) for b in maps[i + 1 :])
    assert len(default) == 0 and len(Request("D", 0.0, 4, 1).output_token_ids) == 0


@pytest.mark.parametrize("policy", STATIC_POLICIES)
def test_static_charges_padding_for_a_stopped_sample(policy: str) -> None:
    s = make_scheduler(policy)
    request = Request("par", 0.0, 8, 6, n=3)
    assert s.add_request(request, 0.0)
    s.mark_arrivals_done()
    _, _, now_s = step(s, 0.0)
    _, _, now_s = step(s, now_s, stopped=frozenset({request.seq_ids[1]}))
    batch, _, _ = step(s, now_s)
    assert batch.num_padding_tokens == 1


# -- prefix caching --------------------------------------------------------------------------


@pytest.mark.parametrize("second_arrival_s", [0.05, 5.0], ids=["first-running", "first-done"])
@pytest.mark.parametrize("prompt", [37, 48, 64, 15])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_prefix_hit_on_identical_prompt(policy: str, prompt: int, second_arrival_s: float) -> None:
    ids = tuple(range(100, 100 + prompt))
    requests = [
        Request("first", 0.0, prompt, 20, prompt_token_ids=ids),
        Request("second", second_arrival_s, prompt, 3, prompt_token_ids=ids),
    ]
    cache = CacheConfig(
        num_blocks=64,
        block_size=16,
        enable_prefix_caching=True,
        memory_model="paged",
        max_model_len=4096,
    )
    config = SchedulerConfig(policy=policy, batch_size=1, max_wait_s=0.0)
    result = replay(requests, cache, config)
    expected = (prompt - 1) // 16 * 16
    assert requests[0].num_prefix_hit_tokens == 0
    assert requests[1].num_prefix_hit_tokens == expected
    first_share = result.entries_of("second")[0]
    assert first_share.num_computed_tokens == expected
    assert first_share.num_positions == prompt - expected
    assert all(r.status is RequestStatus.FINISHED for r in requests)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_prefix_hit_on_mooncake_hash_ids(policy: str) -> None:
    requests = [
        Request("a", 0.0, 1536, 2, prefix_hash_ids=(11, 12, 13)),
        Request("b", 1.0, 1536, 2, prefix_hash_ids=(11, 12, 99)),
        Request("c", 2.0, 1536, 2, prefix_hash_ids=(50, 12, 13)),
    ]
    cache = CacheConfig(
        num_blocks=512,
        block_size=16,
        enable_prefix_caching=True,
        memory_model="paged",
        max_model_len=4096,
    )
    config = SchedulerConfig(policy=policy, max_num_batched_tokens=2048, batch_size=1)
    result = replay(requests, cache, config)
    assert [r.num_prefix_hit_tokens for r in requests] == [0, 1024, 0]
    assert result.entries_of("b")[0].num_computed_tokens == 1024


def test_no_prefix_hit_without_prefix_caching() -> None:
    ids = tuple(range(40))
    requests = [Request(f"r{i}", float(i), 40, 2, prompt_token_ids=ids) for i in range(2)]
    replay(
        requests,
        CacheConfig(num_blocks=64, block_size=16, memory_model="paged", max_model_len=4096),
        SchedulerConfig(),
    )
    assert [r.num_prefix_hit_tokens for r in requests] == [0, 0]
