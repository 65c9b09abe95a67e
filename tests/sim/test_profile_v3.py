"""Profile format version 3: the timer the profile was taken with, and skewed decode batches
that choose whether decode attention is priced at a batch's mean or its longest context;
versions 1 and 2 still read, and bad v3 fields are errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.model.presets import get_model_preset
from fidelity.calibrate import choose_decode_rule, resolve_clock
from sim.costmodel.base import StepShape, make_cost_model
from sim.costmodel.profile import load_profile
from sim.specs.hardware import HARDWARE_PRESETS
from tests.sim.profile_header import cpu_profile_header

TINY = get_model_preset("tiny-llama")
CPU = HARDWARE_PRESETS["CPU-1T"]


def _v3(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        **cpu_profile_header(3),
        "decode_attention_context": "max",
        "timer": "thread_cpu",
        "decode_attention_checks": [
            {"context_tokens": [100, 1000], "time_s": 0.02, "predicted_mean_s": 0.011},
        ],
        "ops": {"linear": {"num_tokens": [1, 100], "time_s": [1e-4, 1e-3]}},
    }
    data.update(changes)
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def test_version_3_reads_the_timer_and_the_checks(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, _v3()))
    assert profile.format_version == 3
    assert profile.timer == "thread_cpu"
    (check,) = profile.decode_attention_checks
    assert check.context_tokens == (100, 1000)
    assert (check.time_s, check.predicted_mean_s, check.predicted_max_s) == (0.02, 0.011, None)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"timer": "sundial"}, "field 'timer': must be one of"),
        ({"decode_attention_checks": {}}, "field 'decode_attention_checks': expected list"),
        (
            {"decode_attention_checks": [{"context_tokens": [0, 5], "time_s": 1.0}]},
            r"field 'decode_attention_checks\[0\].context_tokens': expected positive integers",
        ),
        (
            {"decode_attention_checks": [{"context_tokens": [5, 6]}]},
            r"field 'decode_attention_checks\[0\].time_s': missing",
        ),
    ],
)
def test_bad_version_3_fields_name_the_field(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        load_profile(_write(tmp_path, _v3(**changes)))


def test_version_2_ignores_the_version_3_keys(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, _v3(format_version=2, timer="sundial")))
    assert (profile.timer, profile.decode_attention_checks) == ("unknown", ())
    per_sequence = _v3(format_version=2, decode_attention_context="per_sequence")
    with pytest.raises(ValueError, match="field 'decode_attention_context': must be one of"):
        load_profile(_write(tmp_path, per_sequence))


def _check(contexts: list[int], kernel: Any) -> dict[str, Any]:
    short, long = min(contexts), max(contexts)
    mean = round(sum(contexts) / len(contexts))
    at = {"short": short, "long": long, "mean": mean}
    return {
        "context_tokens": contexts,
        "time_s": kernel(contexts),
        "uniform_time_s": {k: kernel([c] * len(contexts)) for k, c in at.items()},
        "uniform_context_tokens": at,
    }


@pytest.mark.parametrize(
    ("kernel", "rule"),
    [
        # Each sequence's own context, cost linear in it: the mean context prices it.
        (lambda contexts: 1e-5 * sum(contexts), "mean"),
        # Padded to the longest context.
        (lambda contexts: 1e-5 * len(contexts) * max(contexts), "max"),
        # Each sequence's own context, cost growing faster than linearly (leaving a cache).
        (lambda contexts: 1e-8 * sum(c * c for c in contexts), "per_sequence"),
    ],
)
def test_the_rule_that_fits_the_skewed_batches_is_chosen(kernel: Any, rule: str) -> None:
    checks = [_check(b, kernel) for b in ([100, 100, 1000, 1000], [16, 16, 16, 256, 256, 256])]
    chosen, scored = choose_decode_rule(checks)
    assert chosen == rule
    # 2 x 100 + 2 x 1000 tokens: the mean context is 550, the longest 1000.
    first = scored[0]
    assert first["predicted_mean_s"] == pytest.approx(kernel([550] * 4))
    assert first["predicted_max_s"] == pytest.approx(kernel([1000] * 4))
    assert first["predicted_per_sequence_s"] == pytest.approx(
        (kernel([100] * 4) + kernel([1000] * 4)) / 2
    )
    assert first[f"predicted_{rule}_s"] == pytest.approx(first["time_s"])


def test_per_sequence_prices_each_context_in_the_batch(tmp_path: Path) -> None:
    ops = {
        "decode_attention": {
            "num_seqs": [1, 4],
            "context_tokens": [100, 1000],
            "time_s": [[1e-3, 1e-2], [4e-3, 4e-2]],
        }
    }
    costs = {}
    for rule in ("mean", "max", "per_sequence"):
        path = _write(tmp_path, _v3(decode_attention_context=rule, ops=ops))
        cost = make_cost_model(TINY, CPU, profile_path=path, block_size=16)
        shape = StepShape(decode_context_tokens=(100, 100, 100, 1000))
        costs[rule] = cost.step_breakdown(shape)["decode_attention"] / TINY.num_layers
    # Linear between grid points: (1/4) * (3 * T(4, 100) + T(4, 1000)) = the mean's (325).
    assert costs["per_sequence"] == pytest.approx((3 * 4e-3 + 4e-2) / 4)
    assert costs["mean"] == pytest.approx(4e-3 + (325 - 100) / 900 * 3.6e-2)
    assert costs["max"] == pytest.approx(4e-2)


def test_auto_clock_is_cpu_time_only_where_it_measures_the_run() -> None:
    assert resolve_clock("auto", "cpu", 1) == "cpu"
    assert resolve_clock("auto", "cpu", 0) == "wall"
    assert resolve_clock("auto", "cuda", 1) == "wall"
    assert resolve_clock("wall", "cpu", 1) == "wall"
    with pytest.raises(ValueError, match="clock must be one of"):
        resolve_clock("sundial", "cpu", 1)


def test_step_overhead_is_fitted_per_sequence_on_decode_only_steps(tmp_path: Path) -> None:
    bare = make_cost_model(TINY, CPU, profile_path=_write(tmp_path, _v3()), block_size=16)

    def parts(shape: StepShape) -> float:
        return sum(bare.step_terms(shape)) - bare.step_breakdown(shape)["overhead"]

    steps = []
    for n in (1, 2, 4, 8, 8, 16):
        contexts = [64 + 10 * i for i in range(n)]
        shape = StepShape(decode_context_tokens=tuple(contexts))
        measured = parts(shape) + 5e-3 + 1e-3 * n
        if n == 2:
            measured += 0.5  # one step slowed by load: a robust fit ignores it
        steps.append(_step([], contexts, measured))
    prefill = StepShape(prefill_chunks=((256, 0),))
    # A prefill whose tables are far off must not move the overhead.
    steps.append(_step([[256, 0]], [], parts(prefill) + 1.0))
    fitted = make_cost_model(
        TINY, CPU, profile_path=_write(tmp_path, _v3(steps=steps)), block_size=16
    )
    for n in (1, 3, 32):
        shape = StepShape(decode_context_tokens=(100,) * n)
        assert fitted.step_breakdown(shape)["overhead"] == pytest.approx(5e-3 + 1e-3 * n)
    # With decode-only steps of one batch size only: the median residual as the fixed part, and
    # the roofline's per-sequence overhead as before.
    one_size = [s for s in steps if s["num_decode_seqs"] == 8]
    flat = make_cost_model(
        TINY, CPU, profile_path=_write(tmp_path, _v3(steps=one_size)), block_size=16
    )
    shape = StepShape(decode_context_tokens=(100,) * 3)
    per_seq = bare.fallback.config.per_sequence_overhead_s  # type: ignore[attr-defined]
    assert flat.step_breakdown(shape)["overhead"] == pytest.approx(5e-3 + 8e-3 + 3 * per_seq)


def _step(chunks: list[list[int]], contexts: list[int], measured_s: float) -> dict[str, Any]:
    return {
        "prefill_chunks": chunks,
        "num_decode_seqs": len(contexts),
        "sum_decode_context_tokens": sum(contexts),
        "decode_context_tokens": contexts,
        "measured_s": measured_s,
    }


def test_prefill_attention_is_interpolated_per_query_token(tmp_path: Path) -> None:
    def kernel(new: float, context: float) -> float:  # causal: new x (new / 2 + context)
        return 1e-8 * new * (new / 2 + context)

    queries, contexts = [16, 256, 1024], [0, 1024]
    ops = {
        "prefill_attention": {
            "num_query_tokens": queries,
            "num_context_tokens": contexts,
            "time_s": [[kernel(q, c) for c in contexts] for q in queries],
        }
    }
    cost = make_cost_model(TINY, CPU, profile_path=_write(tmp_path, _v3(ops=ops)), block_size=16)

    def priced(new: int, context: int) -> float:
        shape = StepShape(prefill_chunks=((new, context),))
        return cost.step_breakdown(shape)["prefill_attention"] / TINY.num_layers

    for new, context in ((640, 0), (640, 512), (100, 1024), (1024, 300)):
        assert priced(new, context) == pytest.approx(kernel(new, context))
    # A straight line between the timed lengths would have said 36% more at 640 tokens.
    chord = kernel(256, 0) + (640 - 256) / (1024 - 256) * (kernel(1024, 0) - kernel(256, 0))
    assert chord == pytest.approx(1.36 * kernel(640, 0), rel=0.01)
    assert priced(8, 0) == pytest.approx(kernel(16, 0))  # below the first length: its time
    assert priced(2048, 0) == pytest.approx(2 * kernel(1024, 0))  # past the edge: its rate
