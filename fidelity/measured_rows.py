"""What every measured-run importer reads and builds the same way: JSON Lines and JSON objects
whose errors name the file and line, typed fields, the workload JSONL (``WorkloadRow``), our
``requests.csv`` rows, the replay trace and the KV capacity the run recorded."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fidelity.vllm_log import KvCapacityRecord, kv_capacity_from_log, kv_capacity_from_metadata
from traces.schema import Trace, TraceRequest


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    """One line of a workload JSONL (LLMServingSim's format): lengths, relative arrival, ids."""

    prompt_tokens: int
    output_tokens: int
    arrival_ns: int | None
    token_ids: tuple[int, ...] | None


def jsonl_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read ({error})") from error
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object")
        rows.append((number, record))
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object a file holds; an error names the file."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a JSON object ({error})") from error
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return payload


def number_field(
    record: dict[str, Any], key: str, where: str, minimum: float | None = None
) -> float:
    """``record[key]`` as a finite float (at least ``minimum``); errors name ``where``."""
    if key not in record:
        raise ValueError(f"{where}: missing field {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: field {key!r} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: field {key!r} must be >= {minimum:g}, got {value!r}")
    return float(value)


def int_field(record: dict[str, Any], key: str, where: str, minimum: int) -> int:
    """``record[key]`` as an int of at least ``minimum``; errors name ``where``."""
    value = number_field(record, key, where, minimum)
    if not value.is_integer():
        raise ValueError(f"{where}: field {key!r} must be an integer, got {record[key]!r}")
    return int(value)


def load_workload(path: str | Path) -> list[WorkloadRow]:
    """Read a workload JSONL: ``input_toks``, ``output_toks``, optional ``arrival_time_ns``
    and ``input_tok_ids`` (which must hold ``input_toks`` ints)."""
    path = Path(path)
    rows = []
    for number, record in jsonl_records(path):
        where = f"{path}:{number}"
        prompt = int_field(record, "input_toks", where, 1)
        ids = record.get("input_tok_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise ValueError(f"{where}: field 'input_tok_ids' must be a list of ints")
            if len(ids) != prompt:
                raise ValueError(
                    f"{where}: field 'input_tok_ids' has {len(ids)} ids but input_toks is {prompt}"
                )
        arrival = record.get("arrival_time_ns")
        rows.append(
            WorkloadRow(
                prompt,
                int_field(record, "output_toks", where, 0),
                int_field(record, "arrival_time_ns", where, 0) if arrival is not None else None,
                tuple(ids) if ids is not None else None,
            )
        )
    return rows


def request_rows(
    ids: list[str],
    times: dict[str, np.ndarray],
    lengths: tuple[np.ndarray, np.ndarray],
    itl_extremes: tuple[np.ndarray, np.ndarray] | None,
) -> pd.DataFrame:
    """``requests.csv`` rows from absolute times (s, any origin): arrival, first scheduled,
    first token, finish. Counters the source does not record are left empty."""
    prompt, output = lengths
    origin = float(times["arrival"].min())
    arrival = times["arrival"] - origin
    first = times["first_token"] - origin
    finish = times["finish"] - origin
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
    empty = np.full(len(ids), np.nan)
    frame = pd.DataFrame(
        {
            "request_id": ids,
            "status": "finished",
            "reject_reason": "",
            "arrival_s": arrival,
            "first_scheduled_s": times["scheduled"] - origin,
            "first_token_s": first,
            "finish_s": finish,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "num_samples": 1,
            "queueing_ms": (times["scheduled"] - times["arrival"]) * 1000.0,
            "ttft_ms": (first - arrival) * 1000.0,
            "tpot_ms": tpot * 1000.0,
            "itl_max_ms": itl_extremes[1] * 1000.0 if itl_extremes else empty,
            "itl_min_ms": itl_extremes[0] * 1000.0 if itl_extremes else empty,
            "e2el_ms": (finish - arrival) * 1000.0,
        }
    )
    for column in (
        "num_preemptions",
        "num_recomputed_tokens",
        "num_blocks_swapped_out",
        "num_blocks_swapped_in",
        "num_prefix_hit_tokens",
        "num_cow_copies",
    ):
        frame[column] = empty
    return frame


def replay_trace(
    name: str,
    frame: pd.DataFrame,
    workload: list[WorkloadRow] | None,
    workload_idx: list[int],
) -> Trace:
    """Replay trace: the measured arrivals and lengths, the workload's token ids."""
    requests = []
    for position, row in enumerate(frame.itertuples(index=False)):
        ids = workload[workload_idx[position]].token_ids if workload else None
        requests.append(
            TraceRequest(
                request_id=str(row.request_id),
                arrival_s=float(row.arrival_s),
                prompt_tokens=int(row.prompt_tokens),
                output_tokens=max(1, int(row.output_tokens)),
                prompt_token_ids=ids,
            )
        )
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    return Trace(name, tuple(ordered))


def recorded_kv_capacity(
    log: str | Path | None, meta: dict[str, Any], where: str, replay: dict[str, Any]
) -> KvCapacityRecord | None:
    """The run's block count: from its log when one is given (which must state it), else
    from its metadata, else None."""
    if log is not None:
        found = kv_capacity_from_log(log, int(replay.get("block_size", 16)))
        if found is None:
            raise ValueError(
                f"{log}: no 'GPU KV cache size: N tokens' (vLLM v1) or '# GPU blocks: N' line"
            )
        return found
    return kv_capacity_from_metadata(meta, where)


def listed(items: list[str], most: int = 5) -> str:
    """``items`` joined by commas, the first ``most`` of them and then how many more."""
    shown = ", ".join(items[:most])
    return shown if len(items) <= most else f"{shown} and {len(items) - most} more"
