"""Sizing the KV cache from GPU memory, the part a CPU can check: a graph-memory measurement
that came out negative is refused with its reason before any CUDA call."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from engine.llm_engine import LLMEngine


def test_graph_memory_measured_negative_is_refused_before_any_cuda_call() -> None:
    # A second calibration once measured its graphs at -109 GiB (memory a dropped engine held
    # was freed as they were captured) and asked for a 219 GiB cache on a 140 GiB H200.
    with pytest.raises(ValueError, match=r"CUDA graphs measured at -109.0 GiB"):
        LLMEngine._profile_gpu_blocks(None, 1 << 20, -109 * (1 << 30))  # type: ignore[arg-type]
