"""Steps applied in bulk, without ``schedule`` and ``update``: the scheduler's side of the
simulator's fast-forward (``sim.fastforward``), which the engine never calls. The rules that
end each step stay in ``Scheduler.end_step``."""

from __future__ import annotations

from collections.abc import Sequence

from core.request import Request, RequestStatus
from core.scheduler import Scheduler
from core.step import join_running


def record_step_ends(scheduler: Scheduler, step_end_s: Sequence[float]) -> int:
    """End times of steps applied without ``schedule`` and ``update`` (a run skipped over);
    returns the index of the first. Token timelines point into them."""
    first_idx = len(scheduler.step_end_s)
    if isinstance(step_end_s, list):
        scheduler.step_end_s.fromlist(step_end_s)  # (reads the list directly: faster)
    else:
        scheduler.step_end_s.extend(step_end_s)
    return first_idx


def admit_head(scheduler: Scheduler, request: Request, num_positions: int, start_s: float) -> bool:
    """Admit ``request`` if it is the waiting head, with ``num_positions`` positions and no
    prefix hits, in the step starting at ``start_s`` (``Scheduler.end_step`` then ends that
    step for it); False if it is not the head."""
    waiting = scheduler.waiting
    if not waiting or waiting[0] is not request:
        return False
    scheduler.kv.admit(request, num_positions, ())
    waiting.popleft()
    request.num_computed_tokens = 0
    request.num_prefix_lookup_tokens += request.num_tokens  # (looked up, as in ``Step``)
    request.status = RequestStatus.RUNNING
    join_running(scheduler.running, request, scheduler.by_priority)
    if request.first_scheduled_s is None:
        request.first_scheduled_s = start_s
    return True


def close_steps(scheduler: Scheduler, num_steps: int, now_s: float) -> list[Request]:
    """After ``num_steps`` steps applied in bulk, ending at ``now_s``: count them, and release
    a static batch whose runners have all finished (returned)."""
    scheduler.step_idx += num_steps
    if not scheduler.running and scheduler.held:
        return scheduler.release_held(now_s)
    return []
