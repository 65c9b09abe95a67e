"""``measure``: every table and check point of one engine over a grid, as ``Measurements``
(plain tables, with the device, software and engine they were timed on)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.llm_engine import EngineConfig, LLMEngine
from engine.profiling.grid import CalibrationGrid, for_backend
from engine.profiling.parts import StepParts
from engine.profiling.steps import check_steps, grid_steps
from engine.profiling.timer import PointTime, Timer
from kernels.contracts import resolve_backend
from kernels.torch_attention import ROW_PATH_MAX_SEQS


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
    # Each table point's spread (half its interquartile range over the rounds), like tables.
    spreads: dict[str, Any] = field(default_factory=dict)
    # What a GPU's tables time: the kernels alone ("device"); a CPU's, the whole call ("span").
    tables_time: str = "span"


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
    """Progress ticks: the table rounds, then the whole-step rounds."""
    return grid.repeats + grid.step_repeats


def _table_points(
    parts: StepParts, grid: CalibrationGrid, max_len: int, graphs: bool = False
) -> tuple[dict[Hashable, Callable[[], Any]], dict[str, Any]]:
    """Every table point of ``grid`` as a closure, keyed by (op, sizes...), and the axes each
    table is laid out on. ``graphs``: the engine replays decode graphs, whose decode attention
    is timed on their own plan too (``decode_attention_graph``, the batches a graph holds)."""
    grid_ctx = tuple(c for c in grid.decode_context if c <= max_len) or (min(16, max_len),)
    queries = [q for q in grid.prefill_query if q <= max_len] or [grid.prefill_query[0]]
    contexts = [c for c in grid.prefill_context if c + queries[0] <= max_len]
    points: dict[Hashable, Callable[[], Any]] = {}
    for n in grid.num_tokens:
        points["linear", n] = parts.linear(n)
        points["elementwise", n] = parts.elementwise(n)
        points["store_kv", n] = parts.store_kv(n)
    graph_seqs = []
    for b in grid.decode_seqs:
        for c in grid_ctx:
            points["decode_attention", b, c] = parts.decode_attention(b, c)
        points["prepare", b] = parts.prepare(b)
        if graphs:  # (a batch past the largest graph runs eagerly: no point)
            on_graph = [(c, parts.decode_attention_graph(b, c)) for c in grid_ctx]
            runs: dict[Hashable, Callable[[], Any]] = {
                ("decode_attention_graph", b, c): f for c, f in on_graph if f is not None
            }
            if len(runs) == len(grid_ctx):
                graph_seqs.append(b)
                points.update(runs)
    for i, (b, short, long) in enumerate(grid.decode_skew):
        for case, contexts_of in _skew_cases(b, min(short, max_len), long, max_len).items():
            points["skew", i, case] = parts.decode_attention_at(contexts_of)
    for q in queries:
        for c in contexts:
            # A chunk past the model's length is timed at the longest that fits, scaled.
            points["prefill_attention", q, c] = parts.prefill_attention(min(q, max_len - c), c)
    for s in grid.lm_seqs:
        points["lm_head", s] = parts.lm_head(s)
    for n in grid.num_blocks:
        points["copy_blocks", n] = parts.copy_blocks(n)
        points["swap_out", n] = parts.swap_out(n)
        points["swap_in", n] = parts.swap_in(n)
    layout = {
        "decode_context": grid_ctx,
        "queries": queries,
        "contexts": contexts,
        "graph_seqs": graph_seqs,
    }
    return points, layout


def measure(
    config: EngineConfig,
    grid: CalibrationGrid,
    on_point: Callable[[str], None] | None = None,
) -> Measurements:
    """Time every part of ``config``'s engine over ``grid``, all on one engine: the table
    points round-robin (``Timer.rounds``), then the whole steps (``steps``), each with its
    spread."""
    engine = LLMEngine(config)
    device = engine.device
    timer = Timer(device, grid, config.clock)
    tick = on_point or (lambda _: None)
    max_len = engine.cache_config.resolved_max_model_len
    out = Measurements()
    out.device, out.software = _device_info(device)
    out.timer = timer.kind
    out.tables_time = "device" if device.type == "cuda" else "span"
    # Which context a decode batch costs as ("mean", "max" or "per_sequence") is chosen by
    # fidelity.calibrate from the skewed check points timed below; "mean" until then.
    backend = resolve_backend(device, config.backend)
    grid = for_backend(grid, backend, ROW_PATH_MAX_SEQS)
    out.engine = {
        "backend": backend,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "cpu_threads": str(config.cpu_threads),
        "num_blocks": str(engine.cache_config.num_blocks),
        "clock": config.clock,
        # The whole steps' input preparation is on the same clock (fidelity.host_speed).
        "prepare_clock": config.clock,
        "kind": engine_kind(engine),
        "decode_split": engine.config.decode_split,
    }
    out.grid = {name: getattr(grid, name) for name in grid.__dataclass_fields__}
    parts = StepParts(engine, backend)
    graphs = out.engine["kind"] != "servesim-eager"
    points, layout = _table_points(parts, grid, max_len, graphs)
    timed = timer.rounds(points, on_round=lambda done: tick(f"table round {done}"))
    del points
    if timer.calls:  # on CUDA: how often a call's launches outran the GPU's hold
        out.engine.update(
            timer_calls=str(timer.calls),
            timer_retimed=str(timer.retimed),
            timer_late=str(timer.late),
        )
    _fill_tables(out, timed, grid, layout, parts)
    # The whole steps run on this same engine (each under a scheduler of their own): one
    # model and one KV cache for the whole calibration.
    out.steps = check_steps(engine, grid) + grid_steps(engine, grid, on_point=tick)
    return out


def engine_kind(engine: LLMEngine) -> str:
    """``servesim-graphs`` when the engine replays decode steps on CUDA graphs
    (``servesim-piecewise`` when its other steps replay piecewise graphs too), else
    ``servesim-eager``."""
    if not getattr(engine, "graph_stats", None):
        return "servesim-eager"
    pieces = getattr(getattr(engine, "runner", None), "mixed_graphs", None)
    return "servesim-graphs" if pieces is None else "servesim-piecewise"


def _fill_tables(
    out: Measurements,
    timed: dict[Hashable, PointTime],
    grid: CalibrationGrid,
    layout: dict[str, Any],
    parts: StepParts,
) -> None:
    """The tables (median per point) and their spreads from the timed points."""

    def put(name: str, xs: list[float], keys: list[Hashable]) -> None:
        out.tables_1d[name] = (xs, [timed[k].median_s for k in keys])
        out.spreads[name] = [timed[k].spread_s for k in keys]

    tokens = [float(n) for n in grid.num_tokens]
    put("linear", tokens, [("linear", n) for n in grid.num_tokens])
    put("elementwise", tokens, [("elementwise", n) for n in grid.num_tokens])
    kv_bytes = parts.kv_bytes_per_token_per_layer
    put("store_kv", [t * kv_bytes for t in tokens], [("store_kv", n) for n in grid.num_tokens])
    put("lm_head", [float(s) for s in grid.lm_seqs], [("lm_head", s) for s in grid.lm_seqs])
    blocks = [float(n * parts.block_bytes) for n in grid.num_blocks]
    for name in ("copy_blocks", "swap_out", "swap_in"):
        put(name, blocks, [(name, n) for n in grid.num_blocks])
    put("prepare", [float(b) for b in grid.decode_seqs], [("prepare", b) for b in grid.decode_seqs])
    ctx = layout["decode_context"]
    keys = [[("decode_attention", b, c) for c in ctx] for b in grid.decode_seqs]
    out.tables_2d["decode_attention"] = (
        [float(b) for b in grid.decode_seqs],
        [float(c) for c in ctx],
        [[timed[k].median_s for k in row] for row in keys],
    )
    out.spreads["decode_attention"] = [[timed[k].spread_s for k in row] for row in keys]
    if graph_seqs := layout.get("graph_seqs"):
        keys = [[("decode_attention_graph", b, c) for c in ctx] for b in graph_seqs]
        out.tables_2d["decode_attention_graph"] = (
            [float(b) for b in graph_seqs],
            [float(c) for c in ctx],
            [[timed[k].median_s for k in row] for row in keys],
        )
        out.spreads["decode_attention_graph"] = [[timed[k].spread_s for k in row] for row in keys]
    max_len = parts.max_model_len
    rows, spreads = [], []
    for q in layout["queries"]:
        scale = [q / min(q, max_len - c) for c in layout["contexts"]]
        row_keys = [("prefill_attention", q, c) for c in layout["contexts"]]
        rows.append([timed[k].median_s * f for k, f in zip(row_keys, scale, strict=True)])
        spreads.append([timed[k].spread_s * f for k, f in zip(row_keys, scale, strict=True)])
    out.tables_2d["prefill_attention"] = (
        [float(q) for q in layout["queries"]],
        [float(c) for c in layout["contexts"]],
        rows,
    )
    out.spreads["prefill_attention"] = spreads
    for i, (b, short, long) in enumerate(grid.decode_skew):
        cases = _skew_cases(b, min(short, max_len), long, max_len)
        times = {case: timed["skew", i, case].median_s for case in cases}
        out.decode_checks.append(
            {
                "context_tokens": cases["skewed"],
                "time_s": times["skewed"],
                "uniform_time_s": {k: times[k] for k in ("short", "long", "mean")},
                "uniform_context_tokens": {k: cases[k][0] for k in ("short", "long", "mean")},
            }
        )


def _skew_cases(b: int, short: int, long: int, max_len: int) -> dict[str, list[int]]:
    """A skewed decode batch (half ``short``, half ``long`` contexts) and uniform batches of
    its size at the short, the long and the mean context, timed in the same rounds, so that
    load drifting between table and check cannot decide which context rule fits."""
    long = max(short + 1, min(long, max_len))
    contexts = [short] * (b // 2) + [long] * (b - b // 2)
    mean = round(sum(contexts) / b)
    return {"skewed": contexts, "short": [short] * b, "long": [long] * b, "mean": [mean] * b}
