"""``step_shapes.jsonl``: one line per executed engine step with its batch's shape (each prefill
chunk's new and context tokens, each decode's context, memory moves, the requests in it) and its
measured times, so validation can price *the engine's own batches* with a cost model."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.batch import ScheduledBatch
from core.text_files import open_text

STEP_SHAPES_FILE = "step_shapes.jsonl"


@dataclass(frozen=True, slots=True)
class StepShapeRecord:
    """One executed step. ``prefill_chunks`` holds (new tokens, context before) per prefilling
    sequence and ``decode_context_tokens`` the context (new token included) per decoding
    sequence, as ``sim.costmodel.step_shape.StepShape`` takes them. ``duration_s`` is
    schedule + prepare + execute; ``update_s`` the scheduler's update after it (the engine is
    busy for both); both are on the run's timeline (wall clock, or thread-CPU time with
    ``--clock cpu``). ``wall_s`` and ``cpu_s`` are the whole step on each clock (None in files
    from before)."""

    step_idx: int
    start_s: float
    duration_s: float
    prepare_s: float
    update_s: float
    request_ids: tuple[str, ...]
    prefill_chunks: tuple[tuple[int, int], ...]
    decode_context_tokens: tuple[int, ...]
    num_padding_tokens: int = 0
    num_copy_blocks: int = 0
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0
    wall_s: float | None = None
    cpu_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("start_s", "duration_s", "prepare_s", "update_s", "wall_s", "cpu_s"):
            value = getattr(self, name)
            if value is None and name in ("wall_s", "cpu_s"):
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"StepShapeRecord.{name} must be finite and >= 0, got {value!r}")
        for name in ("num_padding_tokens", "num_copy_blocks", "num_swap_out_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"StepShapeRecord.{name} must be >= 0, got {getattr(self, name)}")
        if self.num_swap_in_blocks < 0:
            raise ValueError(
                f"StepShapeRecord.num_swap_in_blocks must be >= 0, got {self.num_swap_in_blocks}"
            )

    @property
    def busy_s(self) -> float:
        """What one step costs the engine's timeline: its duration plus the update after it."""
        return self.duration_s + self.update_s

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks) + len(self.decode_context_tokens)

    @property
    def kind(self) -> str:
        """``decode-only``, ``prefill-heavy`` (prefill tokens are at least half the step's) or
        ``mixed``; a step without decodes is prefill-heavy."""
        num_prefill = sum(n for n, _ in self.prefill_chunks)
        if num_prefill == 0:
            return "decode-only"
        return "prefill-heavy" if 2 * num_prefill >= self.num_batched_tokens else "mixed"

    def to_json(self) -> dict[str, Any]:
        return {
            "step_idx": self.step_idx,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "prepare_s": self.prepare_s,
            "update_s": self.update_s,
            "request_ids": list(self.request_ids),
            "prefill_chunks": [list(c) for c in self.prefill_chunks],
            "decode_context_tokens": list(self.decode_context_tokens),
            "num_padding_tokens": self.num_padding_tokens,
            "num_copy_blocks": self.num_copy_blocks,
            "num_swap_out_blocks": self.num_swap_out_blocks,
            "num_swap_in_blocks": self.num_swap_in_blocks,
            **({"wall_s": self.wall_s} if self.wall_s is not None else {}),
            **({"cpu_s": self.cpu_s} if self.cpu_s is not None else {}),
        }


def batch_sequences(
    batch: ScheduledBatch,
) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """(prefill chunks as (tokens, context), decode contexts) of ``batch``, one entry per
    sequence: what pricing a step needs of its requests."""
    chunks: list[tuple[int, int]] = []
    contexts: list[int] = []
    for scheduled in batch.requests:
        width = len(scheduled.seq_ids)
        if scheduled.is_prefill:
            chunk = (scheduled.num_positions, scheduled.num_computed_tokens)
            if width == 1:
                chunks.append(chunk)
            else:
                chunks.extend([chunk] * width)
        elif width == 1:  # (one sequence: no list to build, the common case)
            contexts.append(scheduled.num_computed_tokens + 1)
        else:
            contexts.extend([scheduled.num_computed_tokens + 1] * width)
    return tuple(chunks), tuple(contexts)


def batch_shape(
    batch: ScheduledBatch,
) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
    """(request ids, prefill chunks, decode contexts) of ``batch``, one entry per sequence."""
    ids = tuple(s.request.request_id for s in batch.requests)
    return (ids, *batch_sequences(batch))


def record_of(
    step_idx: int,
    batch: ScheduledBatch,
    start_s: float,
    duration_s: float,
    prepare_s: float,
    update_s: float,
    wall_s: float | None = None,
    cpu_s: float | None = None,
) -> StepShapeRecord:
    """The record of one executed ``batch``."""
    ids, chunks, contexts = batch_shape(batch)
    return StepShapeRecord(
        step_idx=step_idx,
        start_s=start_s,
        duration_s=duration_s,
        prepare_s=prepare_s,
        update_s=update_s,
        request_ids=ids,
        prefill_chunks=chunks,
        decode_context_tokens=contexts,
        num_padding_tokens=batch.num_padding_tokens,
        num_copy_blocks=len(batch.copies) + len(batch.range_copies),
        num_swap_out_blocks=len(batch.swap_out),
        num_swap_in_blocks=len(batch.swap_in),
        wall_s=wall_s,
        cpu_s=cpu_s,
    )


def write_step_shapes(path: str | Path, records: Iterable[StepShapeRecord]) -> None:
    """One JSON object per line, in step order."""
    with Path(path).open("w") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")


def _pairs(value: Any, where: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(_is_count(v) for v in p) for p in value
    ):
        raise ValueError(f"{where}: field 'prefill_chunks': expected [new, context] pairs")
    return tuple((p[0], p[1]) for p in value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _field(obj: dict[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in obj:
        raise ValueError(f"{where}: field {key!r}: missing")
    value = obj[key]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise ValueError(f"{where}: field {key!r}: expected {kind.__name__}, got {value!r}")
    return value


def _optional_seconds(obj: dict[str, Any], key: str, where: str) -> float | None:
    return float(_field(obj, key, where, float)) if key in obj else None


def parse_step_shape(obj: Any, where: str) -> StepShapeRecord:
    """One line's object; errors name ``where`` (file:line) and the field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object")
    contexts = _field(obj, "decode_context_tokens", where, list)
    if not all(_is_count(c) and c > 0 for c in contexts):
        raise ValueError(f"{where}: field 'decode_context_tokens': expected positive integers")
    ids = _field(obj, "request_ids", where, list)
    try:
        return StepShapeRecord(
            step_idx=_field(obj, "step_idx", where, int),
            start_s=float(_field(obj, "start_s", where, float)),
            duration_s=float(_field(obj, "duration_s", where, float)),
            prepare_s=float(_field(obj, "prepare_s", where, float)),
            update_s=float(_field(obj, "update_s", where, float)),
            request_ids=tuple(str(i) for i in ids),
            prefill_chunks=_pairs(obj.get("prefill_chunks"), where),
            decode_context_tokens=tuple(contexts),
            num_padding_tokens=int(obj.get("num_padding_tokens", 0)),
            num_copy_blocks=int(obj.get("num_copy_blocks", 0)),
            num_swap_out_blocks=int(obj.get("num_swap_out_blocks", 0)),
            num_swap_in_blocks=int(obj.get("num_swap_in_blocks", 0)),
            wall_s=_optional_seconds(obj, "wall_s", where),
            cpu_s=_optional_seconds(obj, "cpu_s", where),
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from error


def load_step_shapes(path: str | Path) -> list[StepShapeRecord]:
    """Read ``step_shapes.jsonl`` (or its gzip-compressed copy, read as it is); a bad line is a
    ValueError naming the file and line."""
    path = Path(path)
    records: list[StepShapeRecord] = []
    with open_text(path, "step shapes") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.msg})") from error
            records.append(parse_step_shape(obj, where))
    return records


def shapes_equal(a: StepShapeRecord, b: StepShapeRecord) -> bool:
    """Same requests with the same chunk and context sizes (times are not compared)."""
    return _key(a) == _key(b)


def _key(r: StepShapeRecord) -> tuple[Sequence[Any], ...]:
    return (r.request_ids, r.prefill_chunks, r.decode_context_tokens)
