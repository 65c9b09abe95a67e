"""Batching policies, found by name in ``POLICIES`` (argparse choices and tests use it)."""

from __future__ import annotations

from engine.core.policies.base import Policy, StepContext
from engine.core.policies.chunked import ChunkedPrefill
from engine.core.policies.continuous import ContinuousBatching
from engine.core.policies.static import DynamicBatching, StaticBatching

POLICIES: dict[str, type[Policy]] = {
    "static": StaticBatching,
    "dynamic": DynamicBatching,
    "continuous": ContinuousBatching,
    "chunked": ChunkedPrefill,
}

__all__ = [
    "POLICIES",
    "ChunkedPrefill",
    "ContinuousBatching",
    "DynamicBatching",
    "Policy",
    "StaticBatching",
    "StepContext",
]
