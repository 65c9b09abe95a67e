"""A CPU profile's decode rule chosen by its whole steps (``fidelity.decode_rule``): the rule
under which the joint fit fits the skewed decode steps best, written back with the kernel
checks' choice beside it; too few skewed steps leave the profile as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fidelity.decode_rule import MIN_SKEWED_STEPS, apply_rule_by_steps, rule_by_steps
from sim.costmodel.base import StepShape, make_cost_model
from sim.costmodel.profile import load_profile
from tests.sim.test_profile_v4 import CPU, SHAPES, TINY, _profile, _step

SKEWED = [
    StepShape(decode_context_tokens=(short,) * n + (long,) * n)
    for n in (1, 2, 4, 8)
    for short, long in ((64, 1024), (128, 2048), (256, 4096))
]


def _engine_steps(tmp_path: Path, rule: str) -> list[dict[str, object]]:
    """Whole steps of a made-up engine whose decode attention costs what ``rule`` says (1.2x
    the tables throughout, plus 1 ms a step)."""
    tables = make_cost_model(
        TINY,
        CPU,
        profile_path=_profile(tmp_path, [], step_fit="overhead", decode_attention_context=rule),
        block_size=16,
    )
    steps = []
    for shape in SHAPES + SKEWED:
        terms = tables.step_breakdown(shape)
        steps.append(_step(shape, 1.2 * (sum(terms.values()) - terms["overhead"]) + 1e-3))
    return steps


@pytest.mark.parametrize("rule", ["mean", "max"])
def test_the_whole_steps_choose_the_rule_they_were_made_with(tmp_path: Path, rule: str) -> None:
    steps = _engine_steps(tmp_path, rule)
    path = _profile(tmp_path, steps, decode_attention_context="per_sequence")
    chosen, scores = rule_by_steps(path)
    assert chosen == rule and scores[rule] == min(scores.values()) < 0.01
    written = apply_rule_by_steps(path)
    assert written is not None and written["kernel_checks_chose"] == "per_sequence"
    assert load_profile(path).decode_attention_context == rule
    assert json.loads(path.read_text())["decode_attention_rule"]["skewed_steps"] == len(SKEWED)


def test_too_few_skewed_steps_leave_the_profile_alone(tmp_path: Path) -> None:
    steps = _engine_steps(tmp_path, "mean")[: len(SHAPES) + MIN_SKEWED_STEPS - 1]
    path = _profile(tmp_path, steps, decode_attention_context="max")
    before = path.read_text()
    assert rule_by_steps(path) == (None, {})
    assert apply_rule_by_steps(path) is None and path.read_text() == before
    # An overhead-only profile (no joint fit) is not chosen for either.
    overhead = _profile(tmp_path, _engine_steps(tmp_path, "mean"), step_fit="overhead")
    assert rule_by_steps(overhead) == (None, {})
