"""Batching policies, found by name in ``POLICIES`` (the one list of them: the flags' choices,
every config's check and the tests read it)."""

from __future__ import annotations

from core.config import SchedulerConfig
from core.errors import ConfigError
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


def check_policy(name: str, also: tuple[str, ...] = (), field: str = "policy") -> None:
    """Refuse a policy name that is not in ``POLICIES`` (nor in ``also``: what an executor
    offers beside the policies, as the simulator's disaggregated deployment); ``field`` is the
    setting that holds it."""
    if name not in POLICIES and name not in also:
        raise ConfigError(field, f"must be one of {(*POLICIES, *also)}, got {name!r}")


__all__ = [
    "POLICIES",
    "ChunkedPrefill",
    "ContinuousBatching",
    "DynamicBatching",
    "Policy",
    "StaticBatching",
    "StepContext",
    "check_policy",
]


def make_policy(config: SchedulerConfig) -> Policy:
    """The policy ``config`` names (checked against POLICIES)."""
    check_policy(config.policy)
    return POLICIES[config.policy](config)
