"""Importers of measured serving runs (``IMPORTERS``): LLMServingSim's vLLM runs
(``requests.jsonl`` + ``meta.json``) and ``vllm bench serve`` result JSON (saved with
``--save-detailed``), each read into a ``MeasuredRun``: per-request rows, replay trace, settings."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.model.presets import preset_for_model_id
from fidelity.measured import MeasuredRun
from fidelity.vllm_log import KvCapacityRecord, kv_capacity_from_log, kv_capacity_from_metadata
from sim.specs.hardware import HARDWARE_PRESETS
from traces.schema import Trace, TraceRequest

LINK_GB_BYTES = 1 << 30
"""Bytes in a GB of a cluster config's ``link_bw``, as ASTRA-Sim's analytical network backend
(LLMServingSim's) converts it (astra-network-analytical ``bw_GBps_to_Bpns``)."""


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    """One line of a workload JSONL (LLMServingSim's format): lengths, relative arrival, ids."""

    prompt_tokens: int
    output_tokens: int
    arrival_ns: int | None
    token_ids: tuple[int, ...] | None


def _jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
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


def _number(record: dict[str, Any], key: str, where: str, minimum: float | None = None) -> float:
    if key not in record:
        raise ValueError(f"{where}: missing field {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: field {key!r} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: field {key!r} must be >= {minimum:g}, got {value!r}")
    return float(value)


def _int(record: dict[str, Any], key: str, where: str, minimum: int) -> int:
    value = _number(record, key, where, minimum)
    if not value.is_integer():
        raise ValueError(f"{where}: field {key!r} must be an integer, got {record[key]!r}")
    return int(value)


def load_workload(path: str | Path) -> list[WorkloadRow]:
    """Read a workload JSONL: ``input_toks``, ``output_toks``, optional ``arrival_time_ns``
    and ``input_tok_ids`` (which must hold ``input_toks`` ints)."""
    path = Path(path)
    rows = []
    for number, record in _jsonl(path):
        where = f"{path}:{number}"
        prompt = _int(record, "input_toks", where, 1)
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
                _int(record, "output_toks", where, 0),
                _int(record, "arrival_time_ns", where, 0) if arrival is not None else None,
                tuple(ids) if ids is not None else None,
            )
        )
    return rows


def _request_rows(
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


def _trace(
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


def _hardware_preset(name: str, bandwidth_bytes_per_s: float | None = None) -> str | None:
    """The preset whose name, ignoring case and punctuation, is ``name`` (RTXPRO6000), or is
    ``name`` and an edition (RTX-PRO-6000-Server) whose memory bandwidth is the run's own
    ``bandwidth_bytes_per_s`` (to 0.5%): that edition is the card the run had."""

    def key(text: str) -> str:
        return "".join(c for c in text.lower() if c.isalnum())

    wanted = key(name)
    if bandwidth_bytes_per_s is not None:
        for preset, spec in HARDWARE_PRESETS.items():
            stated = spec.hbm_bandwidth_bytes_per_s
            if (
                key(preset).startswith(wanted)
                and key(preset) != wanted
                and abs(stated - bandwidth_bytes_per_s) <= 0.005 * bandwidth_bytes_per_s
            ):
                return preset
    return next((p for p in HARDWARE_PRESETS if key(p) == wanted), None)


def _replay_settings(engine: dict[str, Any], where: str) -> dict[str, Any]:
    """RunConfig settings from vLLM engine arguments: chunked prefill with vLLM v1's defaults
    (prefix caching on, 16-token blocks) and the run's own budget, max_num_seqs and TP."""
    replay: dict[str, Any] = {"policy": "chunked", "enable_prefix_caching": True, "block_size": 16}
    for ours, theirs in (
        ("tp", "tensor_parallel_size"),
        ("max_num_seqs", "max_num_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
        ("max_model_len", "max_model_len"),
        ("block_size", "block_size"),
        ("enable_prefix_caching", "enable_prefix_caching"),
        ("gpu_memory_utilization", "gpu_memory_utilization"),
    ):
        value = engine.get(theirs)
        if value is not None:
            replay[ours] = value
    dp = engine.get("data_parallel_size")
    if dp is not None:
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            raise ValueError(f"{where}: data_parallel_size must be a positive integer, got {dp!r}")
        if dp > 1:
            replay["data_parallel_size"] = dp
    if engine.get("enable_expert_parallel"):
        replay["enable_expert_parallel"] = True
    model = preset_for_model_id(engine.get("model"))
    if model:
        replay["model"] = model
    return replay


def _read_json(path: Path) -> dict[str, Any]:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a JSON object ({error})") from error
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return payload


def _llmservingsim_hardware(run_dir: Path, replay: dict[str, Any]) -> dict[str, Any] | None:
    """A hardware table from the run's cluster config.json: the preset its GPU name matches,
    with the config's memory size and bandwidth."""
    path = run_dir / "config.json"
    if not path.exists():
        return None
    config = _read_json(path)
    try:
        instance = config["nodes"][0]["instances"][0]
        name, memory = str(instance["hardware"]), instance["npu_mem"]
        size_gb, bandwidth_gbps = float(memory["mem_size"]), float(memory["mem_bw"])
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path}: no nodes[0].instances[0] hardware and npu_mem ({error})"
        ) from None
    if "mem_util" in memory:
        replay.setdefault("gpu_memory_utilization", float(memory["mem_util"]))
    base = _hardware_preset(name, bandwidth_gbps * 1e9)
    if base is None:
        return None
    table: dict[str, Any] = {
        "base": base,
        "name": f"{name} ({size_gb:g} GB, {bandwidth_gbps:g} GB/s per its config.json)",
        "hbm_bandwidth_bytes_per_s": bandwidth_gbps * 1e9,
        "hbm_capacity_bytes": int(size_gb * (1 << 30)),
    }
    table.update(_llmservingsim_link(config, path))
    return table


def _llmservingsim_link(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The GPU-to-GPU link a cluster config states, as HardwareSpec fields, or nothing.

    LLMServingSim's ``link_bw`` (GB/s) and ``link_latency`` (ns) describe each link of the
    topology its network simulator (ASTRA-Sim's analytical backend) prices a ring collective
    on: every ring step costs the link's latency plus its share of the message at the link's
    bandwidth. So they become our ring's hop latency and bandwidth with a bus efficiency of 1,
    and no per-call latency on top (the link's latency holds every fixed cost of a step in
    that description). That backend turns GB/s into bytes as 2**30 a GB (``bw_GBps_to_Bpns``
    in astra-network-analytical), so ``link_bw`` is read in those units: 16 is 17.18e9
    bytes/s. (ASTRA-Sim's system layer also charges a reduce step three passes of its share
    over a default 768 GB/s local memory and 10 ns an endpoint: a simulator's setting, not the
    link's or the GPU's, so not taken.) They are the config's statement of the link, which
    LLMServingSim's example configs all give as 16 GB/s and 20 us: not a measurement."""
    if "link_bw" not in config and "link_latency" not in config:
        return {}
    try:
        bandwidth = float(config["link_bw"]) * LINK_GB_BYTES
        latency = float(config["link_latency"]) * 1e-9
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path}: link_bw (GB/s) and link_latency (ns) must both be numbers ({error})"
        ) from None
    if not (bandwidth > 0 and latency >= 0):
        raise ValueError(
            f"{path}: link_bw must be > 0 and link_latency >= 0, got "
            f"{config['link_bw']!r} and {config['link_latency']!r}"
        )
    if config.get("num_nodes", 1) != 1:
        return {}  # a multi-node config's link is the network's, not the GPUs' within a node
    fields: dict[str, Any] = {"allreduce_call_latency_s": 0.0}
    for prefix in ("interconnect", "scale_out"):
        fields[f"{prefix}_bandwidth_bytes_per_s"] = bandwidth
        fields[f"{prefix}_latency_s"] = latency
        fields[f"{prefix}_bus_efficiency"] = 1.0
    return fields


def import_llmservingsim(
    run_dir: str | Path, workload: str | Path | None = None, vllm_log: str | Path | None = None
) -> MeasuredRun:
    """An LLMServingSim measured run folder: ``requests.jsonl`` (request_id ``bench-<i>`` =
    workload line i; monotonic ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
    ``last_token_ts``), ``meta.json`` (engine arguments, ``dataset_path`` relative to the
    folder's parent) and optionally ``config.json`` (the GPU).

    Arrivals are the ``queued_ts`` the engine saw, as the run defines TTFT and E2E from them.
    The KV capacity comes from ``vllm_log`` (the server's log) when given, else from a block
    count meta.json states, else it is left for the replay to derive.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory (expected an LLMServingSim run folder)")
    meta = _read_json(root / "meta.json")
    engine = meta.get("engine_kwargs") or {}
    if not isinstance(engine, dict):
        raise ValueError(f"{root / 'meta.json'}: engine_kwargs must be an object")
    if workload is None and meta.get("dataset_path"):
        candidate = root.parent / str(meta["dataset_path"])
        workload = candidate if candidate.exists() else None
    rows = load_workload(workload) if workload is not None else None
    path = root / "requests.jsonl"
    ids, idx = [], []
    columns: dict[str, list[float]] = {k: [] for k in ("arrival", "scheduled", "first", "finish")}
    prompt, output = [], []
    for number, record in _jsonl(path):
        where = f"{path}:{number}"
        request_id = str(record.get("request_id") or "")
        if not request_id:
            raise ValueError(f"{where}: missing field 'request_id'")
        ids.append(request_id)
        prompt.append(_int(record, "input_toks", where, 1))
        output.append(_int(record, "output_toks", where, 0))
        for ours, theirs in (
            ("arrival", "queued_ts"),
            ("scheduled", "scheduled_ts"),
            ("first", "first_token_ts"),
            ("finish", "last_token_ts"),
        ):
            columns[ours].append(_number(record, theirs, where))
        if not columns["arrival"][-1] <= columns["first"][-1] <= columns["finish"][-1]:
            raise ValueError(f"{where}: needs queued_ts <= first_token_ts <= last_token_ts")
        if rows is not None:
            idx.append(_workload_index(request_id, where, rows, prompt[-1]))
    times = {
        "arrival": np.array(columns["arrival"]),
        "scheduled": np.array(columns["scheduled"]),
        "first_token": np.array(columns["first"]),
        "finish": np.array(columns["finish"]),
    }
    frame = _request_rows(ids, times, (np.array(prompt), np.array(output)), None)
    replay = _replay_settings(engine, str(root / "meta.json"))
    hardware = _llmservingsim_hardware(root, replay)
    capacity = _kv_capacity(vllm_log, meta, str(root / "meta.json"), replay)
    name = root.name
    return MeasuredRun(
        name, str(root), "llmservingsim", frame, _trace(name, frame, rows, idx), replay, {},
        hardware, capacity,
    )  # fmt: skip


def _kv_capacity(
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


def _workload_index(request_id: str, where: str, rows: list[WorkloadRow], prompt: int) -> int:
    """Workload line of ``bench-<i>`` (or a bare integer id), checked against the lengths."""
    tail = request_id.rsplit("-", 1)[-1]
    if not tail.isdigit() or int(tail) >= len(rows):
        raise ValueError(
            f"{where}: request_id {request_id!r} names no line of the {len(rows)}-line workload"
        )
    row = rows[int(tail)]
    if row.prompt_tokens != prompt:
        raise ValueError(
            f"{where}: request {request_id!r} has input_toks {prompt} but workload line "
            f"{int(tail) + 1} has {row.prompt_tokens}; wrong --workload?"
        )
    return int(tail)


def _list(payload: dict[str, Any], key: str, path: Path, size: int | None) -> list[Any]:
    value = payload.get(key)
    if not isinstance(value, list):
        raise ValueError(
            f"{path}: field {key!r} must be a list (save the result with --save-detailed)"
        )
    if size is not None and len(value) != size:
        raise ValueError(f"{path}: field {key!r} has {len(value)} items, input_lens {size}")
    return value


def import_vllm_bench(
    path: str | Path, workload: str | Path | None = None, vllm_log: str | Path | None = None
) -> MeasuredRun:
    """A ``vllm bench serve`` / ``benchmark_serving.py`` result JSON with per-request lists
    (``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``; ``start_times`` in
    recent vLLM). Request i is workload line i; without ``start_times`` the workload's
    ``arrival_time_ns`` give the arrivals. Failed requests are kept as status ``failed``."""
    path = Path(path)
    payload = _read_json(path)
    prompt = [int(x) for x in _list(payload, "input_lens", path, None)]
    size = len(prompt)
    if not size:
        raise ValueError(f"{path}: input_lens is empty")
    output = [int(x) for x in _list(payload, "output_lens", path, size)]
    ttfts = _list(payload, "ttfts", path, size)
    itls = _list(payload, "itls", path, size)
    errors = _list(payload, "errors", path, size) if "errors" in payload else [""] * size
    rows = load_workload(workload) if workload is not None else None
    if rows is not None and len(rows) < size:
        raise ValueError(f"{workload}: {len(rows)} lines for {size} benchmark requests")
    if "start_times" in payload:
        starts = np.array(_list(payload, "start_times", path, size), dtype=float)
    elif rows is not None and all(r.arrival_ns is not None for r in rows[:size]):
        starts = np.array([r.arrival_ns for r in rows[:size]], dtype=float) / 1e9
    else:
        raise ValueError(
            f"{path}: no start_times (older vLLM); pass --workload FILE.jsonl with arrival_time_ns"
        )
    ok = np.array([not err for err in errors], dtype=bool)
    first = starts + np.array([float(t or 0.0) for t in ttfts])
    gaps = [np.asarray(g or [], dtype=float) for g in itls]
    finish = first + np.array([g.sum() for g in gaps])
    lo = np.array([g.min() if g.size else np.nan for g in gaps])
    hi = np.array([g.max() if g.size else np.nan for g in gaps])
    ids = [f"bench-{i}" for i in range(size)]
    times = {"arrival": starts, "scheduled": starts, "first_token": first, "finish": finish}
    frame = _request_rows(ids, times, (np.array(prompt), np.array(output)), (lo, hi))
    frame["queueing_ms"] = np.nan  # the client does not see scheduling
    frame.loc[~ok, "status"] = "failed"
    frame.loc[~ok, "reject_reason"] = [
        str(e) for e, good in zip(errors, ok, strict=True) if not good
    ]
    for column in ("first_token_s", "finish_s", "ttft_ms", "tpot_ms", "e2el_ms"):
        frame.loc[~ok, column] = np.nan
    for i in range(size):
        if rows is not None and rows[i].prompt_tokens != prompt[i]:
            raise ValueError(
                f"{path}: request {i} has input_lens {prompt[i]} but workload line {i + 1} has "
                f"{rows[i].prompt_tokens}; wrong --workload?"
            )
    reported = {k: v for k, v in payload.items() if not isinstance(v, list)}
    replay: dict[str, Any] = {"policy": "chunked"}
    model = preset_for_model_id(str(payload.get("model_id") or ""))
    if model:
        replay["model"] = model
    name = path.stem
    trace = _trace(name, frame, rows, list(range(size)))
    capacity = _kv_capacity(vllm_log, payload, str(path), {"block_size": 16})
    return MeasuredRun(
        name, str(path), "vllm-bench", frame, trace, replay, reported, None, capacity
    )


IMPORTERS: dict[str, Callable[[str | Path, str | Path | None, str | Path | None], MeasuredRun]] = {
    "llmservingsim": import_llmservingsim,
    "vllm-bench": import_vllm_bench,
}
