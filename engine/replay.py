"""Replay a trace on the real engine, on a real clock, and write the simulator's run records.

Requests arrive at their trace times (times ``time_scale``) measured from the replay's start;
each runs to exactly its trace output length (EOS ignored). Prompts are deterministic synthetic
token ids, shared wherever the trace says content is shared, so prefix-cache hits are real reuse
of real KV: a prompt's token ids are taken from the trace when it has them; otherwise each
prefix hash id (Mooncake ``hash_ids``, ``shared_prefix.csv``) stands for the same
``hash_block_tokens`` ids in every request that names it, and the rest of the prompt is the
request's own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from engine.core.request import Request
from engine.llm_engine import EngineConfig, LLMEngine
from engine.sampling import SamplingParams
from records.metrics import summarize
from records.run_dir import write_run_dir
from records.schema import StepRecorder, request_frame
from traces.schema import Trace, TraceRequest


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How to replay: the engine, the clock's stretch, sampling and the SLOs for goodput."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    time_scale: float = 1.0
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

    def requests_frame(self) -> Any:
        return request_frame(self.requests)

    def write(self, out: str | Path) -> None:
        c = self.steps.columns
        real = sum(c["real_token_slots"])
        used = real + sum(c["internal_fragmentation_slots"]) + sum(c["reservation_waste_slots"])
        engine = asdict(self.config.engine)
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
            "torch_version": torch.__version__,
            "wall_s": self.wall_s,
            "input_prepare_s": self.prepare_s,
        }
        write_run_dir(out, self.requests_frame(), self.steps.to_frame(), payload)


def replay(
    trace: Trace,
    config: ReplayConfig,
    on_progress: Callable[[int], None] | None = None,
) -> EngineRunResult:
    """Run every request of ``trace`` through a fresh engine on the wall clock."""
    engine = LLMEngine(config.engine)
    vocab = engine.model.config.vocab_size
    seed = config.engine.seed
    pending = list(enumerate(trace.requests))
    pending.reverse()
    requests: list[Request] = []
    recorder = StepRecorder()
    prepare_s = 0.0
    origin = time.monotonic()
    engine.clock = lambda: time.monotonic() - origin
    scale = config.time_scale
    num_done = 0
    while pending or engine.has_unfinished():
        now = engine.clock()
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
            request = engine.add_request(
                item.request_id, prompt, params, item.arrival_s * scale, now
            )
            requests.append(request)
            if request.reject_reason is not None:
                num_done += 1
        if not pending:
            engine.scheduler.mark_arrivals_done()
        if not engine.has_unfinished():
            if pending:
                time.sleep(max(0.0, pending[-1][1].arrival_s * scale - engine.clock()))
            continue
        output = engine.step()
        batch, finished, record = output.batch, output.finished, output.record
        if record is None:
            wake = batch.next_wakeup_s
            next_arrival = pending[-1][1].arrival_s * scale if pending else None
            targets = [t for t in (wake, next_arrival) if t is not None]
            time.sleep(max(0.0, min(targets) - engine.clock()) if targets else 1e-4)
        else:
            recorder.record(batch, record.start_s, record.duration_s)
            prepare_s += record.timing.prepare_s
        num_done += len(finished)
        if on_progress is not None and finished:
            on_progress(num_done)
    end_s = engine.clock()
    summary = summarize(requests, end_s, config.slo_ttft_s, config.slo_tpot_s)
    device = engine.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return EngineRunResult(
        trace_name=trace.name,
        config=config,
        num_blocks=engine.cache_config.num_blocks,
        requests=requests,
        steps=recorder,
        summary=summary,
        trace_stats=trace.length_stats(),
        notes=list(trace.notes),
        device_name=name,
        wall_s=end_s,
        prepare_s=prepare_s,
    )


def _version() -> str:
    try:
        return metadata.version("servesim")
    except metadata.PackageNotFoundError:
        return "unknown"
