"""Timing the engine's parts for the simulator's calibrated cost model: one decoder layer's
linear layers and elementwise ops by tokens, paged decode attention by batch x context, prefill
attention by chunk x context, the KV store, block copies, swaps each way, LM head + sampling, the
per-step input preparation, and whole engine steps as check points.

Returns plain tables (``measure``); ``fidelity.calibrate`` turns them into a profile file, so this
package never imports the simulator. Every point is warmed up, then timed as a median over
repeats (``timer``). The sizes are ``grid``'s, the parts ``parts``', the whole steps ``steps``';
``measure`` runs them all. The names below are the entry points ``fidelity.calibrate`` reads.
"""

from __future__ import annotations

from engine.profiling.grid import SMALL_GRID, CalibrationGrid
from engine.profiling.measure import Measurements, measure, point_count

__all__ = ["SMALL_GRID", "CalibrationGrid", "Measurements", "measure", "point_count"]
