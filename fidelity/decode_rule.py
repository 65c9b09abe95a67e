"""Which context a CPU profile prices a skewed decode batch at, chosen by its whole steps.

``sim calibrate`` first picks the rule (``mean``, ``max`` or ``per_sequence``,
``decode_attention_context``) from a few skewed batches of the decode kernel timed alone. On the
CPU that chose ``max`` in seven of the eight calibrations of 2026-11-27. Yet in each of the
eight, the profile's skewed whole engine steps (124 of them) sat closer to the fitted model
under ``mean`` or ``per_sequence`` (3.8-7.8% by median) than under ``max`` (4.9-11.0%). On
the first three pairs, the engine's TPOT came out 3.4-9.0% off under the rules the steps chose
against 5.9-8.9% under ``max`` (``benchmarks/results/refit_cpu.txt``). In a whole step the
batch's short sequences cost what they read, not what the longest does. So on the CPU, where
the joint step fit prices every term, the rule is the one whose fitted model fits the skewed
whole steps best (``rule_by_steps``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Final

import numpy as np

RULES: Final = ("mean", "max", "per_sequence")
MIN_SKEWED_STEPS: Final = 10
"""Whole steps with a skewed decode batch (two or more different contexts) a profile needs
before its rule is chosen by them."""


def skewed_steps(steps: list[dict[str, Any]]) -> list[int]:
    """Indices of the steps whose decode batch has two or more different contexts."""
    return [
        i for i, step in enumerate(steps) if len(set(step.get("decode_context_tokens") or ())) > 1
    ]


def rule_by_steps(path: Path) -> tuple[str | None, dict[str, float]]:
    """The rule under which the profile at ``path`` (a joint step fit) fits its skewed whole
    steps best, by the median |relative residual| over them, and each rule's median; None
    (and no scores) when it has fewer than MIN_SKEWED_STEPS of them or no joint fit."""
    from fidelity.profile_check import load_model

    data = json.loads(path.read_text())
    skewed = skewed_steps(data.get("steps") or [])
    if data.get("step_fit") != "joint" or len(skewed) < MIN_SKEWED_STEPS:
        return None, {}
    scores: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for rule in RULES:
            copy = Path(scratch) / f"{rule}.json"
            copy.write_text(json.dumps({**data, "decode_attention_context": rule}))
            residuals = np.abs(np.array(load_model(copy).residuals()))
            scores[rule] = float(np.median(residuals[skewed]))
    return min(RULES, key=lambda rule: scores[rule]), scores


def apply_rule_by_steps(path: Path) -> dict[str, Any] | None:
    """Rewrite the profile at ``path`` with the rule ``rule_by_steps`` chooses, keeping the
    kernel checks' choice beside it (``decode_attention_rule``); what was chosen, or None when
    the profile's steps cannot choose."""
    rule, scores = rule_by_steps(path)
    if rule is None:
        return None
    data = json.loads(path.read_text())
    earlier = data.get("decode_attention_rule") or {}  # (chosen before: keep the checks' rule)
    chosen = {
        "from": "whole steps",
        "kernel_checks_chose": earlier.get("kernel_checks_chose")
        or data.get("decode_attention_context"),
        "skewed_steps": len(skewed_steps(data.get("steps") or [])),
        "median_abs_residual": {k: round(v, 6) for k, v in scores.items()},
    }
    data["decode_attention_context"] = rule
    data["decode_attention_rule"] = chosen
    path.write_text(json.dumps(data, indent=1) + "\n")
    return {"rule": rule, **chosen}
