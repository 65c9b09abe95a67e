"""The importer of LLMServingSim's measured vLLM runs (``import_llmservingsim``): a run folder's
``requests.jsonl``, ``meta.json`` and ``config.json``, with the workload JSONL the run served,
read into a ``MeasuredRun``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.model.presets import preset_for_model_id
from fidelity.measured import MeasuredRun
from fidelity.measured_rows import (
    WorkloadRow,
    int_field,
    jsonl_records,
    load_workload,
    number_field,
    read_json_object,
    recorded_kv_capacity,
    replay_trace,
    request_rows,
)
from sim.specs.hardware import HARDWARE_PRESETS

LINK_GB_BYTES = 1 << 30
"""Bytes in a GB of a cluster config's ``link_bw``, as ASTRA-Sim's analytical network backend
(LLMServingSim's) converts it (astra-network-analytical ``bw_GBps_to_Bpns``)."""

_NO_CONTENTS = (
    "without it the replay trace has no prompt token ids, so prefix caching (on in the run) "
    "has no prompt contents to hit on"
)


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


def _llmservingsim_hardware(run_dir: Path, replay: dict[str, Any]) -> dict[str, Any] | None:
    """A hardware table from the run's cluster config.json: the preset its GPU name matches,
    with the config's memory size and bandwidth."""
    path = run_dir / "config.json"
    if not path.exists():
        return None
    config = read_json_object(path)
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
    run_dir: str | Path,
    workload: str | Path | None = None,
    vllm_log: str | Path | None = None,
    *,
    without_workload: bool = False,
) -> MeasuredRun:
    """An LLMServingSim measured run folder: ``requests.jsonl`` (request_id ``bench-<i>`` =
    workload line i; monotonic ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
    ``last_token_ts``), ``meta.json`` (engine arguments, ``dataset_path``) and optionally
    ``config.json`` (the GPU).

    The workload is ``workload`` when given, else the one meta.json names (`find_workload`);
    each request's lengths must be its workload line's, as LLMServingSim's runner pins them.
    ``without_workload`` imports the lengths and arrivals alone, with no prompt token ids.
    Arrivals are the ``queued_ts`` the engine saw, as the run defines TTFT and E2E from them.
    The KV capacity comes from ``vllm_log`` (the server's log) when given, else from a block
    count meta.json states, else it is left for the replay to derive. What the import cannot
    read but can do without is said in the run's ``warnings``.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory (expected an LLMServingSim run folder)")
    meta = read_json_object(root / "meta.json")
    engine = meta.get("engine_kwargs") or {}
    if not isinstance(engine, dict):
        raise ValueError(f"{root / 'meta.json'}: engine_kwargs must be an object")
    found, warnings = find_workload(root, meta, workload, without_workload)
    rows = load_workload(found) if found is not None else None
    frame, idx = _read_requests(root / "requests.jsonl", rows)
    replay = _replay_settings(engine, str(root / "meta.json"))
    hardware = _llmservingsim_hardware(root, replay)
    capacity = recorded_kv_capacity(vllm_log, meta, str(root / "meta.json"), replay)
    name = root.name
    trace = replay_trace(name, frame, rows, idx)
    return MeasuredRun(
        name, str(root), "llmservingsim", frame, trace, replay, {}, hardware, capacity,
        str(found) if found is not None else None, tuple(warnings),
    )  # fmt: skip


def find_workload(
    root: Path, meta: dict[str, Any], given: str | Path | None, without_workload: bool
) -> tuple[Path | None, list[str]]:
    """The workload file to read and the warnings about it: ``given``, else meta.json's
    ``dataset_path`` (the path the runner was given, relative to where it ran): looked for from
    the folder's parent upwards, as the run folders sit beside ``workloads/`` in
    ``../shared`` and three levels under it in LLMServingSim's repository. A named workload not
    found is an error; none named is a warning. A file whose SHA-256 is not the
    ``dataset_hash`` meta.json records is read, with a warning."""
    meta_path = root / "meta.json"
    if given is not None:
        return Path(given), _hash_warnings(Path(given), meta, meta_path)
    if without_workload:
        return None, []
    named = meta.get("dataset_path")
    if not named:
        return None, [
            f"{meta_path} names no workload (dataset_path): {_NO_CONTENTS}; give the run's "
            "workload JSONL with --workload FILE"
        ]
    if not isinstance(named, str):
        raise ValueError(f"{meta_path}: field 'dataset_path' must be a path, got {named!r}")
    relative = Path(named)
    folders = root.resolve().parents
    places = [relative] if relative.is_absolute() else [folder / relative for folder in folders]
    found = next((place for place in places if place.is_file()), None)
    if found is None:
        looked = str(places[0]) + ("" if relative.is_absolute() else " or in a folder above")
        raise ValueError(
            f"{meta_path}: the run's workload (dataset_path {named!r}) is not at {looked}; "
            f"{_NO_CONTENTS}. Give it with --workload FILE, or import the lengths and arrivals "
            "alone with --no-workload"
        )
    return found, _hash_warnings(found, meta, meta_path)


def _hash_warnings(path: Path, meta: dict[str, Any], meta_path: Path) -> list[str]:
    """A warning when ``path`` is not the file whose SHA-256 meta.json records."""
    stated = meta.get("dataset_hash")
    if not isinstance(stated, str) or not stated:
        return []
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return []  # load_workload says why the file cannot be read
    if digest == stated.lower():
        return []
    return [
        f"{path}: SHA-256 {digest[:16]}..., but {meta_path} records dataset_hash "
        f"{stated[:16]}... for the run's workload: its lengths are checked line by line, its "
        "prompt token ids cannot be"
    ]


def _read_requests(path: Path, rows: list[WorkloadRow] | None) -> tuple[pd.DataFrame, list[int]]:
    """The request frame of ``requests.jsonl`` and each request's workload line (index)."""
    ids: list[str] = []
    idx: list[int] = []
    seen: dict[str, int] = {}
    columns: dict[str, list[float]] = {k: [] for k in ("arrival", "scheduled", "first", "finish")}
    prompt, output = [], []
    for number, record in jsonl_records(path):
        where = f"{path}:{number}"
        request_id = str(record.get("request_id") or "")
        if not request_id:
            raise ValueError(f"{where}: missing field 'request_id'")
        if request_id in seen:
            raise ValueError(
                f"{where}: request_id {request_id!r} repeats line {seen[request_id]}; each "
                "request of a run is recorded once"
            )
        seen[request_id] = number
        ids.append(request_id)
        prompt.append(int_field(record, "input_toks", where, 1))
        output.append(int_field(record, "output_toks", where, 0))
        for ours, theirs in (
            ("arrival", "queued_ts"),
            ("scheduled", "scheduled_ts"),
            ("first", "first_token_ts"),
            ("finish", "last_token_ts"),
        ):
            columns[ours].append(number_field(record, theirs, where))
        if not columns["arrival"][-1] <= columns["first"][-1] <= columns["finish"][-1]:
            raise ValueError(f"{where}: needs queued_ts <= first_token_ts <= last_token_ts")
        if rows is not None:
            idx.append(_workload_index(request_id, where, rows, (prompt[-1], output[-1])))
    times = {
        "arrival": np.array(columns["arrival"]),
        "scheduled": np.array(columns["scheduled"]),
        "first_token": np.array(columns["first"]),
        "finish": np.array(columns["finish"]),
    }
    return request_rows(ids, times, (np.array(prompt), np.array(output)), None), idx


def _workload_index(
    request_id: str, where: str, rows: list[WorkloadRow], lengths: tuple[int, int]
) -> int:
    """Workload line of ``bench-<i>`` (or a bare integer id), checked against the lengths:
    LLMServingSim's runner sends each line's ``input_tok_ids`` and pins its output to the
    line's ``output_toks`` (``min_tokens = max_tokens``, ``ignore_eos``), so both are equal."""
    tail = request_id.rsplit("-", 1)[-1]
    if not tail.isdigit() or int(tail) >= len(rows):
        raise ValueError(
            f"{where}: request_id {request_id!r} names no line of the {len(rows)}-line workload"
        )
    row = rows[int(tail)]
    for field, measured, asked in (
        ("input_toks", lengths[0], row.prompt_tokens),
        ("output_toks", lengths[1], row.output_tokens),
    ):
        if measured != asked:
            raise ValueError(
                f"{where}: request {request_id!r} has {field} {measured} but workload line "
                f"{int(tail) + 1} has {asked} (LLMServingSim's runner sends that line's "
                "prompt and pins the output to its length); wrong --workload?"
            )
    return int(tail)
