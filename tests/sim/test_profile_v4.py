"""Profile format version 4: ``step_fit: joint`` fits the token, prefill-attention and
decode-attention scales and the step overhead (fixed + per sequence) to the profile's whole
steps; versions up to 3 keep the overhead-only fit, and a bad ``step_fit`` names the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import get_model_preset
from sim.costmodel.base import StepShape, make_cost_model
from sim.costmodel.profile import load_profile
from sim.specs.hardware import HARDWARE_PRESETS
from tests.sim.profile_header import cpu_profile_header

TINY = get_model_preset("tiny-llama")
CPU = HARDWARE_PRESETS["CPU-1T"]
LAYERS = TINY.num_layers


def _ops() -> dict[str, Any]:
    return {
        "linear": {"num_tokens": [1, 1000], "time_s": [1e-4, 1e-2]},
        "elementwise": {"num_tokens": [1, 1000], "time_s": [1e-5, 1e-3]},
        "lm_head": {"num_seqs": [1, 100], "time_s": [2e-4, 2e-3]},
        "decode_attention": {
            "num_seqs": [1, 64],
            "context_tokens": [16, 4096],
            "time_s": [[1e-5, 1e-3], [6e-4, 6e-2]],
        },
        "prefill_attention": {
            "num_query_tokens": [16, 4096],
            "num_context_tokens": [0, 4096],
            "time_s": [[1e-5, 2e-5], [1e-2, 2e-2]],
        },
    }


SHAPES = [
    StepShape(decode_context_tokens=(c,) * b) for b in (1, 2, 4, 8, 16) for c in (64, 256, 1024)
] + [StepShape(prefill_chunks=((q, c),)) for q in (64, 256, 1024, 2048) for c in (0, 512)]


def _step(shape: StepShape, measured_s: float) -> dict[str, Any]:
    contexts = list(shape.decode_context_tokens)
    return {
        "prefill_chunks": [list(chunk) for chunk in shape.prefill_chunks],
        "num_decode_seqs": len(contexts),
        "sum_decode_context_tokens": sum(contexts),
        "decode_context_tokens": contexts,
        "measured_s": measured_s,
    }


def _profile(tmp_path: Path, steps: list[dict[str, Any]], **changes: Any) -> Path:
    data: dict[str, Any] = {
        **cpu_profile_header(4),
        "timer": "thread_cpu",
        "ops": _ops(),
        "steps": steps,
        "step_fit": "joint",
    }
    data.update(changes)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def _table_terms(tmp_path: Path, shape: StepShape) -> dict[str, float]:
    """The terms as the tables alone give them (a profile without steps)."""
    cost = make_cost_model(
        TINY, CPU, profile_path=_profile(tmp_path, [], step_fit="overhead"), block_size=16
    )
    return cost.step_breakdown(shape)


def _truth(terms: dict[str, float], num_seqs: int) -> float:
    """A made-up engine whose parts cost 1.3x, 0.9x and 1.8x the tables, plus 2 ms a step
    and 0.1 ms a sequence."""
    tokens = terms["linear"] + terms["store_kv"] + terms["elementwise"]
    rest = terms["lm_head"] + terms["copy_blocks"] + terms["swap"] + terms["allreduce"]
    return (
        1.3 * tokens
        + 0.9 * terms["prefill_attention"]
        + 1.8 * terms["decode_attention"]
        + rest
        + 2e-3
        + 1e-4 * num_seqs
    )


def test_joint_fit_recovers_known_scales_and_overheads(tmp_path: Path) -> None:
    steps = [_step(s, _truth(_table_terms(tmp_path, s), s.num_seqs)) for s in SHAPES]
    cost = make_cost_model(TINY, CPU, profile_path=_profile(tmp_path, steps), block_size=16)
    fitted = cost.fitted  # type: ignore[attr-defined]
    # The token scale on each knot it has steps around, the decode scale at both ends.
    for knot in ("token_scale@1", "token_scale@4", "token_scale@16", "token_scale@256"):
        assert fitted[knot] == pytest.approx(1.3, rel=2e-3), knot
    assert fitted["prefill_attention_scale"] == pytest.approx(0.9, rel=2e-3)
    assert fitted["decode_attention_scale@16"] == pytest.approx(1.8, rel=2e-3)
    assert fitted["decode_attention_scale@1048576"] == pytest.approx(1.8, rel=2e-3)
    assert fitted["fixed_overhead_s"] == pytest.approx(2e-3, rel=2e-3)
    assert fitted["per_seq_overhead_s"] == pytest.approx(1e-4, rel=2e-2)
    shape = StepShape(decode_context_tokens=(300, 700, 900), prefill_chunks=((128, 64),))
    expected = _truth(_table_terms(tmp_path, shape), shape.num_seqs)
    assert cost.step_time_s(shape) == pytest.approx(expected, rel=2e-3)
    breakdown = cost.step_breakdown(shape)
    assert breakdown["overhead"] == pytest.approx(2e-3 + 4e-4, rel=2e-3)


def test_a_step_slowed_by_load_does_not_drag_the_fit(tmp_path: Path) -> None:
    truths = [_truth(_table_terms(tmp_path, s), s.num_seqs) for s in SHAPES]
    steps = [_step(s, t) for s, t in zip(SHAPES, truths, strict=True)]
    steps[3]["measured_s"] *= 3  # one step slowed by load
    cost = make_cost_model(TINY, CPU, profile_path=_profile(tmp_path, steps), block_size=16)
    pairs = list(zip(SHAPES, truths, strict=True))
    errors = [abs(cost.step_time_s(s) / t - 1) for i, (s, t) in enumerate(pairs) if i != 3]
    assert sorted(errors)[len(errors) // 2] < 0.01
    assert cost.step_time_s(SHAPES[3]) < 1.5 * truths[3]


def test_a_negative_coefficient_is_pinned(tmp_path: Path) -> None:
    # Steps that get cheaper with every sequence: the per-sequence overhead would come out
    # negative; it is pinned at 0 and the rest fitted without it.
    steps = []
    for shape in SHAPES:
        truth = _truth(_table_terms(tmp_path, shape), shape.num_seqs)
        steps.append(_step(shape, truth - 2e-4 * shape.num_seqs))
    cost = make_cost_model(TINY, CPU, profile_path=_profile(tmp_path, steps), block_size=16)
    fitted = cost.fitted  # type: ignore[attr-defined]
    assert fitted["per_seq_overhead_s"] == 0.0
    assert fitted["fixed_overhead_s"] > 0 and fitted["token_scale@16"] > 0


def test_version_3_keeps_the_overhead_fit(tmp_path: Path) -> None:
    steps = [_step(s, _truth(_table_terms(tmp_path, s), s.num_seqs)) for s in SHAPES]
    path = _profile(tmp_path, steps, format_version=3)
    assert load_profile(path).step_fit == "overhead"
    fitted = make_cost_model(TINY, CPU, profile_path=path, block_size=16).fitted  # type: ignore[attr-defined]
    assert {v for k, v in fitted.items() if "scale" in k} == {1.0}


def test_bad_step_fit_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"field 'step_fit': must be one of"):
        load_profile(_profile(tmp_path, [], step_fit="guess"))
    with pytest.raises(ValueError, match=r"field 'step_fit': expected str"):
        load_profile(_profile(tmp_path, [], step_fit=3))


def test_padding_is_priced_only_where_the_engine_computes_it(tmp_path: Path) -> None:
    from sim.costmodel.config import CostModelConfig

    padded = StepShape(prefill_chunks=((100, 0), (20, 0)), num_padding_tokens=80)
    packed = StepShape(prefill_chunks=((100, 0), (20, 0)))
    steps = [_step(s, _truth(_table_terms(tmp_path, s), s.num_seqs)) for s in SHAPES]
    path = _profile(tmp_path, steps)
    for profile in (None, path):
        default = make_cost_model(TINY, CPU, profile_path=profile, block_size=16)
        assert default.step_time_s(padded) > default.step_time_s(packed)
        no_padding = CostModelConfig(price_padding=False)
        engine_like = make_cost_model(
            TINY, CPU, profile_path=profile, config=no_padding, block_size=16
        )
        assert engine_like.step_time_s(padded) == engine_like.step_time_s(packed)
        assert engine_like.step_time_s(packed) == default.step_time_s(packed)


def _prepare(num_seqs: int) -> float:
    """A CPU engine's input preparation: 150 us, 10 us a sequence, and 430 us more past 8
    (the torch backend's split path builds its gather plan there)."""
    return 1.5e-4 + 1e-5 * num_seqs + (4.3e-4 if num_seqs > 8 else 0.0)


def test_the_steps_measured_preparation_prices_its_jump(tmp_path: Path) -> None:
    shapes = SHAPES + [
        StepShape(decode_context_tokens=(c,) * b) for b in (9, 12) for c in (64, 256, 1024)
    ]

    def measured(shape: StepShape) -> float:
        truth = _truth(_table_terms(tmp_path, shape), shape.num_seqs)
        return truth + _prepare(shape.num_seqs)

    steps = [{**_step(s, measured(s)), "prepare_s": _prepare(s.num_seqs)} for s in shapes]
    cost = make_cost_model(
        TINY, CPU, profile_path=_profile(tmp_path, steps, format_version=5), block_size=16
    )
    fitted = cost.fitted  # type: ignore[attr-defined]
    assert fitted["fixed_overhead_s"] == pytest.approx(2e-3, rel=1e-2)
    assert fitted["per_seq_overhead_s"] == pytest.approx(1e-4, rel=5e-2)
    ten = StepShape(decode_context_tokens=(300,) * 10)
    assert cost.step_time_s(ten) == pytest.approx(measured(ten), rel=2e-3)
    # Without it, one fixed and one per-sequence cost stand for the preparation too, and their
    # line cannot bend at 9.
    for step in steps:
        del step["prepare_s"]
    line = make_cost_model(
        TINY, CPU, profile_path=_profile(tmp_path, steps, format_version=5), block_size=16
    )
    assert line.step_time_s(ten) / measured(ten) - 1 < -0.015  # (-2.0% here)
