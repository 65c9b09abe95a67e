"""Where two calibrations differ (``fidelity.profile_diff``): each verdict on small handmade
profiles whose difference is known, and on the two recorded H200 calibrations (``shared``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fidelity.profile_diff import VERDICTS, describe, profile_differences
from sim.costmodel.profile import Profile, load_profile
from tests.sim.profile_header import cpu_profile_header

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "gpu-runs" / "h200-2026-11-27"
TOKENS = [16, 64, 256, 1024]
SEQS, CONTEXTS = [1, 4, 16], [128, 1024]


def _profile(
    tmp_path: Path,
    name: str,
    table_scale: float = 1.0,
    spread: float | None = None,
    decode_scale: float = 1.0,
    prefill_scale: float = 1.0,
    host_scale: float | None = None,
    extra_point: bool = False,
    prepare_scale: float | None = None,
) -> Profile:
    """A version 5 profile: a linear and a decode-attention table (times scaled by
    ``table_scale``, each point's spread ``spread`` of its time), and whole steps: decode-only
    ones scaled by ``decode_scale``, prefill ones by ``prefill_scale``. With ``host_scale``, each
    step stores a host part of 60% of the first profile's step, scaled by ``host_scale``, and the
    rest takes the step's scale."""
    tokens = [*TOKENS, 4096] if extra_point else TOKENS
    linear = [table_scale * 1e-5 * (1 + n / 64) for n in tokens]
    attention = [[table_scale * 1e-6 * (5 + s * c / 256) for c in CONTEXTS] for s in SEQS]
    ops: dict[str, Any] = {
        "linear": {"num_tokens": tokens, "time_s": linear},
        "decode_attention": {"num_seqs": SEQS, "context_tokens": CONTEXTS, "time_s": attention},
    }
    if spread is not None:
        ops["linear"]["spread_s"] = [spread * t for t in linear]
        ops["decode_attention"]["spread_s"] = [[spread * t for t in row] for row in attention]
    steps = []
    for i, (chunks, contexts) in enumerate(
        [([], [100]), ([], [100, 200]), ([[64, 0]], []), ([], [300] * 4), ([[32, 0]], [50])]
    ):
        base = 0.01 * (1 + i)
        scale = prefill_scale if chunks else decode_scale
        step: dict[str, Any] = {
            "prefill_chunks": chunks,
            "num_decode_seqs": len(contexts),
            "sum_decode_context_tokens": sum(contexts),
            "decode_context_tokens": contexts,
            "measured_s": base * scale,
        }
        if host_scale is not None:
            host = 0.6 * base * host_scale
            step["host_s"] = host
            step["measured_s"] = host + 0.4 * base * scale
        if prepare_scale is not None:  # the input preparation, 3% of the first profile's step
            step["prepare_s"] = 0.03 * base * prepare_scale
        steps.append(step)
    # The steps in another order: they are matched by shape, not by position.
    steps = steps[::-1] if name == "b" else steps
    data = {**cpu_profile_header(5), "ops": ops, "steps": steps}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return load_profile(path)


def test_identical_calibrations_agree(tmp_path: Path) -> None:
    a, b = _profile(tmp_path, "a"), _profile(tmp_path, "b")
    found = profile_differences(a, b)
    assert found["verdict"] == "agree"
    assert found["tables_all"]["median_abs_pct"] == pytest.approx(0.0)
    assert found["steps"]["all"] == {"n": 5, "median_pct": 0.0, "median_abs_pct": 0.0}


def test_steps_that_differ_over_agreeing_tables_name_the_host(tmp_path: Path) -> None:
    a = _profile(tmp_path, "a")
    b = _profile(tmp_path, "b", table_scale=1.01, decode_scale=1.5, prefill_scale=1.05)
    found = profile_differences(a, b)
    assert found["verdict"] == "host"
    assert "the host ran at another speed" in found["text"]
    assert found["tables"]["linear"]["median_pct"] == pytest.approx(1.0)
    assert found["tables"]["decode_attention"]["n"] == len(SEQS) * len(CONTEXTS)
    steps = found["steps"]
    assert steps["decode_only"]["n"] == 3 and steps["decode_only"]["median_pct"] == pytest.approx(
        50
    )
    assert steps["with_prefill"]["n"] == 2
    assert steps["with_prefill"]["median_pct"] == pytest.approx(5)
    assert "host" not in steps  # neither profile stores the host's part
    assert any(line.startswith("  verdict (host)") for line in describe(found))


def test_a_slower_device_part_under_the_same_host_names_the_device(tmp_path: Path) -> None:
    a = _profile(tmp_path, "a", host_scale=1.0)
    b = _profile(tmp_path, "b", decode_scale=1.5, prefill_scale=1.5, host_scale=1.0)
    found = profile_differences(a, b)
    assert found["verdict"] == "device"
    assert found["steps"]["host"]["median_pct"] == pytest.approx(0.0)
    assert found["steps"]["rest"]["median_pct"] == pytest.approx(50.0)
    # The same steps with the host's part slower instead: the host.
    c = _profile(tmp_path, "c", decode_scale=1.0, host_scale=1.5)
    assert profile_differences(a, c)["verdict"] == "host"
    # An eager engine on a GPU launches its kernels outside its measured host part: with the
    # tables (the kernels alone) agreeing, that part moving is the host's launches.
    eager = replace(a, engine={"kind": "servesim-eager"}, timer="cuda_events")
    found = profile_differences(eager, b)
    assert found["verdict"] == "host" and "its kernels and their launches" in found["text"]
    graphs = replace(a, engine={"kind": "servesim-graphs"}, timer="cuda_events")
    assert profile_differences(graphs, b)["verdict"] == "device"


def test_tables_apart_by_more_than_their_spread_are_found(tmp_path: Path) -> None:
    a = _profile(tmp_path, "a", spread=0.01)
    b = _profile(tmp_path, "b", table_scale=1.2, spread=0.01, extra_point=True)
    found = profile_differences(a, b)
    assert found["verdict"] == "tables"
    assert "by more than their spread" in found["text"] and "shifted +20.0%" in found["text"]
    assert found["tables"]["linear"]["n"] == len(TOKENS)  # only the points both measured
    assert found["tables_all"]["beyond_spread_share"] == 1.0
    # The whole steps agree, so the device did not run slower: the tables timed something else.
    assert "while the whole steps agree" in found["text"]
    assert "device ran at another speed" not in found["text"]
    # With the whole steps slower too, it did.
    c = _profile(tmp_path, "c", table_scale=1.2, spread=0.01, decode_scale=1.2, prefill_scale=1.2)
    slower = profile_differences(a, c)
    assert slower["verdict"] == "tables" and "device ran at another speed" in slower["text"]


def test_tables_apart_within_their_spread_are_called_noisy(tmp_path: Path) -> None:
    a = _profile(tmp_path, "a", spread=0.15)
    b = _profile(tmp_path, "b", table_scale=1.2, spread=0.15)
    found = profile_differences(a, b)
    assert found["verdict"] == "noisy"
    assert found["tables_all"]["beyond_spread_share"] == 0.0
    assert found["verdict"] in VERDICTS


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.exists(), reason=f"{SHARED} is not there")
def test_the_recorded_calibrations_differ_in_the_host() -> None:
    cal1, cal2 = (
        load_profile(SHARED / "profiles" / f"llama-3-8b-h200-{n}.json") for n in ("cal1", "cal2")
    )
    found = profile_differences(cal1, cal2)
    assert found["verdict"] == "host" and "host ran at another speed" in found["text"]
    assert found["tables"]["linear"]["median_abs_pct"] < 2
    assert found["tables_all"]["median_abs_pct"] < 5
    steps = found["steps"]
    assert steps["all"]["n"] == 319
    assert steps["decode_only"]["median_pct"] > 40 > steps["with_prefill"]["median_pct"]


def test_data_that_agree_with_predictions_apart_blame_the_fit() -> None:
    """with_predictions: an ``agree`` verdict whose models predict the same steps more than 5%
    apart becomes ``fit``, naming the coefficients that moved; anything else is left alone."""
    from fidelity.profile_diff import with_predictions

    agree = {"verdict": "agree", "text": "the op tables differ by 2.9%; ...: the two agree"}
    fitted = (
        {"decode_attention_scale": 1.02, "per_seq_overhead_s": 1.9e-4, "token_scale": 0.93},
        {"decode_attention_scale": 1.83, "per_seq_overhead_s": 1.0e-4, "token_scale": 0.93},
    )
    found = with_predictions(agree, 7.5, fitted, (13.9, 10.2))
    assert found["verdict"] == "fit" and found["verdict"] in VERDICTS
    assert "13.9% and 10.2% around its own steps" in found["text"]
    assert (
        "7.5% apart" in found["text"]
        and "decode_attention_scale 1.02 against 1.83" in found["text"]
    )
    assert "token_scale" not in found["text"]  # it did not move
    assert with_predictions(agree, 4.0, fitted) is agree
    host = {"verdict": "host", "text": "..."}
    assert with_predictions(host, 9.0, fitted) is host


def test_the_two_hosts_speed_is_read_from_the_steps_preparation(tmp_path: Path) -> None:
    a = _profile(tmp_path, "a", prepare_scale=1.0)
    b = _profile(tmp_path, "b", decode_scale=1.3, prefill_scale=1.1, prepare_scale=1.25)
    found = profile_differences(a, b)
    assert found["steps"]["prepare"]["n"] == 5
    assert found["steps"]["prepare"]["median_pct"] == pytest.approx(25)
    assert any(line.startswith("  steps prepare") and "+25.0%" in line for line in describe(found))
    # Profiles from before 2026-11-28 store no preparation: nothing is said of it.
    assert "prepare" not in profile_differences(_profile(tmp_path, "a"), b)["steps"]
