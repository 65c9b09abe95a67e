"""Run records: per-step columns kept compactly while simulating, and per-request rows built
at the end (both as pandas DataFrames for files and reports)."""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import numpy as np
import pandas as pd

from core.batch import ScheduledBatch
from core.memory import MemorySnapshot
from core.request import Request


class TransferLike(Protocol):
    request_id: str
    num_bytes: int
    queued_s: float
    start_s: float
    end_s: float


# The partition of the KV cache's slots (see core.memory.MemorySnapshot).
SLOT_COLUMNS = (
    "real_token_slots",
    "internal_fragmentation_slots",
    "reservation_waste_slots",
    "cached_free_slots",
    "external_fragmentation_slots",
    "free_slots",
)
POOL_CODES: Final = {"colocated": 0, "prefill": 1, "decode": 2}
# The step columns in order, each with how it is kept (an ``array`` type code): times as
# doubles, per-step counts as 32-bit integers, the pool as a byte, sums over a row's steps
# (tokens, slots) as 64-bit integers. At 100k requests (300k rows) that is 14 MB less than
# doubles throughout.
COLUMN_TYPECODES = {
    "replica": "i",
    "pool": "b",
    "start_s": "d",
    "duration_s": "d",
    "num_steps": "i",
    "num_requests": "i",
    "num_prefill_tokens": "q",
    "num_decode_tokens": "q",
    "num_padding_tokens": "q",
    "num_running": "i",
    "num_waiting": "i",
    "num_swapped": "i",
    "num_preempted": "i",
    "num_copies": "i",
    "num_swap_out_blocks": "i",
    "num_swap_in_blocks": "i",
    **dict.fromkeys(SLOT_COLUMNS, "q"),
    "shared_saved_slots": "q",
}
STEP_COLUMNS = tuple(COLUMN_TYPECODES)
ENGINE_STEP_COLUMNS = ("wall_s", "cpu_s")
"""Columns only the real engine writes (after STEP_COLUMNS): each step's whole busy time
(schedule, prepare, execute, the scheduler's update) on the wall clock and in the engine
thread's CPU time. ``duration_s`` is on the run's timeline, which is one of the two (the run's
``config.clock``)."""
# Columns that a row covering several identical steps holds as sums over them.
SUMMED_COLUMNS = (
    "num_steps",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_padding_tokens",
    *SLOT_COLUMNS,
    "shared_saved_slots",
)

_ROW: Final = struct.Struct(f"{len(STEP_COLUMNS)}d")  # one step row, packed
_FLUSH_ROWS: Final = 4096


class StepRecorder:
    """One row per executed step, or per run of identical decode steps skipped over at once
    (``num_steps`` > 1), stored column-wise in compact arrays."""

    def __init__(self, on_step: Callable[[float], None] | None = None) -> None:
        self._columns: dict[str, array[Any]] = {
            name: array(code) for name, code in COLUMN_TYPECODES.items()
        }
        # Rows wait here packed as doubles and move into the columns in bulk (much cheaper
        # per row than appending to each column).
        self._rows = bytearray()
        self._num_rows = 0
        self.on_step = on_step
        # The engine's own measurements (ENGINE_STEP_COLUMNS), one pair per row when given.
        self._engine_times: dict[str, array[float]] = {}

    @property
    def columns(self) -> dict[str, array[Any]]:
        """Every recorded row, column by column (in STEP_COLUMNS order)."""
        self._flush()
        return self._columns

    def _flush(self) -> None:
        if self._num_rows:
            rows = np.frombuffer(self._rows, dtype=np.float64).reshape(self._num_rows, -1)
            for idx, column in enumerate(self._columns.values()):
                values = rows[:, idx].astype(f"={column.typecode}", casting="unsafe")
                column.frombytes(values.tobytes())
            del rows
            self._rows = bytearray()
            self._num_rows = 0

    def __len__(self) -> int:
        return len(self._columns["start_s"]) + self._num_rows

    def record(
        self,
        batch: ScheduledBatch,
        start_s: float,
        duration_s: float,
        replica: int = 0,
        pool: str = "colocated",
        wall_cpu_s: tuple[float, float] | None = None,
    ) -> None:
        """One executed step; the engine also gives ``wall_cpu_s`` (ENGINE_STEP_COLUMNS), for
        every step of a run or for none."""
        memory = batch.memory
        assert memory is not None
        if wall_cpu_s is not None:
            if len(self) and not self._engine_times:
                raise ValueError("wall_cpu_s given for some steps and not others")
            for name, value in zip(ENGINE_STEP_COLUMNS, wall_cpu_s, strict=True):
                self._engine_times.setdefault(name, array("d")).append(value)
        elif self._engine_times:
            raise ValueError("wall_cpu_s given for some steps and not others")
        self._row(batch, start_s, duration_s, 1, memory, replica, pool)

    def record_repeat(
        self,
        batch: ScheduledBatch,
        start_s: float,
        step_end_s: list[float],
        memory: MemorySnapshot,
        tokens: tuple[int, int],
        replica: int = 0,
        pool: str = "colocated",
        num_requests: int = -1,
    ) -> None:
        """One row for a run of steps identical to ``batch``: token counts and memory slots
        are sums over its steps (``memory`` is the sum of their snapshots), so column sums
        are the same whether steps were recorded one by one or in runs. ``num_requests``
        (if not -1) counts the step's requests instead of ``batch.requests`` (a planned
        batch may not list them: ``FastForward``'s ``itemized``)."""
        duration_s = step_end_s[-1] - start_s
        self._row(
            batch,
            start_s,
            duration_s,
            len(step_end_s),
            memory,
            replica,
            pool,
            tokens,
            num_requests=num_requests,
        )

    def record_admission(
        self,
        batch: ScheduledBatch,
        start_s: float,
        end_s: float,
        memory: MemorySnapshot,
        tokens: tuple[int, int],
        replica: int = 0,
        pool: str = "colocated",
        num_requests: int = -1,
    ) -> None:
        """One row for the last step of a run of steps like ``batch`` that also admitted the
        waiting head (one more request running, one fewer waiting); ``num_requests`` as in
        ``record_repeat``."""
        self._row(
            batch,
            start_s,
            end_s - start_s,
            1,
            memory,
            replica,
            pool,
            tokens,
            admitted=1,
            num_requests=num_requests,
        )

    def _row(
        self,
        batch: ScheduledBatch,
        start_s: float,
        duration_s: float,
        num_steps: int,
        memory: MemorySnapshot,
        replica: int,
        pool: str,
        tokens: tuple[int, int] | None = None,
        admitted: int = 0,
        num_requests: int = -1,
    ) -> None:
        if num_requests < 0:
            num_requests = len(batch.requests)
        if tokens is None:
            prefill = decode = 0
            for scheduled in batch.requests:
                if scheduled.is_prefill:
                    prefill += scheduled.num_positions * len(scheduled.seq_ids)
                else:
                    decode += len(scheduled.seq_ids)
            tokens = (prefill * num_steps, decode * num_steps)
        self._rows += _ROW.pack(
            replica,
            POOL_CODES[pool],
            start_s,
            duration_s,
            num_steps,
            num_requests + admitted,
            tokens[0],
            tokens[1],
            batch.num_padding_tokens * num_steps,
            batch.num_running + admitted,
            max(0, batch.num_waiting - admitted),
            batch.num_swapped,
            len(batch.preempted_ids),
            len(batch.copies) + len(batch.range_copies),
            len(batch.swap_out),
            len(batch.swap_in),
            memory.real_token_slots,
            memory.internal_fragmentation_slots,
            memory.reservation_waste_slots,
            memory.cached_free_slots,
            memory.external_fragmentation_slots,
            memory.free_slots,
            memory.shared_saved_slots,
        )
        self._num_rows += 1
        if self._num_rows >= _FLUSH_ROWS:
            self._flush()
        if self.on_step is not None:
            self.on_step(start_s + duration_s)

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(
            {
                name: np.frombuffer(col, dtype=f"={col.typecode}").astype(
                    np.float64 if col.typecode == "d" else np.int64
                )
                for name, col in self.columns.items()
            }
        )
        names = {code: name for name, code in POOL_CODES.items()}
        frame["pool"] = [names[int(code)] for code in frame["pool"]]
        for name, column in self._engine_times.items():
            frame[name] = list(column)
        return frame


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def _itl_extremes(request: Request) -> tuple[float, float] | None:
    """Smallest and largest gap between the request's token emissions."""
    t = request.tokens
    if t.num_emissions < 2:
        return None
    ends = np.frombuffer(t.step_end_s, dtype=np.float64)
    lo, hi = math.inf, -math.inf
    prev_last: int | None = None
    for start, count in zip(t.run_starts, t.run_counts, strict=True):
        gap = None
        if prev_last is not None:
            gap = float(ends[start] - ends[prev_last])
        elif t.external_first_s is not None:  # first token from a prefill replica
            gap = float(ends[start]) - t.external_first_s
        if gap is not None:
            lo, hi = min(lo, gap), max(hi, gap)
        if count > 1:
            run = np.diff(ends[start : start + count])
            lo, hi = min(lo, float(run.min())), max(hi, float(run.max()))
        prev_last = start + count - 1
    return lo, hi


def request_frame(requests: list[Request], transfers: Sequence[TransferLike] = ()) -> pd.DataFrame:
    """Per-request rows: timestamps (s), latencies (ms), counters and the outcome; with
    disaggregation also each request's KV transfer (bytes, time queued, start)."""
    rows = []
    for r in requests:
        gaps = _itl_extremes(r)
        rows.append(
            {
                "request_id": r.request_id,
                "status": r.status.value,
                "reject_reason": r.reject_reason or "",
                "arrival_s": r.arrival_s,
                "first_scheduled_s": r.first_scheduled_s,
                "first_token_s": r.first_token_s,
                "finish_s": r.finish_s,
                "prompt_tokens": r.num_prompt_tokens,
                "output_tokens": r.num_output_tokens,
                "num_samples": r.n,
                "queueing_ms": _ms(r.queueing_s),
                "ttft_ms": _ms(r.ttft_s),
                "tpot_ms": _ms(r.tpot_s),
                "itl_max_ms": _ms(gaps[1]) if gaps else None,
                "itl_min_ms": _ms(gaps[0]) if gaps else None,
                "e2el_ms": _ms(r.e2e_s),
                "num_preemptions": r.num_preemptions,
                "num_recomputed_tokens": r.num_recomputed_tokens,
                "num_blocks_swapped_out": r.num_blocks_swapped_out,
                "num_blocks_swapped_in": r.num_blocks_swapped_in,
                "num_prefix_hit_tokens": r.num_prefix_hit_tokens,
                "num_cow_copies": r.num_cow_copies,
            }
        )
    frame = pd.DataFrame(rows)
    if any(r.priority for r in requests):  # (only a trace with priority classes)
        frame.insert(
            frame.columns.get_loc("num_samples") + 1, "priority", [r.priority for r in requests]
        )
    if transfers:
        by_id = {t.request_id: t for t in transfers}
        found = [by_id.get(r.request_id) for r in requests]
        frame["kv_transfer_bytes"] = [t.num_bytes if t else 0 for t in found]
        frame["kv_transfer_queue_ms"] = [
            (t.start_s - t.queued_s) * 1000.0 if t else None for t in found
        ]
        frame["kv_transfer_start_s"] = [t.start_s if t else None for t in found]
        frame["kv_transfer_end_s"] = [t.end_s if t else None for t in found]
    return frame
