"""``sim calibrate`` and ``sim validate`` end to end on CPU with tiny-llama: a small-grid
calibration writes a profile that loads; validating a 20-request trace writes validation.json
whose per-request rows join one to one with the engine run, and ``--replay`` redoes the
comparison from the saved run without the engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from core.model.presets import get_model_preset
from fidelity.host_speed import SETTLE_STEPS, fit_prepare
from fidelity.profile_check import compare_profiles
from fidelity.profile_diff import VERDICTS
from records.step_shapes import load_step_shapes
from sim.cli.main import main as sim_main
from sim.costmodel.base import StepShape, make_cost_model
from sim.costmodel.profile import load_profile
from sim.specs.hardware import HARDWARE_PRESETS


@pytest.fixture(scope="module")
def small_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calibrate") / "profile.json"
    argv = ["calibrate", "--model", "tiny-llama", "--device", "cpu", "--small-grid"]
    assert sim_main([*argv, "--out", str(path), "--quiet"]) == 0
    return path


def test_small_calibration_writes_a_profile_that_loads(small_profile: Path) -> None:
    profile = load_profile(small_profile)
    assert (profile.format_version, profile.model, profile.block_size) == (5, "tiny-llama", 16)
    # The step grid's whole steps (prefills and decodes) are there, and the terms fit to them.
    assert profile.step_fit == "joint"
    assert any(s.prefill_chunks for s in profile.steps)
    assert any(not s.prefill_chunks and s.num_decode_seqs == 2 for s in profile.steps)
    assert profile.timer == "thread_cpu"  # a CPU with one torch thread: the thread's CPU time
    # Each step keeps the runner's input preparation: the host a run is measured against.
    assert all(s.prepare_s is not None and s.prepare_s > 0 for s in profile.steps)
    # The kernel checks choose the rule that fits the skewed check points better
    # (fidelity.calibrate); where the profile has enough skewed whole steps, the rule is the one
    # its fitted model fits them best under, the checks' choice kept beside it
    # (fidelity.decode_rule).
    (check,) = profile.decode_attention_checks
    assert check.context_tokens == (16, 16, 128, 128)
    errors = {
        rule: abs(getattr(check, f"predicted_{rule}_s") - check.time_s) / check.time_s
        for rule in ("mean", "max", "per_sequence")
    }
    by_steps = json.loads(small_profile.read_text()).get("decode_attention_rule")
    checks_chose = by_steps["kernel_checks_chose"] if by_steps else profile.decode_attention_context
    assert errors[checks_chose] == min(errors.values())
    if by_steps:
        residuals = by_steps["median_abs_residual"]
        assert residuals[profile.decode_attention_context] == min(residuals.values())
    assert {"linear", "elementwise", "decode_attention", "prefill_attention", "store_kv"} <= set(
        profile.ops
    )
    assert {"lm_head", "copy_blocks", "swap_out", "swap_in", "prepare"} <= set(profile.ops)
    assert profile.steps and all(s.measured_s > 0 for s in profile.steps)
    assert profile.device["name"].startswith("cpu")
    raw = json.loads(small_profile.read_text())
    assert raw["grid"]["num_tokens"] == [1, 16, 128]
    assert "calibrate" in raw["command"]
    # Version 5: each table point's spread, each whole step's spread, host part and residual,
    # the engine kind, what the tables time, and the commit.
    assert len(raw["ops"]["linear"]["spread_s"]) == len(raw["ops"]["linear"]["time_s"])
    assert profile.spreads["decode_attention"] and profile.tables_time == "span"
    grid_steps = [s for s in profile.steps if s.spread_s is not None]
    assert grid_steps and all(s.host_s is not None and s.host_s >= 0 for s in grid_steps)
    assert len(raw["step_residuals"]) == len(raw["steps"]) and raw["step_spread"] >= 0
    assert raw["engine"]["kind"] == "servesim-eager"
    assert "commit" in raw
    # The mixed step: a prompt arriving half-way through a group's decodes.
    assert any(s.prefill_chunks and s.num_decode_seqs for s in grid_steps)
    cost = make_cost_model(
        get_model_preset("tiny-llama"),
        HARDWARE_PRESETS["CPU-1T"],
        profile_path=small_profile,
        block_size=16,
    )
    assert cost.step_time_s(StepShape(prefill_chunks=((16, 0),))) > 0


def test_calibrating_twice_reports_how_far_the_profiles_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    argv = ["calibrate", "--small-grid", "--repeat", "2", "--out", str(out), "--quiet"]
    assert sim_main(argv) == 0
    printed = capsys.readouterr().out
    assert out.exists() and (tmp_path / "p-repeat2.json").exists()
    report = json.loads((tmp_path / "p-repeats.json").read_text())
    (pair,) = report["pairs"]
    assert pair["profile"].endswith("p-repeat2.json")
    assert 0 <= pair["median_pct"] <= pair["p90_pct"]
    assert len(report["step_spread_pct"]) == 2
    # Where they differ: the raw tables and whole steps, and a verdict, printed too.
    where = pair["where"]
    assert where["verdict"] in VERDICTS and where["steps"]["all"]["n"] > 0
    assert "table linear" in printed and f"verdict ({where['verdict']})" in printed
    # And on one host: the second's measured against the first's from their preparation.
    assert 0.5 < pair["one_host"]["host_slowdown"] < 2.0
    assert "on one host: its host ran" in printed


def _on_a_slower_host(profile: Path, out: Path, slowdown: float) -> Path:
    """``profile`` as a CPU calibration on a host ``slowdown`` times slower would have timed it:
    every table point, whole step and preparation stretched alike."""
    raw = json.loads(profile.read_text())
    for table in raw["ops"].values():
        for key in ("time_s", "spread_s"):
            if key in table:
                table[key] = np.multiply(table[key], slowdown).tolist()
    for step in raw["steps"]:
        for key in ("measured_s", "spread_s", "host_s", "prepare_s"):
            if step.get(key) is not None:
                step[key] *= slowdown
    out.write_text(json.dumps(raw))
    return out


def test_two_calibrations_are_compared_on_one_host(small_profile: Path, tmp_path: Path) -> None:
    # A CPU calibration's steps and their input preparation are both on the thread's CPU clock.
    raw = json.loads(small_profile.read_text())
    assert raw["engine"]["prepare_clock"] == raw["engine"]["clock"] == "cpu"
    slow = _on_a_slower_host(small_profile, tmp_path / "slow.json", 1.4)
    (pair,) = compare_profiles([small_profile, slow])["pairs"]
    assert pair["median_pct"] == pytest.approx(40, abs=1)  # as they are: the host's 1.4x
    one = pair["one_host"]
    assert one["host_slowdown"] == pytest.approx(1.4, rel=1e-6)
    assert one["median_pct"] < 0.5 and one["p90_pct"] < 0.5  # priced back on the first's host
    # A calibration from before 2026-11-28 (its preparation on the wall clock, its steps on
    # the CPU clock) is not compared on one host, and says why.
    del raw["engine"]["prepare_clock"]
    (tmp_path / "old.json").write_text(json.dumps(raw))
    (pair,) = compare_profiles([small_profile, tmp_path / "old.json"])["pairs"]
    assert "input preparation on the wall clock" in pair["one_host"]["error"]


def _trace(path: Path) -> Path:
    rows = ["request_id,arrival_s,prompt_tokens,output_tokens,num_samples"]
    rows += [f"q{i},{0.01 * i:.3f},{8 + 3 * i},{2 + i % 4},1" for i in range(20)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_validate_joins_one_to_one_and_replays(
    tmp_path: Path, small_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "trace.csv")
    out, html = tmp_path / "val", tmp_path / "val.html"
    argv = ["validate", str(trace), "--policy", "continuous", "--profile", str(small_profile)]
    assert sim_main([*argv, "--out", str(out), "--report", str(html), "--quiet"]) == 0
    result = json.loads((out / "validation.json").read_text())
    engine = pd.read_csv(out / "engine" / "requests.csv")
    assert set(result["models"]) == {"calibrated", "roofline"}
    # The engine prepares a step only after the last one ends: the simulation must not overlap.
    assert result["sim_config"]["async_scheduling"] is False
    # The engine packs a batch's real rows: no padding is priced.
    assert result["cost_config"]["price_padding"] is False
    for model in result["models"].values():
        rows = model["requests"]["rows"]
        assert len(rows) == 20
        assert sorted(r["request_id"] for r in rows) == sorted(engine["request_id"].astype(str))
        by_id = {str(r.request_id): r for r in engine.itertuples()}
        for row in rows:
            assert row["ttft_meas"] == pytest.approx(by_id[row["request_id"]].ttft_ms)
        steps = load_step_shapes(out / "engine" / "step_shapes.jsonl")
        assert (
            len(model["steps"]["rows"])
            == len(steps)
            == len(pd.read_csv(out / "engine" / "steps.csv"))
        )
        assert model["divergence"]["num_identical_steps"] >= 1  # the first batch is the same
        # The TTFT error beside the per-request one: the distribution's and its split.
        assert model["ttft_distribution"]["n"] == 20
        split = model["ttft_wait_split"]
        assert split["ttft_pct"] == pytest.approx(
            model["requests"]["metrics"]["ttft"]["median_abs_pct"]
        )
        assert set(model["steps"]["by_phase"]) == {"early", "rest"}
    floor = result["ttft_phase_floor"]
    assert floor["n"] == 20 and floor["median_pct"] <= floor["expected_pct"] * 1.5
    assert "Validation against the engine" in html.read_text()

    again = tmp_path / "again"
    replay = ["--replay", str(out / "engine"), "--out", str(again), "--quiet"]
    assert sim_main([*argv, *replay]) == 0
    assert not (again / "engine").exists()
    second = json.loads((again / "validation.json").read_text())
    first_rows = result["models"]["calibrated"]["requests"]["rows"]
    assert second["models"]["calibrated"]["requests"]["rows"] == first_rows
    assert second["engine_kind"] == "servesim-eager"
    assert second["models"]["calibrated"]["divergence"]["why"]["reason"] in (
        "identical",
        "length",
        "arrival",
        "scheduling",
    )

    # No TRACE: the run's own (from its command); a second --replay gives the engine's floor.
    floor = tmp_path / "floor"
    twice = ["--replay", str(out / "engine"), "--replay", str(out / "engine")]
    policy = ["--policy", "continuous", "--profile", str(small_profile)]
    assert sim_main(["validate", *policy, *twice, "--out", str(floor), "--quiet"]) == 0
    third = json.loads((floor / "validation.json").read_text())
    assert third["models"]["calibrated"]["requests"]["rows"] == first_rows
    metrics = third["engine_floor"]["requests"]["metrics"]
    assert metrics["tpot"]["median_abs_pct"] == 0.0  # a run against itself
    # The run's host against itself, from its own preparation, fitted and priced. How many
    # steps 20 short requests take depends on the machine's speed (a slow one batches more of
    # them): too few to measure a host speed is said, with the count.
    speed = third["engine_floor"]["host_speed"]
    shapes = load_step_shapes(out / "engine" / "step_shapes.jsonl")
    try:  # (a CPU's engine: the decode steps settled after a prefill are the probes)
        table = fit_prepare(shapes, settle=SETTLE_STEPS)
    except ValueError as error:  # (too few settled decode-only steps at a batch size seen 3x)
        assert str(error).split(": ", 1)[1] in speed  # (the count, said)
        against = result["host_speed"]
        assert "slowdown" in against or "a host speed needs >= 16" in against["error"]
    else:
        assert speed["slowdown"] == pytest.approx(1.0)  # (a run against itself reads 1)
        assert 0 < speed["num_steps"] <= table.num_steps
        # The run's host against the calibration's, from their input preparation, each timed
        # on the clock its steps are (here both on the thread's CPU clock) ...
        assert 0.5 < result["host_speed"]["slowdown"] < 2.0
    assert result["host_speed"]["applied"] == 1.0
    # ... but a run whose preparation is on another clock than its steps (every run on the CPU
    # clock recorded before 2026-11-28) measures no host: --host-slowdown measured is refused.
    old = tmp_path / "old-engine"
    shutil.copytree(out / "engine", old)
    summary = json.loads((old / "summary.json").read_text())
    assert summary["clock"] == summary.pop("prepare_clock") == "cpu"
    (old / "summary.json").write_text(json.dumps(summary))
    on_own = tmp_path / "own"
    argv_own = [*argv, "--host-slowdown", "measured", "--quiet"]
    assert sim_main([*argv_own, "--replay", str(old), "--out", str(on_own)]) == 2
    assert "input preparation on the wall clock" in capsys.readouterr().err
    # Measured and priced at, on either clock (the same machine, moments apart): three requests
    # of 48 tokens make at least 24 decode-only steps settled after the last prefill (the
    # probe's steps), at the batch sizes the small grid measured (1-3), on any machine. A run
    # on the wall clock against the calibration on the CPU clock: each side's preparation is
    # on its own steps' clock.
    long_trace = tmp_path / "long.csv"
    long_trace.write_text(
        "request_id,arrival_s,prompt_tokens,output_tokens,num_samples\n"
        + "".join(f"l{i},{0.01 * i:.2f},{16 + 8 * i},48,1\n" for i in range(3))
    )
    for clock in ("cpu", "wall"):
        own_argv = ["validate", str(long_trace), "--policy", "continuous"]
        own_argv += ["--profile", str(small_profile), "--host-slowdown", "measured"]
        own_dir = tmp_path / f"own-{clock}"
        assert sim_main([*own_argv, "--clock", clock, "--out", str(own_dir), "--quiet"]) == 0
        own = json.loads((own_dir / "validation.json").read_text())
        assert own["engine_clock"] == clock
        speed = own["host_speed"]
        assert 0.5 < speed["slowdown"] < 2.0 and speed["num_steps"] >= 24
        assert speed["applied"] == pytest.approx(speed["slowdown"])
        assert own["cost_config"]["host_slowdown"] == speed["applied"]

    # On a host 1.5x slower: a CPU profile's whole step is the host's, so every step is longer.
    slow = tmp_path / "slow"
    argv_slow = ["validate", *policy, "--replay", str(out / "engine"), "--host-slowdown", "1.5"]
    assert sim_main([*argv_slow, "--out", str(slow), "--quiet"]) == 0
    fourth = json.loads((slow / "validation.json").read_text())
    assert fourth["cost_config"]["host_slowdown"] == 1.5
    first = [pd.read_csv(run / "sim-calibrated" / "steps.csv").iloc[0] for run in (floor, slow)]
    assert first[1]["num_prefill_tokens"] == first[0]["num_prefill_tokens"]  # (the same step)
    assert first[1]["duration_s"] == pytest.approx(1.5 * first[0]["duration_s"])


def test_validate_refuses_a_run_of_other_requests(
    tmp_path: Path, small_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "trace.csv")
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"summary": {}, "config": {}}')
    argv = ["validate", str(trace), "--profile", str(small_profile), "--replay", str(run)]
    assert sim_main([*argv, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_validate_frees_its_engine_before_calibrating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without --profile, validate replays the trace on one engine and then calibrates on
    # another: on CUDA, the replay's engine still alive made the calibration's memory
    # profiling find no room for a KV cache.
    from engine import profiling
    from tests.engine.engine_lifetimes import engine_lifetimes

    monkeypatch.setattr(profiling, "CalibrationGrid", lambda: profiling.SMALL_GRID)
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "request_id,arrival_s,prompt_tokens,output_tokens,num_samples\n"
        + "".join(f"q{i},0.0,{8 + i},3,1\n" for i in range(4))
    )
    with engine_lifetimes(monkeypatch) as built:
        argv = ["validate", str(trace), "--out", str(tmp_path / "val"), "--quiet"]
        assert sim_main(argv) == 0
    # Two engines, the replay's then the calibration's, each built with no other alive.
    assert built.alive_at_build == [0, 0]


def test_a_profile_with_late_timed_calls_is_warned_of(tmp_path: Path) -> None:
    from fidelity.cli.calibrate import late_timer_warning

    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"engine": {"timer_calls": "1260", "timer_late": "3"}}))
    warning = late_timer_warning(path)
    assert warning is not None and str(path) in warning and "3 of 1260" in warning
    path.write_text(json.dumps({"engine": {"timer_calls": "1260", "timer_late": "0"}}))
    assert late_timer_warning(path) is None
    path.write_text(json.dumps({"engine": {"kind": "servesim-eager"}}))  # (a CPU profile)
    assert late_timer_warning(path) is None
