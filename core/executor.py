"""The executor protocol: the one piece the simulator and the real engine do differently."""

from __future__ import annotations

from typing import Protocol

from core.batch import ScheduledBatch, StepResult


class Executor(Protocol):
    """Runs one scheduled step: the real engine on a model, the simulator on a cost model."""

    def execute(self, batch: ScheduledBatch) -> StepResult: ...
