"""Why two runs' batches part at their first different step (``explain``): a request whose
arrival fell between the two runs' starts of that step (so it joined one run's step and not the
other's: the clocks drifted apart), or, with every request's arrival on the same side of both
starts, a different scheduling decision on the same queue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from records.step_shapes import StepShapeRecord


def explain(
    step_idx: int | None,
    measured: Sequence[StepShapeRecord],
    predicted: Sequence[StepShapeRecord],
    predicted_starts: Sequence[float],
    arrivals: Mapping[str, float],
) -> dict[str, Any]:
    """The reason the runs part at ``step_idx`` (``first_divergence``'s): ``reason`` is
    ``identical``, ``length`` (one run ran out of steps), ``arrival`` or ``scheduling``, with
    the requests and times that show it. ``predicted_starts`` are the simulated steps' start
    times; ``arrivals`` each request's arrival (s, on the runs' timeline)."""
    if step_idx is None:
        return {"reason": "identical", "text": "the batches are identical throughout"}
    if step_idx >= len(measured) or step_idx >= len(predicted):
        return {
            "reason": "length",
            "text": f"one run has no step {step_idx} (the other ran more steps)",
        }
    engine, sim = measured[step_idx], predicted[step_idx]
    engine_start = engine.start_s
    sim_start = predicted_starts[step_idx] if step_idx < len(predicted_starts) else None
    only = sorted(set(engine.request_ids) ^ set(sim.request_ids))
    if sim_start is not None:
        early, late = sorted((engine_start, sim_start))
        between = [r for r in only if r in arrivals and early < arrivals[r] <= late]
        if between:
            first = between[0]
            side = "the engine's" if arrivals[first] <= engine_start else "the simulator's"
            return {
                "reason": "arrival",
                "request_id": first,
                "arrival_s": arrivals[first],
                "engine_start_s": engine_start,
                "sim_start_s": sim_start,
                "text": (
                    f"request {first} arrived at {arrivals[first]:.4f} s, between the engine's "
                    f"start of step {step_idx} ({engine_start:.4f} s) and the simulator's "
                    f"({sim_start:.4f} s), so it joined only {side} step: the two clocks had "
                    f"drifted {abs(sim_start - engine_start) * 1e3:.1f} ms apart"
                ),
            }
    what = (
        f"requests only in one run: {', '.join(only[:4])}"
        if only
        else "the same requests with different chunk sizes or contexts"
    )
    return {
        "reason": "scheduling",
        "requests_in_one_run": only,
        "text": f"a different scheduling decision at step {step_idx} ({what}), every arrival "
        "on the same side of both runs' starts",
    }
