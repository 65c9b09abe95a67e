"""An executor wrapper that keeps the shape of every batch the simulator prices, so that a
simulated run's steps can be compared with an engine run's (``step_shapes.jsonl``)."""

from __future__ import annotations

from typing import Any

from core.batch import ScheduledBatch, StepResult
from records.step_shapes import StepShapeRecord, record_of
from sim.executor import CostModelExecutor


class RecordingExecutor:
    """Wraps the simulator's executor and keeps the shape of every batch it prices."""

    def __init__(self, inner: CostModelExecutor) -> None:
        self.inner = inner
        self.shapes: list[StepShapeRecord] = []

    def execute(self, batch: ScheduledBatch) -> StepResult:
        result = self.inner.execute(batch)
        if not batch.is_empty:
            self.shapes.append(record_of(len(self.shapes), batch, 0.0, result.duration_s, 0.0, 0.0))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
