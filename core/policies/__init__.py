"""Batching policies, found by name in ``POLICIES`` (argparse choices and tests use it)."""

from __future__ import annotations

from core.policies.base import Policy, StepContext
from core.policies.chunked import ChunkedPrefill
from core.policies.continuous import ContinuousBatching
from core.policies.static import DynamicBatching, StaticBatching

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
