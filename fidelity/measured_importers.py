"""Importers of measured serving runs (``IMPORTERS``): LLMServingSim's vLLM runs
(``requests.jsonl`` + ``meta.json``, `fidelity.measured_llmservingsim`) and ``vllm bench serve``
result JSON (saved with ``--save-detailed``), each read into a ``MeasuredRun``: per-request
rows, replay trace, settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from core.model.presets import preset_for_model_id
from fidelity.measured import MeasuredRun
from fidelity.measured_llmservingsim import import_llmservingsim
from fidelity.measured_rows import (
    WorkloadRow,
    listed,
    load_workload,
    read_json_object,
    recorded_kv_capacity,
    replay_trace,
    request_rows,
)

__all__ = ["IMPORTERS", "Importer", "WorkloadRow", "import_llmservingsim", "import_vllm_bench"]
__all__ += ["load_workload"]


class Importer(Protocol):
    """What an importer takes: the source, the workload file (or None), the server's log (or
    None) and ``without_workload`` (import no prompt contents even where the source names a
    workload)."""

    def __call__(
        self,
        source: str | Path,
        workload: str | Path | None = None,
        vllm_log: str | Path | None = None,
        /,
        *,
        without_workload: bool = False,
    ) -> MeasuredRun: ...


def _list(payload: dict[str, Any], key: str, path: Path, size: int | None) -> list[Any]:
    value = payload.get(key)
    if not isinstance(value, list):
        raise ValueError(
            f"{path}: field {key!r} must be a list (save the result with --save-detailed)"
        )
    if size is not None and len(value) != size:
        raise ValueError(f"{path}: field {key!r} has {len(value)} items, input_lens {size}")
    return value


def _numbers(
    payload: dict[str, Any], key: str, path: Path, size: int | None, kind: type = float
) -> list[Any]:
    """``payload[key]``, a list of numbers (``kind``: int or float; None reads as 0 where a
    failed request left it empty), each entry that is not one named by its index."""
    out = []
    for index, value in enumerate(_list(payload, key, path, size)):
        number = 0 if value is None else value
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"{path}: {key}[{index}] is not a number: {value!r}")
        if kind is int and number != int(number):
            raise ValueError(f"{path}: {key}[{index}] is not a whole number: {value!r}")
        out.append(kind(number))
    return out


def import_vllm_bench(
    path: str | Path,
    workload: str | Path | None = None,
    vllm_log: str | Path | None = None,
    *,
    without_workload: bool = False,
) -> MeasuredRun:
    """A ``vllm bench serve`` / ``benchmark_serving.py`` result JSON with per-request lists
    (``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``; ``start_times`` in
    recent vLLM). Request i is workload line i (`_checked_lengths`); without ``start_times``
    the workload's ``arrival_time_ns`` give the arrivals. Failed requests are kept as status
    ``failed``. The result names no workload, so ``without_workload`` changes nothing."""
    del without_workload  # a result JSON names no workload to leave out
    path = Path(path)
    payload = read_json_object(path)
    prompt = _numbers(payload, "input_lens", path, None, int)
    size = len(prompt)
    if not size:
        raise ValueError(f"{path}: input_lens is empty")
    output = _numbers(payload, "output_lens", path, size, int)
    ttfts = _numbers(payload, "ttfts", path, size)
    itls = _list(payload, "itls", path, size)
    errors = _list(payload, "errors", path, size) if "errors" in payload else [""] * size
    rows = load_workload(workload) if workload is not None else None
    if rows is not None and len(rows) < size:
        raise ValueError(f"{workload}: {len(rows)} lines for {size} benchmark requests")
    if "start_times" in payload:
        starts = np.array(_numbers(payload, "start_times", path, size), dtype=float)
    elif rows is not None and all(r.arrival_ns is not None for r in rows[:size]):
        starts = np.array([r.arrival_ns for r in rows[:size]], dtype=float) / 1e9
    else:
        raise ValueError(
            f"{path}: no start_times (older vLLM); pass --workload FILE.jsonl with arrival_time_ns"
        )
    ok = np.array([not err for err in errors], dtype=bool)
    first = starts + np.array(ttfts)
    gaps = [np.asarray(g or [], dtype=float) for g in itls]
    finish = first + np.array([g.sum() for g in gaps])
    lo = np.array([g.min() if g.size else np.nan for g in gaps])
    hi = np.array([g.max() if g.size else np.nan for g in gaps])
    ids = [f"bench-{i}" for i in range(size)]
    times = {"arrival": starts, "scheduled": starts, "first_token": first, "finish": finish}
    frame = request_rows(ids, times, (np.array(prompt), np.array(output)), (lo, hi))
    frame["queueing_ms"] = np.nan  # the client does not see scheduling
    frame.loc[~ok, "status"] = "failed"
    frame.loc[~ok, "reject_reason"] = [
        str(e) for e, good in zip(errors, ok, strict=True) if not good
    ]
    for column in ("first_token_s", "finish_s", "ttft_ms", "tpot_ms", "e2el_ms"):
        frame.loc[~ok, column] = np.nan
    warnings = _checked_lengths(path, rows, (prompt, output), ok) if rows is not None else []
    reported = {k: v for k, v in payload.items() if not isinstance(v, list)}
    replay: dict[str, Any] = {"policy": "chunked"}
    model = preset_for_model_id(str(payload.get("model_id") or ""))
    if model:
        replay["model"] = model
    name = path.stem
    trace = replay_trace(name, frame, rows, list(range(size)))
    capacity = recorded_kv_capacity(vllm_log, payload, str(path), {"block_size": 16})
    used = str(workload) if workload is not None else None
    return MeasuredRun(
        name, str(path), "vllm-bench", frame, trace, replay, reported, None, capacity, used,
        tuple(warnings),
    )  # fmt: skip


def _checked_lengths(
    path: Path, rows: list[WorkloadRow], lengths: tuple[list[int], list[int]], ok: np.ndarray
) -> list[str]:
    """Each request's lengths against its workload line: the prompt must be the line's; the
    output may be shorter than the line's ``output_toks`` (the request's ``max_tokens``: it
    stops at an end-of-sequence token unless the benchmark ran with ``--ignore-eos``), which
    is a warning naming the requests, but never longer. Failed requests wrote nothing."""
    prompt, output = lengths
    short = []
    for i, (row, measured_in, measured_out) in enumerate(zip(rows, prompt, output, strict=False)):
        if row.prompt_tokens != measured_in:
            raise ValueError(
                f"{path}: request {i} has input_lens {measured_in} but workload line {i + 1} "
                f"has {row.prompt_tokens}; wrong --workload?"
            )
        if not ok[i]:
            continue
        if measured_out > row.output_tokens:
            raise ValueError(
                f"{path}: request {i} has output_lens {measured_out} but workload line {i + 1} "
                f"asks for at most {row.output_tokens} (output_toks); wrong --workload?"
            )
        if measured_out < row.output_tokens:
            short.append(f"{i} ({measured_out} of {row.output_tokens})")
    if not short:
        return []
    return [
        f"{path}: {len(short)} request(s) wrote fewer output tokens than their workload line's "
        f"output_toks, as a request does that stops at end-of-sequence (vllm bench serve "
        f"--ignore-eos prevents it): {listed(short)}; the replay writes the measured lengths"
    ]


IMPORTERS: dict[str, Importer] = {
    "llmservingsim": import_llmservingsim,
    "vllm-bench": import_vllm_bench,
}
