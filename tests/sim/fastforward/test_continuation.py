"""``FastForward.plan_continuation`` builds the next step without running the policy. Whenever it
offers one, the policy, asked next, must schedule exactly that step: the same requests, in
the same order, with the same positions (a prompt's chunk cut to what it has left), and
nothing else: no admission, preemption, copy or swap."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.batch import StepResult
from core.config import CacheConfig, SchedulerConfig
from core.kv_manager import PagedKVManager
from core.request import Request
from core.scheduler import Scheduler
from sim.fastforward import FastForward, RunPlan
from sim.fastforward.memory import PagedRunMemory

requests_strategy = st.lists(
    st.tuples(
        st.floats(0.0, 2.0),  # arrival gap, s
        st.integers(1, 120),  # prompt tokens
        st.integers(1, 60),  # output tokens
    ),
    min_size=1,
    max_size=14,
)


def _setup(
    policy: str, num_blocks: int, budget: int, specs: list[tuple[float, int, int]]
) -> tuple[Scheduler, list[Request]]:
    """A small scheduler and its requests, in arrival order (``specs``: gap, prompt, output)."""
    scheduler = Scheduler(
        CacheConfig(num_blocks=num_blocks, block_size=8, max_model_len=512, memory_model="paged"),
        SchedulerConfig(policy=policy, max_num_seqs=6, max_num_batched_tokens=budget),
    )
    requests: list[Request] = []
    arrival_s = 0.0
    for idx, (gap, prompt, output) in enumerate(specs):
        arrival_s += gap
        requests.append(
            Request(f"r{idx}", arrival_s, num_prompt_tokens=prompt, max_output_tokens=output)
        )
    return scheduler, requests


def _drive(
    policy: str, num_blocks: int, budget: int, specs: list[tuple[float, int, int]]
) -> tuple[int, int, int]:
    """Run every request to the end step by step, checking each continuation offered against
    the step the policy then schedules; returns (continuations offered, of which admitting
    the waiting head in their first step, steps)."""
    scheduler, pending = _setup(policy, num_blocks, budget, specs)
    skipper = FastForward(scheduler)
    lean = FastForward(scheduler, itemized=False)
    now_s, offered, admitted, steps = 0.0, 0, 0, 0
    predicted = None
    admission: tuple[Request, int] | None = None
    while pending or scheduler.has_unfinished():
        while pending and pending[0].arrival_s <= now_s:
            scheduler.add_request(pending.pop(0), now_s)
        batch = scheduler.schedule(now_s)
        if predicted is not None:
            # (scheduling changes no request's computed count: that happens in update)
            expected = [
                (s.request, min(s.num_positions, s.request.num_pending_positions))
                for s in predicted.requests
            ]
            if admission is not None:
                expected.append(admission)  # the waiting head joins, with the rest of the budget
                admitted += 1
            assert [(s.request, s.num_positions) for s in batch.requests] == expected
            assert not (batch.copies or batch.swap_in or batch.swap_out or batch.preempted_ids)
            offered += 1
        if batch.is_empty:
            scheduler.update(batch, StepResult(0.0), now_s)
            assert pending, "nothing can run and nothing will arrive"
            now_s = max(now_s, pending[0].arrival_s)
            predicted = None
            continue
        now_s += 0.05 + 1e-4 * batch.num_batched_tokens
        scheduler.update(batch, StepResult(0.0), now_s)
        steps += 1
        # Arrivals due by now would change the next step; continuation must see them.
        while pending and pending[0].arrival_s <= now_s:
            scheduler.add_request(pending.pop(0), now_s)
        plan = skipper.plan_continuation()
        _check_lean(plan, lean.plan_continuation())
        predicted = plan.batch if plan is not None else None
        admission = None
        if plan is not None:
            # It claims to be repeatable at least once.
            assert plan.max_steps > 0
            _check_shape(scheduler, plan)
            shape = plan.shape
            if shape.admit_step == 0:  # its first repeat also admits the waiting head
                assert shape.admit_request is not None
                admission = (shape.admit_request, shape.admit_positions)
    return offered, admitted, steps


def _check_lean(plan: RunPlan | None, lean: RunPlan | None) -> None:
    """A plan made without ``itemized`` is the same plan, its batch without requests: the
    growth lists them, one entry each, in the batch's order."""
    if plan is None:
        assert lean is None
        return
    assert lean is not None and not lean.batch.requests
    assert [g[0] for g in plan.growth] == [s.request for s in plan.batch.requests]
    for name in ("max_steps", "growth", "shape", "step_idx", "next_waiting", "decode_seq_ids"):
        assert getattr(lean, name) == getattr(plan, name), name
    for name in ("step_idx", "now_s", "num_running", "num_waiting", "num_swapped"):
        assert getattr(lean.batch, name) == getattr(plan.batch, name), name


def _check_shape(scheduler: Scheduler, plan: RunPlan) -> None:
    """The plan's aggregate shape (gathered as it was planned) is its per-request growth
    summed from the tokens each sequence holds in the allocator."""
    assert isinstance(scheduler.kv, PagedKVManager)
    expected = PagedRunMemory(scheduler.kv).shape_of(plan.growth)
    shape = plan.shape
    assert sum(shape.decode_phases) == shape.decode_seqs
    assert shape.admitting(expected.admit_step, 0, None) == expected


@settings(max_examples=60, deadline=None)
@given(
    specs=requests_strategy,
    num_blocks=st.integers(40, 120),
    budget=st.sampled_from([16, 32, 64]),
)
def test_chunked_continuation_is_the_policys_next_step(
    specs: list[tuple[float, int, int]], num_blocks: int, budget: int
) -> None:
    _drive("chunked", num_blocks, budget, specs)


@settings(max_examples=40, deadline=None)
@given(specs=requests_strategy, num_blocks=st.integers(40, 120))
def test_continuous_continuation_is_the_policys_next_step(
    specs: list[tuple[float, int, int]], num_blocks: int
) -> None:
    _drive("continuous", num_blocks, 256, specs)


def test_continuations_are_offered_under_load() -> None:
    """Not a vacuous check: a busy chunked replica gets many continuations, decodes alone and
    decodes next to a prompt's chunks."""
    specs = [(0.01, 100, 40)] * 12
    offered, _, steps = _drive("chunked", 60, 32, specs)
    assert offered > steps // 4


def test_static_batching_never_continues() -> None:
    scheduler = Scheduler(
        CacheConfig(num_blocks=64, block_size=8, memory_model="paged", max_model_len=4096),
        SchedulerConfig("static"),
    )
    scheduler.add_request(Request("a", 0.0, num_prompt_tokens=10, max_output_tokens=5), 0.0)
    batch = scheduler.schedule(0.0)
    scheduler.update(batch, StepResult(0.1), 0.1)
    assert FastForward(scheduler).plan_continuation() is None


def _drive_admissions(num_blocks: int, budget: int, specs: list[tuple[float, int, int]]) -> int:
    """Step by step with chunked prefill; whenever ``plan_repeat`` plans a run whose last step
    also admits the waiting head, the policy's own steps must match it: the same requests,
    and in that step (not before) the planned head with the planned positions. Returns how
    many planned admissions were checked."""
    scheduler, pending = _setup("chunked", num_blocks, budget, specs)
    skipper = FastForward(scheduler)
    now_s, checked = 0.0, 0
    plan: tuple[list[Request], Request, int, int] | None = None  # members, head, positions, step
    while pending or scheduler.has_unfinished():
        while pending and pending[0].arrival_s <= now_s:
            scheduler.add_request(pending.pop(0), now_s)
        batch = scheduler.schedule(now_s)
        if batch.is_empty:
            scheduler.update(batch, StepResult(0.0), now_s)
            assert pending, "nothing can run and nothing will arrive"
            now_s = max(now_s, pending[0].arrival_s)
            continue
        if plan is not None:
            members, head, positions, steps_left = plan
            got = [(s.request, s.num_positions) for s in batch.requests]
            assert [request for request, _ in got[: len(members)]] == members
            if steps_left:
                assert len(got) == len(members), "someone joined before the planned step"
                plan = (members, head, positions, steps_left - 1)
            else:
                assert got[len(members) :] == [(head, positions)]
                checked += 1
                plan = None
        now_s += 0.05 + 1e-4 * batch.num_batched_tokens
        scheduler.update(batch, StepResult(0.0), now_s)
        while pending and pending[0].arrival_s <= now_s:
            scheduler.add_request(pending.pop(0), now_s)
        run = skipper.plan_repeat(batch) if plan is None else None
        if run is not None:
            _check_shape(scheduler, run)
            shape = run.shape
            if shape.admit_request is not None:
                members = [s.request for s in batch.requests]
                plan = (members, shape.admit_request, shape.admit_positions, shape.admit_step)
    return checked


@settings(max_examples=60, deadline=None)
@given(
    specs=requests_strategy,
    num_blocks=st.integers(40, 160),
    budget=st.sampled_from([16, 32, 64]),
)
def test_admission_folded_into_a_repeat_is_the_policys_step(
    specs: list[tuple[float, int, int]], num_blocks: int, budget: int
) -> None:
    _drive_admissions(num_blocks, budget, specs)


def test_admissions_are_folded_under_load() -> None:
    assert _drive_admissions(120, 32, [(0.01, 100, 40)] * 12) > 0
