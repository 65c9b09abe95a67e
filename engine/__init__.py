"""The real engine: a Llama-family model on our kernels, driven by the shared core.

``from engine import LLM, SamplingParams`` is the offline API (vLLM's convention);
``python -m engine run TRACE ...`` replays a trace. ``engine.core`` is the standard-library core
the simulator shares, and importing it (or this package) loads no torch: the names below resolve
on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "LLM": "engine.llm",
    "RequestOutput": "engine.llm",
    "CompletionOutput": "engine.llm",
    "SamplingParams": "engine.sampling",
    "EngineConfig": "engine.llm_engine",
    "LLMEngine": "engine.llm_engine",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    # PEP 562: importing ``engine.core`` must not pull torch in through this package.
    if name not in _HOMES:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
