"""Replay a trace on the real engine and write the simulator's run records.

The engine first runs one short warm-up request (``LLMEngine.warm_up``), so no measured step
pays one-off initialisation. Then requests arrive at their trace times (times ``time_scale``)
measured from the replay's start, on one of two clocks (``EngineConfig.clock``): ``wall``, the
real clock (arrivals are slept for; a step lasts what it lasts on the wall); or ``cpu``, a
virtual clock that advances by each step's measured thread-CPU time and jumps to the next
arrival when the engine is idle — a real measurement of each step's execution cost, with
queueing on a virtual timeline, which a loaded machine's waits for a core do not disturb.
Each request runs to exactly its trace output length (EOS ignored). Prompts are deterministic
synthetic token ids, shared wherever the trace says content is shared, so prefix-cache hits are
real reuse of real KV: a prompt's token ids are taken from the trace when it has them;
otherwise each prefix hash id (Mooncake ``hash_ids``, ``shared_prefix.csv``) stands for the
same ``hash_block_tokens`` ids in every request that names it, and the rest of the prompt is
the request's own.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from core.batch import ScheduledBatch
from core.request import Request
from core.settings import flat_settings
from engine.affinity import current_cores
from engine.llm_engine import EngineConfig, LLMEngine, StepRecord
from engine.sampling import SamplingParams
from records.metrics import summarize
from records.run_dir import write_run_dir
from records.schema import StepRecorder, request_frame
from records.step_shapes import STEP_SHAPES_FILE, StepShapeRecord, record_of, write_step_shapes
from traces.schema import Trace, TraceRequest


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How to replay: the engine, the clock's stretch, sampling and the SLOs for goodput."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    time_scale: float = 1.0
    # Also warm up on every decode batch size (``LLMEngine.warm_up(shapes=True)``).
    warm_up_shapes: bool = False
    temperature: float = 0.0
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None

    def __post_init__(self) -> None:
        if not self.time_scale >= 0 or self.time_scale == float("inf"):
            raise ValueError(f"time_scale must be finite and >= 0, got {self.time_scale!r}")


def synthetic_prompt(item: TraceRequest, index: int, vocab_size: int, seed: int) -> list[int]:
    """Deterministic prompt token ids for one trace request (see the module docstring)."""
    if item.prompt_token_ids is not None:
        return [t % vocab_size for t in item.prompt_token_ids]
    ids: list[int] = []
    if item.prefix_hash_ids is not None:
        for hash_id in item.prefix_hash_ids:
            rng = random.Random(hash((seed, "block", hash_id)))
            ids.extend(rng.randrange(vocab_size) for _ in range(item.hash_block_tokens))
            if len(ids) >= item.prompt_tokens:
                break
        ids = ids[: item.prompt_tokens]
    rng = random.Random(hash((seed, "request", index)))
    ids.extend(rng.randrange(vocab_size) for _ in range(item.prompt_tokens - len(ids)))
    return ids


@dataclass
class EngineRunResult:
    """One replay: the requests (accepted and rejected), the steps and the summary."""

    trace_name: str
    config: ReplayConfig
    num_blocks: int
    requests: list[Request]
    steps: StepRecorder
    summary: dict[str, Any]
    trace_stats: dict[str, float]
    notes: list[str]
    device_name: str
    wall_s: float
    prepare_s: float
    command: str | None = None
    step_shapes: list[StepShapeRecord] = field(default_factory=list)
    load_average: tuple[float | None, float | None] = (None, None)  # at start, at end
    dtype: str | None = None  # the model's, as torch names it without "torch."

    def requests_frame(self) -> Any:
        return request_frame(self.requests)

    def write(self, out: str | Path) -> None:
        c = self.steps.columns
        real = sum(c["real_token_slots"])
        used = real + sum(c["internal_fragmentation_slots"]) + sum(c["reservation_waste_slots"])
        engine = flat_settings(self.config.engine)
        payload = {
            "trace": self.trace_name,
            "executor": "engine",
            "config": {
                **engine,
                "time_scale": self.config.time_scale,
                "temperature": self.config.temperature,
                "memory_model": "paged",
            },
            "memory_model": "paged",
            "num_blocks": self.num_blocks,
            "notes": self.notes,
            "mean_real_token_share": real / used if used else 1.0,
            "summary": self.summary,
            "trace_stats": self.trace_stats,
            "command": self.command,
            "servesim_version": _version(),
            "device_name": self.device_name,
            "dtype": self.dtype,
            "torch_version": torch.__version__,
            "clock": self.config.engine.clock,
            # The steps' input preparation is on the same clock (fidelity.host_speed); runs
            # from before 2026-11-28 timed it on the wall clock whatever the steps' clock.
            "prepare_clock": self.config.engine.clock,
            "load_average_1m": {"start": self.load_average[0], "end": self.load_average[1]},
            # The cores the process could run on (``--cpu-cores`` pins them).
            "cpu_cores": current_cores(),
            "wall_s": self.wall_s,
            "input_prepare_s": self.prepare_s,
        }
        write_run_dir(out, self.requests_frame(), self.steps.to_frame(), payload)
        write_step_shapes(Path(out) / STEP_SHAPES_FILE, self.step_shapes)


CPU_CLOCK_NOTE = (
    "clock cpu: the timeline is virtual; each step advances it by the engine thread's CPU time "
    "(schedule, prepare, execute, update) and idle gaps jump to the next arrival, so latencies "
    "are execution cost plus queueing on that timeline, not wall-clock waits"
)


class _VirtualClock:
    """The replay's timeline under ``clock cpu``: moved only by the replay."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def advance_to(self, when_s: float) -> None:
        self.now_s = max(self.now_s, when_s)


def replay(
    trace: Trace,
    config: ReplayConfig,
    on_progress: Callable[[int], None] | None = None,
) -> EngineRunResult:
    """Run every request of ``trace`` through a fresh, warmed-up engine on its clock."""
    load_at_start = _load_average()
    engine = LLMEngine(config.engine)
    engine.warm_up(shapes=config.warm_up_shapes)
    pending = list(enumerate(trace.requests))
    pending.reverse()
    collected = _Collected()
    virtual = _VirtualClock() if config.engine.clock == "cpu" else None
    origin = time.monotonic()
    engine.clock = virtual if virtual is not None else (lambda: time.monotonic() - origin)

    def wait_until(when_s: float) -> None:
        if virtual is not None:
            virtual.advance_to(when_s)
        else:
            time.sleep(max(0.0, when_s - engine.clock()))

    scale = config.time_scale
    num_done = 0
    while pending or engine.has_unfinished():
        arrived = _add_arrivals(engine, pending, config, engine.clock())
        collected.requests.extend(arrived)
        num_done += sum(1 for request in arrived if request.reject_reason is not None)
        if not pending:
            engine.scheduler.mark_arrivals_done()
        if not engine.has_unfinished():
            if pending:
                wait_until(pending[-1][1].arrival_s * scale)
            continue
        output = engine.step()
        batch, finished, record = output.batch, output.finished, output.record
        if record is None:
            wake = batch.next_wakeup_s
            next_arrival = pending[-1][1].arrival_s * scale if pending else None
            targets = [t for t in (wake, next_arrival) if t is not None]
            wait_until(min(targets) if targets else engine.clock() + 1e-4)
        else:
            if virtual is not None:
                virtual.advance_to(record.start_s + record.busy_s)
            collected.add_step(batch, record)
        num_done += len(finished)
        if on_progress is not None and finished:
            on_progress(num_done)
    return _replay_result(
        trace, config, engine, collected, virtual is not None, origin, load_at_start
    )


@dataclass(slots=True)
class _Collected:
    """What a replay keeps as it runs: its requests (rejected ones too) and each executed
    step's batch and measured record. The rows of ``steps.csv`` and ``step_shapes.jsonl``
    are made from them once the run is over (``finish``): made between steps, they were the
    wall-clock engine's loop, 27 of its 33 us between steps on the CPU, about 1% of a step
    that the simulator does not price (benchmarks/results/replay_loop_gap.txt). A batch keeps
    what it scheduled (positions, context, its memory snapshot), so it reads the same later."""

    requests: list[Request] = field(default_factory=list)
    executed: list[tuple[ScheduledBatch, StepRecord]] = field(default_factory=list)

    def add_step(self, batch: ScheduledBatch, record: StepRecord) -> None:
        # The runner has read the batch's changed block tables, and no row reads them. Kept,
        # each sequence's table would stay once for every block it grew by (a sequence of L
        # blocks, about L^2 / 2 entries): gigabytes over a long replay of long contexts.
        batch.block_tables = None
        self.executed.append((batch, record))

    def finish(self) -> tuple[StepRecorder, list[StepShapeRecord], float]:
        """The run's step rows, its step shapes and its input preparation in seconds."""
        steps, shapes, prepare_s = StepRecorder(), [], 0.0
        for idx, (batch, record) in enumerate(self.executed):
            times = (record.wall_s, record.cpu_s)
            steps.record(batch, record.start_s, record.duration_s, wall_cpu_s=times)
            prepare_s += record.prepare_s
            shapes.append(
                record_of(
                    idx,
                    batch,
                    record.start_s,
                    record.duration_s,
                    record.prepare_s,
                    record.update_s,
                    *times,
                )
            )
        return steps, shapes, prepare_s


def _add_arrivals(
    engine: LLMEngine, pending: list[tuple[int, TraceRequest]], config: ReplayConfig, now: float
) -> list[Request]:
    """Add to ``engine`` the requests of ``pending`` (in arrival order from its end, where they
    are popped) that have arrived by ``now``; returns them, rejected ones included."""
    vocab = engine.model.config.vocab_size
    seed = config.engine.seed
    scale = config.time_scale
    arrived: list[Request] = []
    while pending and pending[-1][1].arrival_s * scale <= now:
        index, item = pending.pop()
        params = SamplingParams(
            max_tokens=item.output_tokens,
            temperature=config.temperature,
            n=item.num_samples,
            ignore_eos=True,
            seed=hash((seed, index)),
        )
        prompt = synthetic_prompt(item, index, vocab, seed)
        arrived.append(
            engine.add_request(
                item.request_id, prompt, params, item.arrival_s * scale, now, item.priority
            )
        )
    return arrived


def _replay_result(
    trace: Trace,
    config: ReplayConfig,
    engine: LLMEngine,
    collected: _Collected,
    cpu_clock: bool,
    origin: float,
    load_at_start: float | None,
) -> EngineRunResult:
    """The finished replay's result: its summary at the engine clock's end, the device, and
    the wall time and load average since ``origin`` and ``load_at_start``."""
    requests = collected.requests
    end_s = engine.clock()
    wall_s = time.monotonic() - origin
    steps, shapes, prepare_s = collected.finish()
    summary = summarize(requests, end_s, config.slo_ttft_s, config.slo_tpot_s)
    device = engine.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return EngineRunResult(
        trace_name=trace.name,
        config=config,
        num_blocks=engine.cache_config.resolved_num_blocks,
        requests=requests,
        steps=steps,
        summary=summary,
        trace_stats=trace.length_stats(),
        notes=[*trace.skipped_rows(), *trace.notes, *([CPU_CLOCK_NOTE] if cpu_clock else [])],
        device_name=name,
        wall_s=wall_s,
        prepare_s=prepare_s,
        step_shapes=shapes,
        load_average=(load_at_start, _load_average()),
        dtype=str(engine.dtype).removeprefix("torch."),
    )


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS has none), recorded with every
    run: on a shared machine it is how to read the run's timings."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _version() -> str:
    try:
        return metadata.version("servesim")
    except metadata.PackageNotFoundError:
        return "unknown"
