"""The engine's time between steps that no step holds (``loop_gap``): in a wall-clock run the
next step starts after this one's busy time (schedule, prepare, execute, update) plus the
engine loop's own work (arrivals, bookkeeping). The simulator prices busy time only, so the
gap is a bias of the engine against it, reported beside the errors by ``sim validate``.

Until 2026-11-28 the replay wrote its step rows between steps: 41-85 us a step in every recorded
H200 run, 0.3-1.2% of a step, and 32 us on the CPU (4-5 us since;
``benchmarks/results/replay_loop_gap.txt``)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any, Final

from records.step_shapes import StepShapeRecord

BACK_TO_BACK_S: Final = 2e-3
"""A step that starts within this long of the last one's end followed it at once (the engine
did not wait for an arrival): its gap is the loop's."""


def loop_gap(steps: Sequence[StepShapeRecord]) -> dict[str, Any]:
    """Over the back-to-back steps of a run (in order): how many, the median gap after each
    one's update (seconds), the median update and busy step, and the gap's share of the
    median busy step (%); the gap and its share None without two back-to-back steps."""
    gaps = [
        after.start_s - (step.start_s + step.busy_s)
        for step, after in itertools.pairwise(steps)
        if after.start_s - (step.start_s + step.busy_s) < BACK_TO_BACK_S
    ]
    busy = statistics.median(s.busy_s for s in steps) if steps else 0.0
    gap = statistics.median(gaps) if gaps else None
    return {
        "num_steps": len(steps),
        "back_to_back": len(gaps),
        "gap_s": gap,
        "update_s": statistics.median(s.update_s for s in steps) if steps else None,
        "busy_s": busy,
        "share_pct": 100 * gap / busy if gap is not None and busy > 0 else None,
    }
