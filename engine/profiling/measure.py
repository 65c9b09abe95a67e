"""``measure``: every table and check point of one engine over a grid, as ``Measurements``
(plain tables, with the device, software and engine they were timed on)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.llm_engine import EngineConfig, LLMEngine
from engine.profiling.grid import CalibrationGrid
from engine.profiling.parts import StepParts
from engine.profiling.steps import check_steps, grid_steps
from engine.profiling.timer import Timer
from kernels.contracts import resolve_backend


@dataclass
class Measurements:
    """What ``measure`` found: 1-D tables as (xs, times), 2-D as (xs, ys, rows), whole steps."""

    tables_1d: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    tables_2d: dict[str, tuple[list[float], list[float], list[list[float]]]] = field(
        default_factory=dict
    )
    steps: list[dict[str, Any]] = field(default_factory=list)
    # Skewed decode batches, one per grid.decode_skew (see _decode_check).
    decode_checks: list[dict[str, Any]] = field(default_factory=list)
    device: dict[str, str] = field(default_factory=dict)
    software: dict[str, str] = field(default_factory=dict)
    decode_attention_context: str = "mean"
    engine: dict[str, str] = field(default_factory=dict)
    grid: dict[str, Any] = field(default_factory=dict)
    timer: str = "wall"  # "cuda_events", "wall" or "thread_cpu"


def _device_info(device: torch.device) -> tuple[dict[str, str], dict[str, str]]:
    import platform
    from importlib import metadata

    try:
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = "none"
    software = {
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": str(torch.version.cuda or "none"),
        "python": platform.python_version(),
        "torch_threads": str(torch.get_num_threads()),
    }
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        driver = str(getattr(torch.cuda, "driver_version", lambda: "unknown")())
        return {"name": name, "driver": driver}, software
    cpu = platform.processor() or platform.machine()
    return {"name": f"cpu ({cpu})", "driver": "none"}, software


def point_count(grid: CalibrationGrid) -> int:
    """Timed points, for the progress bar."""
    return (
        3 * len(grid.num_tokens)
        + len(grid.decode_seqs) * len(grid.decode_context)
        + len(grid.decode_skew)
        + len(grid.prefill_query) * len(grid.prefill_context)
        + len(grid.lm_seqs)
        + 3 * len(grid.num_blocks)
        + len(grid.decode_seqs)
        + 1
        + len(grid.step_seqs) * len(grid.step_context)
    )


def measure(
    config: EngineConfig,
    grid: CalibrationGrid,
    on_point: Callable[[str], None] | None = None,
) -> Measurements:
    """Time every part of ``config``'s engine over ``grid``, all on one engine."""
    engine = LLMEngine(config)
    device = engine.device
    timer = Timer(device, grid, config.clock)
    tick = on_point or (lambda _: None)
    max_len = engine.cache_config.max_model_len
    grid_ctx = tuple(c for c in grid.decode_context if c <= max_len) or (min(16, max_len),)
    out = Measurements()
    out.device, out.software = _device_info(device)
    out.timer = timer.kind
    # Which context a decode batch costs as ("mean", "max" or "per_sequence") is chosen by
    # fidelity.calibrate from the skewed check points timed below; "mean" until then.
    backend = resolve_backend(device, config.backend)
    out.decode_attention_context = "mean"
    out.engine = {
        "backend": backend,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "cpu_threads": str(config.cpu_threads),
        "num_blocks": str(engine.cache_config.num_blocks),
        "clock": config.clock,
    }
    out.grid = {name: getattr(grid, name) for name in grid.__dataclass_fields__}
    parts = StepParts(engine, backend)
    for name, fn in (("linear", parts.linear), ("elementwise", parts.elementwise)):
        times = []
        for n in grid.num_tokens:
            times.append(timer.median_s(fn(n)))
            tick(f"{name} {n}")
        out.tables_1d[name] = ([float(n) for n in grid.num_tokens], times)
    kv_bytes = parts.kv_bytes_per_token_per_layer
    times = []
    for n in grid.num_tokens:
        times.append(timer.median_s(parts.store_kv(n)))
        tick(f"store_kv {n}")
    out.tables_1d["store_kv"] = ([float(n * kv_bytes) for n in grid.num_tokens], times)
    rows = []
    for b in grid.decode_seqs:
        rows.append([timer.median_s(parts.decode_attention(b, c)) for c in grid_ctx])
        for c in grid_ctx:
            tick(f"decode_attention {b}x{c}")
    out.tables_2d["decode_attention"] = (
        [float(b) for b in grid.decode_seqs],
        [float(c) for c in grid_ctx],
        rows,
    )
    for b, short, long in grid.decode_skew:
        out.decode_checks.append(_decode_check(timer, parts, b, min(short, max_len), long))
        tick(f"decode_attention skewed {b}x{short}/{long}")
    queries = [q for q in grid.prefill_query if q <= max_len] or [grid.prefill_query[0]]
    contexts = [c for c in grid.prefill_context if c + queries[0] <= max_len]
    rows = []
    for q in queries:
        row = []
        for c in contexts:
            # A chunk past the model's length is timed at the longest that fits, scaled.
            fit = min(q, max_len - c)
            row.append(timer.median_s(parts.prefill_attention(fit, c)) * q / fit)
            tick(f"prefill_attention {q}x{c}")
        rows.append(row)
    out.tables_2d["prefill_attention"] = (
        [float(q) for q in queries],
        [float(c) for c in contexts],
        rows,
    )
    times = []
    for s in grid.lm_seqs:
        times.append(timer.median_s(parts.lm_head(s)))
        tick(f"lm_head {s}")
    out.tables_1d["lm_head"] = ([float(s) for s in grid.lm_seqs], times)
    block_bytes = parts.block_bytes
    for name, make in (
        ("copy_blocks", parts.copy_blocks),
        ("swap_out", parts.swap_out),
        ("swap_in", parts.swap_in),
    ):
        times = []
        for n in grid.num_blocks:
            times.append(timer.median_s(make(n)))
            tick(f"{name} {n}")
        out.tables_1d[name] = ([float(n * block_bytes) for n in grid.num_blocks], times)
    times = []
    for s in grid.decode_seqs:
        times.append(timer.median_s(parts.prepare(s)))
        tick(f"prepare {s}")
    out.tables_1d["prepare"] = ([float(s) for s in grid.decode_seqs], times)
    # The whole steps run on this same engine (each under a scheduler of their own): one
    # model and one KV cache for the whole calibration.
    out.steps = check_steps(engine, grid)
    tick("whole steps")
    out.steps += grid_steps(engine, grid, on_point=tick)
    return out


def _decode_check(timer: Timer, parts: StepParts, b: int, short: int, long: int) -> dict[str, Any]:
    """A skewed decode batch (half ``short``, half ``long`` contexts) timed round-robin beside
    uniform batches of its size at the short, the long and the mean context, so that load
    drifting between table and check cannot decide which context rule fits."""
    long = max(short + 1, min(long, parts.max_model_len))
    contexts = [short] * (b // 2) + [long] * (b - b // 2)
    mean = round(sum(contexts) / b)
    cases = {
        "skewed": contexts,
        "short": [short] * b,
        "long": [long] * b,
        "mean": [mean] * b,
    }
    times = timer.medians_round_robin({k: parts.decode_attention_at(v) for k, v in cases.items()})
    return {
        "context_tokens": contexts,
        "time_s": times["skewed"],
        "uniform_time_s": {k: times[k] for k in ("short", "long", "mean")},
        "uniform_context_tokens": {"short": short, "long": long, "mean": mean},
    }
