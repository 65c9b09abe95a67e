"""The engine's per-step wall and thread-CPU times: ``step_shapes.jsonl`` round-trips them and
reads files written before them; ``StepRecorder`` writes them as steps.csv columns for every
step or for none, so a simulated run's steps.csv keeps its columns."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from core.batch import ScheduledBatch
from core.memory import MemorySnapshot
from records.schema import ENGINE_STEP_COLUMNS, STEP_COLUMNS, StepRecorder
from records.step_shapes import StepShapeRecord, load_step_shapes, write_step_shapes


def _record(**changes: object) -> StepShapeRecord:
    base = StepShapeRecord(
        step_idx=0,
        start_s=0.0,
        duration_s=0.2,
        prepare_s=0.01,
        update_s=0.05,
        request_ids=("a",),
        prefill_chunks=(),
        decode_context_tokens=(40,),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_wall_and_cpu_times_round_trip_and_older_files_read(tmp_path: Path) -> None:
    path = tmp_path / "step_shapes.jsonl"
    timed = _record(wall_s=0.6, cpu_s=0.25)
    write_step_shapes(path, [timed])
    assert load_step_shapes(path) == [timed]
    old = {k: v for k, v in timed.to_json().items() if k not in ("wall_s", "cpu_s")}
    path.write_text(json.dumps(old) + "\n")
    (loaded,) = load_step_shapes(path)
    assert (loaded.wall_s, loaded.cpu_s) == (None, None)


def test_bad_cpu_time_names_the_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "step_shapes.jsonl"
    line = {**_record().to_json(), "cpu_s": "fast"}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"step_shapes.jsonl:1: field 'cpu_s': expected float"):
        load_step_shapes(path)
    with pytest.raises(ValueError, match="cpu_s must be finite and >= 0"):
        _record(cpu_s=-1.0)


def _batch() -> ScheduledBatch:
    memory = MemorySnapshot(16, 4, 0, 0, 0, 0, 12, 0)
    return ScheduledBatch(step_idx=0, now_s=0.0, memory=memory)


def test_step_recorder_writes_engine_times_for_all_steps_or_none() -> None:
    engine = StepRecorder()
    engine.record(_batch(), 0.0, 0.2, wall_cpu_s=(0.5, 0.25))
    engine.record(_batch(), 0.2, 0.1, wall_cpu_s=(0.3, 0.15))
    frame = engine.to_frame()
    assert list(frame.columns) == [*STEP_COLUMNS, *ENGINE_STEP_COLUMNS]
    assert list(frame["cpu_s"]) == [0.25, 0.15]
    assert list(frame["wall_s"]) == [0.5, 0.3]
    with pytest.raises(ValueError, match="wall_cpu_s given for some steps and not others"):
        engine.record(_batch(), 0.3, 0.1)

    simulated = StepRecorder()
    simulated.record(_batch(), 0.0, 0.2)
    assert list(simulated.to_frame().columns) == list(STEP_COLUMNS)
    with pytest.raises(ValueError, match="wall_cpu_s given for some steps and not others"):
        simulated.record(_batch(), 0.2, 0.1, wall_cpu_s=(0.3, 0.15))
