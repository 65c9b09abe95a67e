"""Timing the engine's parts for the simulator's calibrated cost model: one decoder layer's
linear layers and elementwise ops by tokens, paged decode attention by batch x context, prefill
attention by chunk x context, the KV store, block copies, swaps each way, LM head + sampling, the
per-step input preparation, and whole engine steps as check points.

Returns plain tables (``measure``); ``sim.calibrate`` turns them into a profile file, so this
module never imports the simulator. Every point is warmed up, then timed as a median over
repeats: on CUDA with CUDA events; on CPU with the engine's clock (``EngineConfig.clock``):
``time.perf_counter`` (``wall``) or the calling thread's CPU time, ``time.thread_time``
(``cpu``: with one torch thread, the op's own work, not the waits for a core on a loaded
machine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F

import kernels
from engine.attention import build_metadata
from engine.llm_engine import EngineConfig, LLMEngine, StepRecord
from engine.model.llama import apply_rope
from engine.sampling import SampleSpec, SamplingParams, sample
from kernels.torch_attention import (
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    plan_decode,
    plan_prefill,
)


@dataclass(frozen=True, slots=True)
class CalibrationGrid:
    """Sizes to time at. Contexts past the model's length are dropped."""

    num_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    decode_seqs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_context: tuple[int, ...] = (16, 64, 256, 1024, 2048, 4096)
    # Skewed decode batches (num_seqs, short context, long context), half of each: check points
    # that tell whether the kernel's cost follows the batch's mean context or its longest.
    decode_skew: tuple[tuple[int, int, int], ...] = ((4, 64, 1024), (16, 64, 1024), (16, 16, 256))
    prefill_query: tuple[int, ...] = (16, 64, 256, 1024, 2048)
    prefill_context: tuple[int, ...] = (0, 256, 1024, 2048)
    lm_seqs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    num_blocks: tuple[int, ...] = (1, 4, 16, 64)
    repeats: int = 15
    min_repeats: int = 3
    warmup: int = 2
    max_point_s: float = 1.5  # past this, a point stops at min_repeats
    check_requests: int = 12  # requests of the whole-step check run
    # The step grid: whole engine steps (engine.step, every code path of a real step) for
    # num_seqs requests of a prompt of context tokens, each prefilled at the engine's own
    # token budget and then decoded ``step_decodes`` steps. Synthetic prompts, no trace: the
    # cost model's terms are fitted jointly to these steps (docs/profile_format.md).
    step_seqs: tuple[int, ...] = (1, 2, 4, 8, 16)
    step_context: tuple[int, ...] = (64, 256, 1024)
    step_decodes: int = 16

    def __post_init__(self) -> None:
        for name in (
            "num_tokens",
            "decode_seqs",
            "decode_context",
            "prefill_query",
            "prefill_context",
            "lm_seqs",
            "num_blocks",
            "step_seqs",
            "step_context",
        ):
            values = getattr(self, name)
            if not values or any(b <= a for a, b in pairwise(values)):
                raise ValueError(f"CalibrationGrid.{name} must be increasing, got {values!r}")
            if values[0] < (0 if name == "prefill_context" else 1):
                raise ValueError(f"CalibrationGrid.{name} starts too low: {values!r}")
        for skew in self.decode_skew:
            if len(skew) != 3 or skew[0] < 2 or not 1 <= skew[1] < skew[2]:
                raise ValueError(
                    "CalibrationGrid.decode_skew: each entry is (num_seqs >= 2, short, long) "
                    f"with 1 <= short < long, got {skew!r}"
                )
        for name in ("repeats", "min_repeats", "check_requests", "step_decodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"CalibrationGrid.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"CalibrationGrid.warmup must be >= 0, got {self.warmup}")


SMALL_GRID = CalibrationGrid(
    num_tokens=(1, 16, 128),
    decode_seqs=(1, 4),
    decode_context=(16, 128),
    decode_skew=((4, 16, 128),),
    prefill_query=(16, 64),
    prefill_context=(0, 64),
    lm_seqs=(1, 4),
    num_blocks=(1, 4),
    repeats=3,
    min_repeats=1,
    warmup=1,
    check_requests=3,
    step_seqs=(1, 2),
    step_context=(16, 64),
    step_decodes=2,
)
"""A grid small enough for tests (seconds on CPU)."""


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


class _Timer:
    def __init__(self, device: torch.device, grid: CalibrationGrid, clock: str = "wall") -> None:
        self.device, self.grid = device, grid
        self.kind = "cuda_events" if device.type == "cuda" else "wall"
        if device.type != "cuda" and clock == "cpu":
            self.kind = "thread_cpu"

    def median_s(self, fn: Callable[[], Any]) -> float:
        """Median seconds of ``fn`` after warm-up: CUDA events on a GPU, perf_counter on CPU.
        Slow points stop early: after ``min_repeats`` once ``max_point_s`` has been spent."""
        grid = self.grid
        with torch.inference_mode():
            spent = 0.0
            for _ in range(grid.warmup):
                t0 = time.perf_counter()
                fn()
                spent += time.perf_counter() - t0
                if spent > grid.max_point_s:
                    break
            times: list[float] = []
            budget_start = time.perf_counter()
            for _ in range(grid.repeats):
                times.append(self._once(fn))
                done = len(times) >= grid.min_repeats
                if done and time.perf_counter() - budget_start > grid.max_point_s:
                    break
            return statistics.median(times)

    def medians_round_robin(self, fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
        """Median seconds of each of ``fns``, timed in turn, one of each per round, so that
        they all see the same load."""
        grid = self.grid
        times: dict[str, list[float]] = {name: [] for name in fns}
        with torch.inference_mode():
            for _ in range(grid.warmup):
                for fn in fns.values():
                    fn()
            start = time.perf_counter()
            for _ in range(grid.repeats):
                for name, fn in fns.items():
                    times[name].append(self._once(fn))
                done = len(times[next(iter(fns))]) >= grid.min_repeats
                if done and time.perf_counter() - start > len(fns) * grid.max_point_s:
                    break
        return {name: statistics.median(values) for name, values in times.items()}

    def _once(self, fn: Callable[[], Any]) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0
        if self.kind == "thread_cpu":
            c0 = time.thread_time()
            fn()
            return time.thread_time() - c0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


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
    """Time every part of ``config``'s engine over ``grid``."""
    engine = LLMEngine(config)
    device = engine.device
    timer = _Timer(device, grid, config.clock)
    tick = on_point or (lambda _: None)
    max_len = engine.cache_config.max_model_len
    grid_ctx = tuple(c for c in grid.decode_context if c <= max_len) or (min(16, max_len),)
    out = Measurements()
    out.device, out.software = _device_info(device)
    out.timer = timer.kind
    # Which context a decode batch costs as ("mean", "max" or "per_sequence") is chosen by
    # sim.calibrate from the skewed check points timed below; "mean" until then.
    backend = kernels.resolve_backend(device, config.backend)
    out.decode_attention_context = "mean"
    out.engine = {
        "backend": backend,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "cpu_threads": str(config.cpu_threads),
        "num_blocks": str(engine.cache_config.num_blocks),
        "clock": config.clock,
    }
    out.grid = {name: getattr(grid, name) for name in grid.__dataclass_fields__}
    parts = _Parts(engine, backend)
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
    del parts, engine
    out.steps = check_steps(config, grid)
    tick("whole steps")
    out.steps += grid_steps(config, grid, on_point=tick)
    return out


def _decode_check(timer: _Timer, parts: _Parts, b: int, short: int, long: int) -> dict[str, Any]:
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


class _Parts:
    """Closures that run one part of one step on the engine's own model and cache."""

    def __init__(self, engine: LLMEngine, backend: str) -> None:
        self.engine, self.backend = engine, backend
        self.model = engine.model
        self.layer = engine.model.decoder_layers()[0]
        cfg = engine.model.config
        self.cfg = cfg
        self.device, self.dtype = engine.device, engine.dtype
        self.k_cache, self.v_cache = engine.kv_cache.layers[0]
        self.block_size = engine.kv_cache.block_size
        self.num_cache_blocks = engine.kv_cache.num_blocks
        self.max_model_len = engine.cache_config.max_model_len
        element = torch.empty((), dtype=self.dtype).element_size()
        self.kv_bytes_per_token_per_layer = 2 * cfg.num_kv_heads * cfg.head_dim * element
        self.block_bytes = self.block_size * self.kv_bytes_per_token_per_layer * cfg.num_layers
        self.generator = torch.Generator().manual_seed(0)

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator).to(self.device, self.dtype)

    def _blocks(self, num: int) -> torch.Tensor:
        """``num`` distinct, scattered block ids (block 0 is the null block)."""
        if num >= self.num_cache_blocks:
            raise ValueError(
                f"calibration needs {num} KV blocks, the engine has {self.num_cache_blocks}; "
                "lower the grid or raise the cache size"
            )
        perm = torch.randperm(self.num_cache_blocks - 1, generator=self.generator)[:num] + 1
        return perm.to(self.device)

    def linear(self, n: int) -> Callable[[], Any]:
        attn, mlp, cfg = self.layer.self_attn, self.layer.mlp, self.cfg
        x, xq = self._rand(n, cfg.hidden_size), self._rand(n, cfg.q_size)
        xi = self._rand(n, cfg.intermediate_size)
        return lambda: (attn.qkv_proj(x), attn.o_proj(xq), mlp.gate_up_proj(x), mlp.down_proj(xi))

    def elementwise(self, n: int) -> Callable[[], Any]:
        layer, cfg = self.layer, self.cfg
        x = self._rand(n, cfg.hidden_size)
        q = self._rand(n, cfg.num_heads, cfg.head_dim)
        k = self._rand(n, cfg.num_kv_heads, cfg.head_dim)
        gate_up = self._rand(n, 2 * cfg.intermediate_size)
        cos, sin = self._rand(n, cfg.head_dim // 2), self._rand(n, cfg.head_dim // 2)

        def run() -> Any:
            h = layer.input_layernorm(x)
            apply_rope(q, cos, sin)
            apply_rope(k, cos, sin)
            h = x + h
            layer.post_attention_layernorm(h)
            gate, up = gate_up.chunk(2, dim=-1)
            return h + (F.silu(gate) * up)[:, : cfg.hidden_size]

        return run

    def store_kv(self, n: int) -> Callable[[], Any]:
        cfg = self.cfg
        k, v = (self._rand(n, cfg.num_kv_heads, cfg.head_dim) for _ in range(2))
        blocks = self._blocks(-(-n // self.block_size))
        slots = blocks[:, None] * self.block_size + torch.arange(
            self.block_size, device=self.device
        )
        slot_mapping = slots.reshape(-1)[:n].contiguous()
        return lambda: kernels.store_kv(
            k, v, self.k_cache, self.v_cache, slot_mapping, backend=self.backend
        )

    def _tables(self, num_seqs: int, num_tokens: int) -> torch.Tensor:
        width = -(-num_tokens // self.block_size)
        blocks = self._blocks(num_seqs * width)
        return blocks.reshape(num_seqs, width).to(torch.int32)

    def decode_attention(self, b: int, context: int) -> Callable[[], Any]:
        return self.decode_attention_at([context] * b)

    def decode_attention_at(self, contexts: list[int]) -> Callable[[], Any]:
        """One decode batch whose sequences have these contexts (each its own blocks)."""
        cfg, b, longest = self.cfg, len(contexts), max(contexts)
        q = self._rand(b, cfg.num_heads, cfg.head_dim)
        tables = self._tables(b, longest)
        lens = torch.tensor(contexts, dtype=torch.int32, device=self.device)
        scale = cfg.head_dim**-0.5
        if self.backend == "torch":
            # As the engine runs it: the gather plan is built once per step (input preparation),
            # each layer only attends.
            plan = plan_decode(tables, contexts, self.block_size)
            return lambda: paged_decode_attention_torch(q, self.k_cache, self.v_cache, plan, scale)
        return lambda: kernels.paged_decode_attention(
            q, self.k_cache, self.v_cache, tables, lens, scale,
            backend=self.backend, max_seq_len=longest,
        )  # fmt: skip

    def prefill_attention(self, query: int, context: int) -> Callable[[], Any]:
        cfg = self.cfg
        q = self._rand(query, cfg.num_heads, cfg.head_dim)
        tables = self._tables(1, context + query)

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        start_loc, seq_lens, ctx = ints([0, query]), ints([context + query]), ints([context])
        scale = cfg.head_dim**-0.5
        if self.backend == "torch":  # the plan once per step, as in the engine
            chunks = plan_prefill(tables, [0, query], [context + query], [context], self.block_size)
            return lambda: paged_prefill_attention_torch(
                q, self.k_cache, self.v_cache, chunks, scale
            )
        return lambda: kernels.paged_prefill_attention(
            q, self.k_cache, self.v_cache, tables, start_loc, seq_lens, ctx, scale,
            backend=self.backend, max_query_len=query,
        )  # fmt: skip

    def lm_head(self, num_seqs: int) -> Callable[[], Any]:
        model = self.model
        x = self._rand(num_seqs, self.cfg.hidden_size)
        greedy = SamplingParams(max_tokens=1)
        specs = [SampleSpec(i, greedy, 0, 0, 0) for i in range(num_seqs)]

        def run() -> Any:
            logits = F.linear(model.norm(x), model.lm_head).float()
            return sample(logits, specs)

        return run

    def copy_blocks(self, n: int) -> Callable[[], Any]:
        ids = self._blocks(2 * n).tolist()
        pairs = list(zip(ids[:n], ids[n:], strict=True))
        return lambda: self.engine.kv_cache.apply([], [], pairs)

    def _swap(self, n: int, to_host: bool) -> Callable[[], Any]:
        cache = self.engine.kv_cache
        host = cache.cpu_layers[0][0].shape[0]
        if host < n:
            raise ValueError(
                f"calibration swaps {n} blocks, the engine's host cache holds {host}; "
                "raise swap_space_gib or lower the grid"
            )
        device_ids = self._blocks(n).tolist()
        pairs = (
            [(d, h) for h, d in enumerate(device_ids)]
            if to_host
            else [(h, d) for h, d in enumerate(device_ids)]
        )
        return lambda: cache.apply(pairs, [], []) if to_host else cache.apply([], pairs, [])

    def swap_out(self, n: int) -> Callable[[], Any]:
        return self._swap(n, to_host=True)

    def swap_in(self, n: int) -> Callable[[], Any]:
        return self._swap(n, to_host=False)

    def prepare(self, num_seqs: int) -> Callable[[], Any]:
        """The host work of building one decode step's inputs (lists, metadata, tensors)."""
        context = 256
        width = -(-context // self.block_size)
        tables = [list(range(1 + i * width, 1 + (i + 1) * width)) for i in range(num_seqs)]
        device = self.device

        def run() -> Any:
            token_ids, positions, lens, rows = [], [], [], []
            for table in tables:
                token_ids.append(1)
                positions.append(context - 1)
                lens.append(context)
                rows.append(list(table))
            meta = build_metadata(lens, rows, [], [], self.block_size, device, self.backend)
            ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
            pos = torch.tensor(positions, dtype=torch.int64, device=device)
            last = torch.tensor(list(range(num_seqs)), dtype=torch.int64, device=device)
            return meta, ids, pos, last

        return run


def check_steps(config: EngineConfig, grid: CalibrationGrid) -> list[dict[str, Any]]:
    """Whole steps of a real, warmed-up engine (schedule, prepare, execute, update) on a small
    synthetic workload of mixed prompt lengths under chunked prefill: each step's shape and busy
    time on the engine's clock (``config.clock``)."""
    from dataclasses import replace

    budget = min(config.max_num_batched_tokens, 512)
    engine = LLMEngine(
        replace(
            config,
            policy="chunked",
            max_num_batched_tokens=budget,
            preemption_mode="recompute",
            swap_space_gib=0.0,
        )
    )
    engine.warm_up()
    max_len = engine.cache_config.max_model_len
    rng = torch.Generator().manual_seed(1)
    vocab = engine.model.config.vocab_size
    for i in range(grid.check_requests):
        prompt = min(max_len // 2, 32 * (1 + (i * 7) % 24))
        outputs = min(max_len - prompt, 24 + 8 * (i % 5))
        ids = torch.randint(0, vocab, (prompt,), generator=rng).tolist()
        params = SamplingParams(max_tokens=outputs, ignore_eos=True)
        engine.add_request(f"c{i}", ids, params, arrival_s=0.0, now_s=0.0)
    engine.scheduler.mark_arrivals_done()
    return [_step_entry(record) for record in _run_to_end(engine)]


def grid_steps(
    config: EngineConfig,
    grid: CalibrationGrid,
    on_point: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Whole steps of a real, warmed-up engine over the step grid: for each (num_seqs,
    context) of ``grid.step_seqs`` x ``grid.step_context``, that many requests of a
    ``context``-token synthetic prompt, prefilled under chunked prefill at the engine's own
    token budget, then decoded ``grid.step_decodes`` steps. Each step's shape and busy time on
    the engine's clock, as ``check_steps``. These are the steps the calibrated model fits its
    terms to (``sim.calibrated``), so they cover decode batches and prefill chunks alike."""
    from dataclasses import replace

    tick = on_point or (lambda _: None)
    engine = LLMEngine(
        replace(config, policy="chunked", preemption_mode="recompute", swap_space_gib=0.0)
    )
    engine.warm_up()
    max_len = engine.cache_config.max_model_len
    rng = torch.Generator().manual_seed(2)
    vocab = engine.model.config.vocab_size
    steps: list[dict[str, Any]] = []
    for num_seqs in grid.step_seqs:
        for context in grid.step_context:
            prompt = min(context, max_len - grid.step_decodes - 1)
            for i in range(num_seqs):
                ids = torch.randint(0, vocab, (prompt,), generator=rng).tolist()
                params = SamplingParams(max_tokens=grid.step_decodes + 1, ignore_eos=True)
                engine.add_request(f"g{num_seqs}x{context}.{i}", ids, params, 0.0, now_s=0.0)
            steps += [_step_entry(record) for record in _run_to_end(engine)]
            tick(f"whole steps {num_seqs}x{context}")
    return steps


def _run_to_end(engine: LLMEngine) -> list[StepRecord]:
    """Step ``engine`` until every request has finished; the records of its executed steps."""
    records: list[StepRecord] = []
    while engine.has_unfinished():
        output = engine.step()
        if output.record is not None:
            records.append(output.record)
    return records


def _step_entry(record: StepRecord) -> dict[str, Any]:
    """One executed step as the profile's ``steps`` entry (docs/profile_format.md)."""
    chunks, contexts = [], []
    for scheduled in record.batch.requests:
        width = len(scheduled.seq_ids)
        if scheduled.is_prefill:
            chunks += [[scheduled.num_positions, scheduled.num_computed_tokens]] * width
        else:
            contexts += [scheduled.num_computed_tokens + 1] * width
    return {
        "prefill_chunks": chunks,
        "num_decode_seqs": len(contexts),
        "sum_decode_context_tokens": sum(contexts),
        "decode_context_tokens": contexts,
        "measured_s": record.busy_s,
    }
