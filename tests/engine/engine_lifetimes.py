"""A record of every ``LLMEngine`` built while it is active, for the tests of issue 29's first
calibration defect: an engine (with its KV cache, 0.9 of GPU memory) still alive when the next
one is built, so that the next one's memory profiling counted it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from engine.llm_engine import LLMEngine


class EngineLifetimes:
    """Weak references to each engine built and to its KV cache, and how many engines were
    still alive at each construction."""

    def __init__(self) -> None:
        self.refs: list[tuple[weakref.ref[Any], weakref.ref[Any]]] = []
        self.alive_at_build: list[int] = []

    def alive(self) -> int:
        return sum(1 for engine, cache in self.refs if engine() is not None or cache() is not None)


@contextmanager
def engine_lifetimes(monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineLifetimes]:
    """Record the engines built inside the block. The cycle collector is off meanwhile: an
    engine must be freed when its last reference goes, not whenever a collection happens to
    run (the defect hid behind that: a cycle kept the dropped engine alive)."""
    record = EngineLifetimes()
    original = LLMEngine.__init__

    def init(self: LLMEngine, *args: Any, **kwargs: Any) -> None:
        record.alive_at_build.append(record.alive())
        original(self, *args, **kwargs)
        record.refs.append((weakref.ref(self), weakref.ref(self.kv_cache)))

    monkeypatch.setattr(LLMEngine, "__init__", init)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield record
    finally:
        if enabled:
            gc.enable()
