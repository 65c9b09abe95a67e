"""Profile format version 3: the timer the profile was taken with, and skewed decode batches
that choose whether decode attention is priced at a batch's mean or its longest context;
versions 1 and 2 still read, and bad v3 fields are errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.calibrate import choose_decode_rule, resolve_clock
from sim.profile import Table2D, load_profile

# 1 ms per sequence per 100 tokens of context, linear: a kernel reading each sequence's own
# context costs sum(contexts) * 1e-5 s, one padded to the longest n * max(contexts) * 1e-5 s.
TABLE = Table2D((1.0, 4.0), (100.0, 1000.0), ((1e-3, 1e-2), (4e-3, 4e-2)))


def _v3(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": 3,
        "device": {"name": "cpu (x86_64)", "driver": "none"},
        "software": {"torch": "2.13.0", "triton": "3.7.1", "cuda": "none"},
        "command": "python -m sim calibrate --model tiny-llama --device cpu --out p.json",
        "model": "tiny-llama",
        "tp": 1,
        "block_size": 16,
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


@pytest.mark.parametrize(
    ("kernel", "rule"),
    [
        (lambda contexts: 1e-5 * sum(contexts), "mean"),
        (lambda contexts: 1e-5 * len(contexts) * max(contexts), "max"),
    ],
)
def test_the_rule_that_fits_the_skewed_batches_is_chosen(kernel: Any, rule: str) -> None:
    batches = [[100, 100, 1000, 1000], [100, 1000], [100, 100, 100, 1000]]
    checks = [{"context_tokens": b, "time_s": kernel(b)} for b in batches]
    chosen, scored = choose_decode_rule(TABLE, checks)
    assert chosen == rule
    # 2 x 100 + 2 x 1000 tokens: the mean (550) prices 4 x 5.5 ms, the longest 4 x 10 ms.
    assert scored[0]["predicted_mean_s"] == pytest.approx(0.022)
    assert scored[0]["predicted_max_s"] == pytest.approx(0.04)
    assert scored[0][f"predicted_{rule}_s"] == pytest.approx(kernel(batches[0]))


def test_auto_clock_is_cpu_time_only_where_it_measures_the_run() -> None:
    assert resolve_clock("auto", "cpu", 1) == "cpu"
    assert resolve_clock("auto", "cpu", 0) == "wall"
    assert resolve_clock("auto", "cuda", 1) == "wall"
    assert resolve_clock("wall", "cpu", 1) == "wall"
    with pytest.raises(ValueError, match="clock must be one of"):
        resolve_clock("sundial", "cpu", 1)
