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


def check_budgets(config: SchedulerConfig, policy: str | None = None) -> None:
    """Refuse a token budget too small to give each of ``max_num_seqs`` requests a token in
    one step, under a policy that spends both budgets (``policy``: the one the replicas run,
    where it is not ``config.policy``). vLLM refuses to start on such a config."""
    name = policy or config.policy
    chosen = POLICIES[name](config)
    tokens, seqs = chosen.token_budget(), chosen.seq_budget()
    where = f"policy {name!r}"
    if name != config.policy:
        where += f" (the pools of {config.policy!r})"
    if tokens is not None and seqs is not None and tokens < seqs:
        raise ConfigError(
            "max_num_batched_tokens",
            f"must be >= max_num_seqs ({seqs}) under {where}, got {tokens}: a step "
            "could not hold one token of each request it may run (vLLM refuses this too; "
            "raise --max-num-batched-tokens or lower --max-num-seqs)",
        )


__all__ = [
    "POLICIES",
    "ChunkedPrefill",
    "ContinuousBatching",
    "DynamicBatching",
    "Policy",
    "StaticBatching",
    "StepContext",
    "check_budgets",
    "check_policy",
]


def make_policy(config: SchedulerConfig) -> Policy:
    """The policy ``config`` names (checked against POLICIES)."""
    check_policy(config.policy)
    return POLICIES[config.policy](config)
