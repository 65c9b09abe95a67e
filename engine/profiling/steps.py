"""Whole engine steps as calibration points: a small mixed workload as check points
(``check_steps``) and the step grid the calibrated cost model is fitted to (``grid_steps``),
each step's shape and busy time as a profile ``steps`` entry. Both run on the calibration's
one engine, each under a fresh scheduler of its own (``_scheduled_as``): a second engine would
hold a second model and KV cache, and on CUDA its memory profiling would count the first's."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import torch

from core.scheduler import Scheduler
from engine.llm_engine import LLMEngine, StepRecord
from engine.profiling.grid import CalibrationGrid
from engine.sampling import SamplingParams

CHECK_BUDGET_TOKENS = 512


def check_steps(engine: LLMEngine, grid: CalibrationGrid) -> list[dict[str, Any]]:
    """Whole steps of ``engine`` (schedule, prepare, execute, update), warmed up, on a small
    synthetic workload of mixed prompt lengths under chunked prefill at a budget of at most
    ``CHECK_BUDGET_TOKENS``: each step's shape and busy time on the engine's clock."""
    budget = min(engine.scheduler_config.max_num_batched_tokens, CHECK_BUDGET_TOKENS)
    with _scheduled_as(engine, budget):
        engine.warm_up()
        max_len = engine.cache_config.resolved_max_model_len
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
    engine: LLMEngine,
    grid: CalibrationGrid,
    on_point: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Whole steps of ``engine``, warmed up, over the step grid: for each (num_seqs,
    context) of ``grid.step_seqs`` x ``grid.step_context``, that many requests of a
    ``context``-token synthetic prompt, prefilled under chunked prefill at the engine's own
    token budget, then decoded ``grid.step_decodes`` steps, a ``step_mixed_prompt``-token
    prompt arriving half-way (one mixed step). The grid runs ``grid.step_repeats`` rounds,
    one after the other; each step's entry is its median busy time over the rounds, with its
    spread, the host's part of it (schedule, prepare, update) and the runner's preparation.
    These are the steps the calibrated model fits the host clock to
    (``sim.costmodel.host_fit``), so they cover decode batches, prefill chunks and mixed steps
    alike."""
    tick = on_point or (lambda _: None)
    rounds: list[list[list[StepRecord]]] = []
    with _scheduled_as(engine, engine.scheduler_config.max_num_batched_tokens):
        engine.warm_up()
        for done in range(1, grid.step_repeats + 1):
            rng = torch.Generator().manual_seed(2)  # the same prompts every round
            groups = [
                _run_group(engine, grid, num_seqs, context, rng, f"r{done}.")
                for num_seqs in grid.step_seqs
                for context in grid.step_context
            ]
            rounds.append(groups)
            tick(f"step round {done}")
    return [entry for groups in zip(*rounds, strict=True) for entry in _merged(groups)]


def _run_group(
    engine: LLMEngine,
    grid: CalibrationGrid,
    num_seqs: int,
    context: int,
    rng: torch.Generator,
    tag: str,
) -> list[StepRecord]:
    """One group of the step grid, run to its end: its executed steps' records."""
    max_len = engine.cache_config.resolved_max_model_len
    vocab = engine.model.config.vocab_size
    prompt = min(context, max_len - grid.step_decodes - 1)
    params = SamplingParams(max_tokens=grid.step_decodes + 1, ignore_eos=True)
    for i in range(num_seqs):
        ids = torch.randint(0, vocab, (prompt,), generator=rng).tolist()
        engine.add_request(f"{tag}g{num_seqs}x{context}.{i}", ids, params, 0.0, now_s=0.0)
    late = torch.randint(0, vocab, (min(grid.step_mixed_prompt, prompt),), generator=rng)
    records: list[StepRecord] = []
    while engine.has_unfinished():
        if len(records) == 1 + grid.step_decodes // 2:
            late_params = SamplingParams(max_tokens=2, ignore_eos=True)
            engine.add_request(
                f"{tag}g{num_seqs}x{context}.late", late.tolist(), late_params, 0.0, 0.0
            )
        output = engine.step()
        if output.record is not None:
            records.append(output.record)
    return records


def _merged(groups: tuple[list[StepRecord], ...]) -> list[dict[str, Any]]:
    """One group's steps over the rounds: each step's entry from its first round's shape,
    with the median busy time, its spread, and the host's median part (a round whose steps
    came out in other shapes is left out)."""
    first = groups[0]
    same = [g for g in groups if [_shape(r) for r in g] == [_shape(r) for r in first]]
    entries = []
    for idx, record in enumerate(first):
        busy = [g[idx].busy_s for g in same]
        host = [_host_s(g[idx]) for g in same]
        entry = _step_entry(record)
        entry["measured_s"] = statistics.median(busy)
        entry["spread_s"] = _half_iqr(busy)
        entry["repeats"] = len(busy)
        entry["host_s"] = statistics.median(host)
        entry["prepare_s"] = statistics.median(g[idx].prepare_s for g in same)
        entries.append(entry)
    return entries


def _host_s(record: StepRecord) -> float:
    """The host's part of a step (schedule, prepare, update) on the engine's clock: its wall
    time less the runner's execute (both on the wall clock), in the share of the step's busy
    time that the wall clock gives it."""
    if record.wall_s <= 0:
        return 0.0
    host_wall = max(0.0, record.wall_s - record.timing.execute_s)
    return host_wall * record.busy_s / record.wall_s


def _shape(record: StepRecord) -> tuple[Any, ...]:
    entry = _step_entry(record)
    return (tuple(map(tuple, entry["prefill_chunks"])), tuple(entry["decode_context_tokens"]))


def _half_iqr(values: list[float]) -> float:
    if len(values) < 4:
        return (max(values) - min(values)) / 2
    quartiles = statistics.quantiles(values, n=4)
    return (quartiles[2] - quartiles[0]) / 2


def _scheduled_as(engine: LLMEngine, budget_tokens: int) -> AbstractContextManager[Scheduler]:
    """``engine`` under a fresh scheduler (``LLMEngine.scheduled_by``): chunked prefill at
    ``budget_tokens``, preemption by recompute, no host swap space and no prefix cache, so
    that every step is a plain step of the engine's own model and cache."""
    cache = replace(engine.cache_config, num_cpu_blocks=0, enable_prefix_caching=False)
    config = replace(
        engine.scheduler_config,
        policy="chunked",
        max_num_batched_tokens=budget_tokens,
        preemption_mode="recompute",
    )
    return engine.scheduled_by(cache, config)


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
        # The runner's input preparation on the engine's clock: what a run's host is measured
        # against (fidelity.host_speed).
        "prepare_s": record.prepare_s,
    }
