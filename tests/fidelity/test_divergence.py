"""Where two runs' batches part, and why: an arrival that fell between the two runs' starts of
that step, or a different decision on the same queue."""

from __future__ import annotations

from fidelity.divergence import explain
from records.step_shapes import StepShapeRecord


def _step(idx: int, start_s: float, ids: tuple[str, ...], chunk: int = 8) -> StepShapeRecord:
    return StepShapeRecord(
        step_idx=idx,
        start_s=start_s,
        duration_s=0.01,
        prepare_s=0.0,
        update_s=0.0,
        request_ids=ids,
        prefill_chunks=((chunk, 0),) if len(ids) > 1 else (),
        decode_context_tokens=(10,),
    )


def test_an_arrival_between_the_two_starts_is_named() -> None:
    engine = [_step(0, 0.0, ("a",)), _step(1, 0.012, ("a", "b"))]
    sim = [_step(0, 0.0, ("a",)), _step(1, 0.0, ("a",))]
    why = explain(1, engine, sim, [0.0, 0.009], {"a": 0.0, "b": 0.010})
    assert why["reason"] == "arrival" and why["request_id"] == "b"
    assert "joined only the engine's step" in why["text"]
    assert "drifted 3.0 ms apart" in why["text"]


def test_the_same_queue_and_other_batches_is_a_scheduling_decision() -> None:
    engine = [_step(0, 0.0, ("a", "b"), chunk=8)]
    sim = [_step(0, 0.0, ("a", "b"), chunk=4)]
    why = explain(0, engine, sim, [0.0], {"a": 0.0, "b": 0.0})
    assert why["reason"] == "scheduling"
    assert "different chunk sizes" in why["text"]


def test_identical_and_uneven_runs() -> None:
    assert explain(None, [], [], [], {})["reason"] == "identical"
    assert explain(1, [_step(0, 0.0, ("a",))], [], [], {})["reason"] == "length"
