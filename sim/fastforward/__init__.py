"""Fast-forward, a simulator's privilege: skip runs of identical steps exactly. The engine runs
every step and never imports this package; a reader of the core for the engine can skip it.

``FastForward`` is the one entry. Its contract, in three moves:

1. **Plan.** After a step has been scheduled, executed and updated, ``plan_repeat(batch)``;
   or, when the next step is only running decodes (and one prompt chunk),
   ``plan_continuation()``. Either gives an immutable ``RunPlan`` (the step, at most how
   many more like it, what each request grows per step) or None.
2. **Price.** The caller times up to ``plan.max_steps`` steps from ``plan.batch`` and
   ``plan.shape``; ``tokens`` and ``memory_sum`` give the totals a step-by-step record of the
   first ``n`` of them would add up to.
3. **Apply** all of them or a prefix: ``apply(plan, step_end_s)`` with 1 to ``max_steps``
   end times leaves the scheduler exactly as scheduling, executing and updating those steps
   one by one would (same requests, same block tables, same prefix cache). No step may run
   on the scheduler between plan and apply. Arrivals may be added meanwhile: the caller
   applies only the steps that started before one changed the next step
   (``Scheduler.changed_since_schedule``); the next ``schedule`` sees it.

It uses only the scheduler's public methods and ``core.bulk_steps``; the rules that end a step
live once, in ``Scheduler.end_step``.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.batch import ScheduledBatch
from core.bulk_steps import admit_head, close_steps, record_step_ends
from core.kv_manager import KVCacheManager, PagedKVManager
from core.memory import MemorySnapshot
from core.request import Request
from core.scheduler import Scheduler
from core.step import commit_scheduled
from sim.fastforward.growth import UNBOUNDED, RepeatShape, RequestGrowth, StepTokens
from sim.fastforward.memory import RunMemory, run_memory
from sim.fastforward.plan import RunPlan, plan_continuation, plan_repeat

__all__ = ["UNBOUNDED", "FastForward", "RepeatShape", "RequestGrowth", "RunPlan", "StepTokens"]


class FastForward:
    """Plans, totals and applies runs of identical steps on one scheduler (see the module
    docstring for the contract)."""

    def __init__(self, scheduler: Scheduler, itemized: bool = True) -> None:
        """``itemized``: whether a planned continuation's batch lists its requests (see
        ``plan_continuation``); a caller that prices and records a run from the plan's
        ``shape`` and ``growth`` alone may do without."""
        self.scheduler = scheduler
        self.itemized = itemized
        self._memory: RunMemory = run_memory(scheduler.kv)

    def plan_repeat(self, batch: ScheduledBatch) -> RunPlan | None:
        """The run of steps repeating ``batch``, which has just been executed and updated."""
        return plan_repeat(self.scheduler, self._memory, batch)

    def plan_continuation(self) -> RunPlan | None:
        """The run of the next step, built without the policy (see ``plan_continuation``)."""
        return plan_continuation(self.scheduler, self._memory, self.itemized)

    def tokens(self, plan: RunPlan, num_steps: int) -> StepTokens:
        """Prompt and decode tokens the first ``num_steps`` steps of ``plan`` compute."""
        shape = plan.shape
        prefill = 0
        for per_step, _, left, num_seqs in shape.chunks:
            positions = num_steps * per_step
            if positions > left:
                positions = left
            prefill += positions * num_seqs
        if shape.admit_step < num_steps:
            prefill += shape.admit_positions
        return (prefill, num_steps * shape.decode_seqs)

    def memory_sum(self, plan: RunPlan, num_steps: int) -> MemorySnapshot:
        """The sum of the memory snapshots of the first ``num_steps`` steps of ``plan``
        (call before ``apply``)."""
        return self._memory.repeat_memory_sum(plan.growth, num_steps, plan.next_waiting, plan.shape)

    def apply(self, plan: RunPlan, step_end_s: Sequence[float]) -> list[Request]:
        """Apply the first ``len(step_end_s)`` steps of ``plan``, ending at those times;
        returns the requests that finished. Requests that arrived during the last of these
        steps wait for the next ``schedule``."""
        s = self.scheduler
        count = len(step_end_s)
        if not 0 < count <= plan.max_steps:
            raise ValueError(f"cannot apply {count} steps of a plan of {plan.max_steps}")
        if plan.step_idx != s.step_idx:
            raise ValueError("the scheduler ran a step since this plan was made")
        growth = plan.growth
        shape = plan.shape
        first_idx = record_step_ends(s, step_end_s)
        kv = s.kv
        caching = s.cache_config.enable_prefix_caching
        if caching:
            # Each step grows each request and registers its full blocks as it is scheduled,
            # request after request (growth may evict cached blocks): one step at a time.
            for step in range(count):
                for request, per_step, left in growth:
                    num_positions = max(0, min(per_step, left - step * per_step))
                    _grow(kv, ((request, num_positions, num_positions),), 1)
                    end = request.num_computed_tokens + num_positions
                    # A decode's known tokens grow by the one sampled each step.
                    known = request.num_tokens + (step if left == UNBOUNDED else 0)
                    commit_scheduled(kv, request, end, known)
                    if step < count - 1:  # (the last step's positions: ``end_step``)
                        request.num_computed_tokens = end
        elif plan.decode_seq_ids is not None and isinstance(kv, PagedKVManager):
            # The decodes on the allocator's shorter path; a prompt chunk, if any, is last.
            request, per_step, left = growth[-1]
            chunk = [] if left == UNBOUNDED else [(request.live_seq_ids[0], per_step, left)]
            kv.allocator.append_steps(chunk, count, plan.decode_seq_ids)
        else:
            _grow(kv, growth, count)
        last_idx = first_idx + count - 1
        last_s = step_end_s[-1]
        head = None
        if shape.admit_step < count:
            head = shape.admit_request
            start_s = s.step_end_s[last_idx - 1]
            if head is None or not admit_head(s, head, shape.admit_positions, start_s):
                raise RuntimeError("the waiting head this run was to admit is no longer waiting")
        # The steps' rules, as ``update`` applies them: ``end_step`` counts the positions not
        # yet counted (all of the run's without prefix caching, else the last step's); a decode
        # samples in every step, a prompt once its last chunk is computed.
        finished: list[Request] = []
        # (``s.end_step`` called as a method: a compiled build calls it directly, where a local
        # alias would be a bound method called through the interpreter's protocol.)
        if caching:
            for request, per_step, left in growth:
                if left == UNBOUNDED:
                    s.end_step(request, 1, None, first_idx, last_s, finished, count)
                else:
                    final = max(0, min(per_step, left - (count - 1) * per_step))
                    s.end_step(request, final, None, last_idx, last_s, finished)
        else:
            for request, per_step, left in growth:
                if left == UNBOUNDED:
                    s.end_step(request, count, None, first_idx, last_s, finished, count)
                else:
                    positions = count * per_step
                    s.end_step(
                        request,
                        positions if positions < left else left,
                        None,
                        last_idx,
                        last_s,
                        finished,
                    )
        if head is not None:
            s.end_step(head, shape.admit_positions, None, last_idx, last_s, finished)
        finished.extend(close_steps(s, count, last_s))
        return finished


def _grow(kv: KVCacheManager, growth: Sequence[RequestGrowth], num_steps: int) -> None:
    """Grow every request of ``growth`` (request, positions per step, positions left) as
    ``num_steps`` steps would, one after another: in paged memory the allocator takes blocks
    in that order, so block tables come out the same."""
    if isinstance(kv, PagedKVManager):
        runs: list[tuple[int, int, int]] = [
            (request.live_seq_ids[0], per_step, left)
            for request, per_step, left in growth
            if not request.forked
        ]
        if len(runs) < len(growth):  # forked samples: one run per live sample, in order
            runs = [
                (seq_id, per_step, left)
                for request, per_step, left in growth
                # (before the fork only the first sample holds blocks)
                for seq_id in (request.live_seq_ids if request.forked else request.live_seq_ids[:1])
            ]
        kv.allocator.append_steps(runs, num_steps)
        return
    for request, per_step, left in growth:  # contiguous: inside reservations, order is free
        kv.grow(request, min(num_steps * per_step, left))
