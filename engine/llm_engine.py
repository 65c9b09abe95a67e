"""The engine: the shared core's ``Scheduler`` driving a ``ModelRunner`` on a real clock.

The step loop is the simulator's, with the model in place of the cost model::

    batch = scheduler.schedule(now_s)
    result = runner.execute(batch)
    finished = scheduler.update(batch, result, now_s + result.duration_s)

Every step runs (no fast-forward: that is the simulator's privilege).
"""

from __future__ import annotations

import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from core.batch import ScheduledBatch, StepResult
from core.config import GIB, CacheConfig, SchedulerConfig, check_serving
from core.decode_split import DEFAULT_SPLIT, check_split_mode
from core.model.spec import ModelSpec
from core.parallel_sampling import child_id
from core.policies import check_budgets, check_policy
from core.request import Request
from core.scheduler import Scheduler
from engine.cuda_graphs import GraphStats
from engine.cuda_setup import capture_graphs, gpu_blocks, graph_memory, uses_graphs
from engine.input_batch import BlockTables
from engine.kv_cache import KVCache
from engine.memory import check_memory
from engine.mixed_graphs import check_mixed_graphs
from engine.model.weights import load_model
from engine.model_runner import ModelRunner, StepTiming
from engine.sampling import SamplingParams
from engine.warm_up import shape_requests, short_request
from kernels.contracts import resolve_backend

CLOCKS = ("wall", "cpu")
"""How a step's duration is measured: ``wall`` (the clock on the wall: what a user waits) or
``cpu`` (the engine thread's CPU time: the step's own work, not the wait for a core on a
loaded machine; CPU device with one torch thread only)."""
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything that builds an engine: the core's KV cache and scheduler settings (``cache``,
    ``scheduler``) and the engine's own fields. ``cache.num_blocks`` None sizes the cache from
    memory: on CUDA as vLLM does (a profiling pass of the largest step, then
    ``gpu_memory_utilization`` of total memory less its peak and less the CUDA graphs), on CPU
    from ``cpu_kv_cache_gib``. The engine runs paged memory only. On CUDA with the Triton
    kernels, decode-only steps run on CUDA graphs captured at start-up unless ``enforce_eager``
    (as vLLM's flag)."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    model: str = "tiny-llama"
    device: str = "cpu"
    dtype: str | None = None
    weights: str = "auto"
    cpu_kv_cache_gib: float = 1.0
    seed: int = 0
    backend: str = "auto"
    # torch's intra-op threads on CPU. A small model's ops take microseconds, where thread
    # hand-offs cost more than they save (and a loaded machine makes them far worse); 0 keeps
    # torch's own default.
    cpu_threads: int = 1
    clock: str = "wall"
    enforce_eager: bool = False
    # How the decode kernel shares each sequence's context among its splits
    # (``core.decode_split.SPLIT_MODES``); "fixed" is the plan before 2026-11-27 (39ba127), for A/B.
    decode_split: str = DEFAULT_SPLIT
    # The other steps on piecewise CUDA graphs (``engine.mixed_graphs``): "off" (eager, the
    # default until a GPU has measured it) or "piecewise" (needs the decode graphs' conditions).
    mixed_graphs: str = "off"

    def __post_init__(self) -> None:
        check_policy(self.scheduler.policy)
        check_serving(self.cache, self.scheduler)
        check_budgets(self.scheduler)
        if self.cache.memory_model not in (None, "paged"):
            raise ValueError(
                f"memory_model must be 'paged' on the engine, got {self.cache.memory_model!r}"
            )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.weights not in ("auto", "random"):
            raise ValueError(f"weights must be 'auto' or 'random', got {self.weights!r}")
        if self.cpu_threads < 0:
            raise ValueError(f"cpu_threads must be >= 0, got {self.cpu_threads!r}")
        check_split_mode(self.decode_split)
        check_mixed_graphs(self.mixed_graphs)
        if self.mixed_graphs != "off" and (self.enforce_eager or self.device == "cpu"):
            raise ValueError(
                f"mixed_graphs {self.mixed_graphs!r} needs CUDA graphs: a CUDA device and no "
                f"enforce_eager (device {self.device!r}, enforce_eager {self.enforce_eager})"
            )
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.clock == "cpu" and self.device != "cpu":
            raise ValueError(
                f"clock 'cpu' needs device 'cpu' (a thread's CPU time does not see GPU work), "
                f"got device {self.device!r}"
            )
        if self.clock == "cpu" and self.cpu_threads != 1:
            raise ValueError(
                "clock 'cpu' needs cpu_threads=1 (the engine thread's CPU time misses work on "
                f"torch's other threads), got cpu_threads={self.cpu_threads!r}"
            )
        if not (self.cpu_kv_cache_gib >= 0 and self.cpu_kv_cache_gib != float("inf")):
            raise ValueError(
                f"cpu_kv_cache_gib must be finite and >= 0, got {self.cpu_kv_cache_gib!r}"
            )


@dataclass(slots=True)
class StepRecord:
    """One executed step, as the engine measured it. ``duration_s`` (schedule, prepare and
    execute) and ``update_s`` (the scheduler's update after it) are on the engine's clock
    (``EngineConfig.clock``); ``wall_s`` and ``cpu_s`` are the whole step (both parts) on the
    wall clock and in the engine thread's CPU time, whichever clock the timeline runs on.
    ``prepare_s`` is the runner's input preparation on the engine's clock (the probe of the
    host's speed, ``fidelity.host_speed``); ``timing`` has it on the wall clock."""

    batch: ScheduledBatch
    start_s: float
    duration_s: float
    timing: StepTiming
    update_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    prepare_s: float = 0.0

    @property
    def busy_s(self) -> float:
        """What the step costs the engine's timeline: its duration plus the update after it."""
        return self.duration_s + self.update_s


@dataclass(slots=True)
class StepOutput:
    """What one ``LLMEngine.step`` did: the batch, the requests it finished, and its measured
    record (None for an empty batch, which executes nothing)."""

    batch: ScheduledBatch
    finished: list[Request]
    record: StepRecord | None


@dataclass(slots=True)
class _Sampling:
    params: SamplingParams
    seed: int


class LLMEngine:
    """One replica: a model, its KV cache and the core's scheduler."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        if config.cpu_threads and torch.device(config.device).type == "cpu":
            torch.set_num_threads(config.cpu_threads)
        backend = resolve_backend(torch.device(config.device), config.backend)
        if config.mixed_graphs != "off" and backend != "triton":
            raise ValueError(
                f"mixed_graphs {config.mixed_graphs!r} needs CUDA graphs, which run on the "
                f"Triton kernels: backend {config.backend!r} resolves to {backend!r}"
            )
        check_memory(config)  # refuse what cannot fit before allocating any of it
        dtype = getattr(torch, config.dtype) if config.dtype else None
        self.model = load_model(
            config.model,
            device=config.device,
            dtype=dtype,
            weights=config.weights,
            seed=config.seed,
        )
        model_config = self.model.config
        self.device = torch.device(config.device)
        self.dtype = next(self.model.parameters()).dtype
        block_size = config.cache.block_size
        block_bytes = KVCache.bytes_per_block(
            model_config.num_layers,
            block_size,
            model_config.num_kv_heads,
            model_config.head_dim,
            self.dtype,
        )
        # The model's limit: its positions, or a sliding window it does not apply.
        max_len = config.cache.max_model_len or model_config.full_attention_len
        self.cache_config = config.cache.resolve(
            config.scheduler,
            size_blocks=lambda: self._blocks_from_memory(block_bytes, max_len),
            block_bytes=block_bytes,
            memory_model="paged",
            model=(model_config.name, model_config.full_attention_len),
        )
        self.scheduler_config = config.scheduler
        self.scheduler = self._new_scheduler(self.cache_config, self.scheduler_config)
        self.eos_token_ids = _eos_ids(model_config)
        self.kv_cache = KVCache.allocate(
            model_config.num_layers,
            self.cache_config.resolved_num_blocks,
            block_size,
            model_config.num_kv_heads,
            model_config.head_dim,
            self.dtype,
            self.device,
            self.cache_config.num_cpu_blocks,
            config.backend,
        )
        self.runner = ModelRunner(
            self.model,
            self.kv_cache,
            # Held weakly, so that no cycle keeps a dropped engine (and its cache) alive.
            _weak_method(self._params_of),
            max_len,
            eos_token_ids=self.eos_token_ids,
            backend=config.backend,
            decode_split=config.decode_split,
        )
        self.graph_stats: GraphStats | None = None
        if uses_graphs(config, self.device):
            self.graph_stats = capture_graphs(self.model, config, self.runner, max_len)
        self.clock = clock
        self._sampling: dict[str, _Sampling] = {}
        self._num_added = 0

    @staticmethod
    def _new_scheduler(cache: CacheConfig, config: SchedulerConfig) -> Scheduler:
        # The runner keeps the block tables between steps, from the changes each batch names.
        return Scheduler(cache, config, record_block_tables=True)

    # -- requests ----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int] | tuple[int, ...],
        params: SamplingParams,
        arrival_s: float,
        now_s: float | None = None,
        priority: int = 0,
    ) -> Request:
        """Queue a request; check ``request.reject_reason`` (None if it was accepted).
        ``priority`` orders it under ``scheduling_policy="priority"`` (lower first)."""
        vocab = self.model.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {request_id!r}: token id {bad[0]} is outside [0, {vocab})")
        request = Request(
            request_id=request_id,
            arrival_s=arrival_s,
            num_prompt_tokens=len(prompt_token_ids),
            max_output_tokens=params.max_tokens,
            n=params.n,
            prompt_token_ids=tuple(prompt_token_ids),
            priority=priority,
        )
        seed = params.seed
        if seed is None:
            # crc32, not hash(): a str's hash changes from process to process.
            seed = hash((self.config.seed, zlib.crc32(request_id.encode())))
        self._sampling[request_id] = _Sampling(params, seed)
        if params.n > 1 and self.scheduler.config.parallel_sampling == "fan_out":
            # vLLM v1's children: one sample each, a seed given becomes seed + index.
            one = replace(params, n=1)
            for index in range(params.n):
                child = child_id(request_id, index)
                child_seed = seed + index if params.seed is not None else hash((seed, child))
                self._sampling[child] = _Sampling(one, child_seed)
        self._num_added += 1
        if not self.scheduler.add_request(request, arrival_s if now_s is None else now_s):
            self._forget(request)
        return request

    def _forget(self, request: Request) -> None:
        """Drop a request's sampling settings (and its fanned-out children's)."""
        self._sampling.pop(request.request_id, None)
        if request.n > 1:
            for index in range(request.n):
                self._sampling.pop(child_id(request.request_id, index), None)

    def _params_of(self, request: Request) -> tuple[SamplingParams, int]:
        entry = self._sampling[request.request_id]
        return entry.params, entry.seed

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step ---------------------------------------------------------------------------

    def step(self, now_s: float | None = None) -> StepOutput:
        """Schedule, execute and apply one step starting at ``now_s`` (the clock if None).

        The step ends, and its tokens are stamped, at ``now_s`` plus its duration: on the wall
        clock (``self.clock`` after the model, or the runner's own duration when ``now_s`` is
        given) or, with ``EngineConfig.clock == "cpu"``, the engine thread's CPU time of
        schedule + prepare + execute."""
        wall_0, cpu_0 = time.perf_counter(), time.thread_time()
        start_s = self.clock() if now_s is None else now_s
        batch = self.scheduler.schedule(start_s)
        record = None
        if batch.is_empty:
            finished = self.scheduler.update(batch, StepResult(0.0), start_s)
        else:
            result = self.runner.execute(batch)
            wall_1, cpu_1 = time.perf_counter(), time.thread_time()
            cpu_mode = self.config.clock == "cpu"
            if cpu_mode:
                end_s = start_s + (cpu_1 - cpu_0)
            else:
                end_s = start_s + result.duration_s if now_s is not None else self.clock()
            timing = self.runner.last_timing
            prepare_s = timing.prepare_cpu_s if cpu_mode else timing.prepare_s
            record = StepRecord(batch, start_s, end_s - start_s, timing, prepare_s=prepare_s)
            finished = self.scheduler.update(batch, result, end_s)
            wall_2, cpu_2 = time.perf_counter(), time.thread_time()
            record.update_s = (cpu_2 - cpu_1) if cpu_mode else (wall_2 - wall_1)
            record.wall_s, record.cpu_s = wall_2 - wall_0, cpu_2 - cpu_0
        for request in finished:
            self._forget(request)
            self.runner.forget(request.seq_ids)  # a fanned-out parent's: its children's
        return StepOutput(batch, finished, record)

    @contextmanager
    def scheduled_by(
        self, cache_config: CacheConfig, scheduler_config: SchedulerConfig
    ) -> Iterator[Scheduler]:
        """The block runs under a fresh scheduler of these configurations, on this engine's
        model and cache (calibration's workloads, the warm-up); the engine's own scheduler
        comes back after, and the runner's block tables with it (the fresh scheduler numbers
        its sequences from 0 again). Every request added inside must have finished by the
        end of the block."""
        own = self.scheduler
        self.scheduler = self._new_scheduler(cache_config, scheduler_config)
        own_tables = self.runner.swap_tables(BlockTables(self.runner.tables.max_blocks_per_seq))
        try:
            yield self.scheduler
        finally:
            self.scheduler = own
            self.runner.swap_tables(own_tables)

    def warm_up(self, shapes: bool = False) -> int:
        """Run warm-up requests on a scratch scheduler, so that one-off lazy initialisation
        (allocator pools, kernel selection and specialisation, first-call caches) is paid
        before the first measured step: one short request, then with ``shapes`` every decode
        batch size up to ``max_num_seqs`` over short and long contexts under the engine's own
        policy (``engine.warm_up``; off by default: on the H200 it removed no slow start).
        The engine's own scheduler, its prefix cache and its counters are untouched; the KV
        blocks written are overwritten before any later read. Returns the number of steps run."""
        max_len = self.cache_config.resolved_max_model_len
        block_size = self.cache_config.block_size
        prompt, outputs = short_request(max_len)
        if self.cache_config.num_usable_blocks * block_size < prompt + outputs + block_size:
            return 0  # a cache too small for the warm-up request: nothing to warm with
        num_steps = self._run_scratch([(prompt, outputs)], "continuous")
        if shapes:
            requests = shape_requests(
                self.scheduler_config.max_num_seqs,
                max_len,
                self.cache_config.num_usable_blocks,
                block_size,
            )
            num_steps += self._run_scratch(requests, self.scheduler_config.policy)
        return num_steps

    def _run_scratch(self, requests: list[tuple[int, int]], policy: str) -> int:
        """Serve ``requests`` ((prompt tokens, output tokens) each) to the end on a scratch
        scheduler of ``policy``; the number of steps."""
        if not requests:
            return 0
        scratch_cache = replace(self.cache_config, num_cpu_blocks=0, enable_prefix_caching=False)
        scratch_config = replace(self.scheduler_config, policy=policy)
        vocab = self.model.config.vocab_size
        ids = [f"__warm_up_{i}__" for i in range(len(requests))]
        num_steps = 0
        try:
            with self.scheduled_by(scratch_cache, scratch_config) as scheduler:
                for i, (request_id, (prompt, outputs)) in enumerate(
                    zip(ids, requests, strict=True)
                ):
                    tokens = [(7 * k + 1 + i) % vocab for k in range(prompt)]
                    params = SamplingParams(max_tokens=outputs, ignore_eos=True)
                    self.add_request(request_id, tokens, params, arrival_s=0.0, now_s=0.0)
                    self._num_added -= 1
                scheduler.mark_arrivals_done()
                # Bounded: a request the scratch scheduler cannot serve must not hang it.
                bound = 4 * sum(prompt + outputs for prompt, outputs in requests)
                while scheduler.has_unfinished() and num_steps < bound:
                    self.step(now_s=0.0)
                    num_steps += 1
        finally:
            for request_id in ids:
                self._sampling.pop(request_id, None)
        return num_steps

    # -- sizing ------------------------------------------------------------------------------

    def _blocks_from_memory(self, block_bytes: int, max_len: int) -> int:
        if self.device.type != "cuda":
            return max(1, int(self.config.cpu_kv_cache_gib * GIB // block_bytes))
        graph_bytes = 0
        if uses_graphs(self.config, self.device):
            graph_bytes = graph_memory(self.model, self.config, self.dtype, max_len)
        return gpu_blocks(self.model, self.config, block_bytes, graph_bytes)


def _weak_method(method: Callable[[Request], _T]) -> Callable[[Request], _T]:
    """``method`` as a callable that does not keep its object alive."""
    ref = weakref.WeakMethod(method)

    def call(request: Request) -> _T:
        bound = ref()
        assert bound is not None, "the engine was freed while its runner still ran"
        return bound(request)

    return call


def _eos_ids(model_config: ModelSpec) -> frozenset[int]:
    return frozenset(model_config.eos_token_ids)
