"""Engines are freed when dropped and calibration builds one engine (issue 29's first
calibration defect: ``measure`` dropped its engine, but a reference cycle kept it and its KV
cache alive while two more engines were built, whose memory profiling on CUDA counted it and
found no room for a cache)."""

from __future__ import annotations

import gc
import weakref

import pytest

pytest.importorskip("torch")

from engine import profiling
from engine.llm_engine import EngineConfig, LLMEngine
from tests.engine.engine_lifetimes import engine_lifetimes

SMALL_CACHE = dict(weights="random", cpu_kv_cache_gib=0.01)


def test_a_dropped_engine_is_freed_at_once() -> None:
    gc.collect()
    gc.disable()
    try:
        engine = LLMEngine(EngineConfig(**SMALL_CACHE))  # type: ignore[arg-type]
        engine.warm_up()
        refs = [weakref.ref(x) for x in (engine, engine.kv_cache, engine.model, engine.runner)]
        del engine
        assert [ref() for ref in refs] == [None] * 4
    finally:
        gc.enable()


def test_calibration_builds_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    config = EngineConfig(
        **SMALL_CACHE,  # type: ignore[arg-type]
        preemption_mode="swap",
        swap_space_gib=0.01,
    )
    with engine_lifetimes(monkeypatch) as built:
        measured = profiling.measure(config, profiling.SMALL_GRID)
        assert len(built.refs) == 1  # parts, check steps and the step grid on the same engine
        assert built.alive() == 0  # and measure let go of it
    # The whole steps still ran: a prefill check step and the grid's decode steps.
    assert any(step["prefill_chunks"] for step in measured.steps)
    assert any(step["num_decode_seqs"] == 2 for step in measured.steps)
