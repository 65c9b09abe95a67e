"""What the GPU check reads from each part's folder: on the recorded H200 runs of
``../shared/gpu-runs`` (the engine against itself gives the README's table back), on a pytest
log, and on the decode profile and ``bench_engine`` JSON that this machine's CPU writes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from core.settings import build

pytest.importorskip("torch")

from engine.gpu_check import figures
from engine.llm_engine import EngineConfig, LLMEngine
from engine.profiling import decode

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT.parent / "shared" / "gpu-runs" / "h200-2026-11-27"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"recorded GPU runs not found at {path}")
    return path


@pytest.mark.shared
@pytest.mark.parametrize(
    ("first", "second", "ttft", "tpot", "e2e"),
    [(1, 2, 22.7, 21.6, 21.5), (2, 3, 16.9, 5.5, 5.5), (3, 4, 13.2, 4.2, 4.1)],
)
def test_the_engine_against_itself_gives_the_readmes_table(
    tmp_path: Path, first: int, second: int, ttft: float, tpot: float, e2e: float
) -> None:
    runs = _need(H200 / "engine-runs")
    for name, index in (("run1", first), ("run2", second)):
        (tmp_path / name).mkdir()
        shutil.copy(runs / f"example-chunked-run{index}" / "requests.csv", tmp_path / name)
    found = figures.engine_against_itself(tmp_path)
    assert found["requests_compared"] == 200
    assert round(found["median_abs_diff_ttft_pct"], 1) == ttft
    assert round(found["median_abs_diff_tpot_pct"], 1) == tpot
    assert round(found["median_abs_diff_e2el_pct"], 1) == e2e


@pytest.mark.shared
def test_a_recorded_validation_and_kernel_sweep_are_read(tmp_path: Path) -> None:
    recorded = _need(H200 / "validation" / "example-chunked-run2-cal1.json")
    shutil.copy(recorded, tmp_path / "validation.json")
    found = figures.validation(tmp_path)
    # The README's table: example, chunked, run2 against cal1.
    calibrated = [round(found["calibrated"][k], 1) for k in ("ttft", "tpot", "e2e", "steps")]
    assert calibrated == [21.0, 8.0, 8.2, 4.9]
    assert set(found) == {"calibrated", "roofline"}
    shutil.copy(H200 / "kernels_bench.json", tmp_path / "kernels_bench.json")
    bench = figures.kernels_bench(tmp_path)
    assert bench["copy_bandwidth_gbs"] == 4245.65
    assert bench["rows"] > 20 and 0 < bench["verdicts_failed"] < bench["verdicts"]
    assert any("decode" in failed and "batch" in failed for failed in bench["failed"])


def test_pytest_counts_are_summed_over_the_parts_runs(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text(
        "$ python -m pytest -m gpu\n....F.\n3 passed in a docstring\n"
        "=== 2 failed, 71 passed, 3 skipped, 1 error in 49.46s ===\n"
        "$ python -m pytest -m gpu_memory\n"
        "FAILED tests/engine/test_gpu_memory.py::test_x - 1 failed in disguise\n"
        "1 failed, 3 passed, 900 deselected in 20.10s\n"
    )
    assert figures.pytest_counts(tmp_path) == {
        "failed": 3, "passed": 74, "skipped": 3, "error": 1, "deselected": 900,
    }  # fmt: skip
    (tmp_path / "log.txt").write_text("ImportError: no module named triton\n")
    with pytest.raises(ValueError, match="no pytest summary line"):
        figures.pytest_counts(tmp_path)
    # Every gpu test skipped (no CUDA, or the kernels interpreted) is not a pass.
    (tmp_path / "log.txt").write_text("74 skipped, 900 deselected in 9.1s\n")
    with pytest.raises(ValueError, match="no test ran"):
        figures.pytest_counts(tmp_path)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(build(EngineConfig, weights="random", cpu_kv_cache_gib=0.02, max_num_seqs=8))


def test_the_decode_profile_splits_host_time(engine: LLMEngine, tmp_path: Path) -> None:
    decode.fill_decode_batch(engine, 3, 40, 6)
    profiled = decode.profile_decode_steps(engine, 3)
    decode.finish(engine)
    assert profiled["num_steps"] == 3 and profiled["num_seqs"] == 3
    host = profiled["host_ms_per_step"]
    assert {"prepare_ms", "execute_ms", "forward_ms", "update_ms"} <= set(host)
    # The forward runs inside execute; the profile on CPU counts aten ops, not kernels.
    assert 0 < host["forward_ms"] <= host["execute_ms"]
    assert profiled["forward_calls_per_step"] == 1.0
    assert profiled["cuda_kernels_per_step"] is None and profiled["cpu_ops_per_step"] > 50
    # Without a GPU there is no launch to time; the host's costliest ops are named.
    assert profiled["launch_call_us_mean"] is None
    assert profiled["forward_host_us_per_launch"] is None
    top = profiled["host_top_ops"]
    assert len(top) == decode.HOST_TOP_OPS and any(name.startswith("aten::") for name in top)
    assert list(top.values()) == sorted(top.values(), reverse=True) and min(top.values()) > 0
    (tmp_path / "eager.json").write_text(json.dumps({"batches": {"3": profiled}}))
    read = figures.decode_profiles(tmp_path)["eager_b3"]
    assert read["kernels_per_step"] is None and read["host_ms"]["forward_ms"] > 0
    assert read["launch_call_us"] is None and len(read["host_top_ops_us"]) == decode.HOST_TOP_OPS


def test_a_decode_batch_the_cache_cannot_hold_is_refused(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match="KV blocks"):
        decode.fill_decode_batch(engine, 8, 4000, 10)
    assert not engine.has_unfinished()


@pytest.mark.slow
def test_bench_engine_writes_its_figures_as_json(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_engine
    finally:
        sys.path.pop(0)
    out = tmp_path / figures.BENCH_ENGINE_FILE
    argv = [
        "--batches", "1", "--contexts", "32", "--prefill-tokens", "32", "--repeats", "2",
        "--step-batches", "1,2", "--step-contexts", "32", "--sections", "decode,prefill,steps",
        "--json", str(out),
    ]  # fmt: skip
    assert bench_engine.main(argv) == 0
    data = json.loads(out.read_text())
    assert [(r["batch"], r["context"]) for r in data["steps"]] == [(1, 32), (2, 32)]
    assert data["environment"]["cuda_graphs"] is False and "trace" not in data
    read = figures.bench_engine(tmp_path)
    assert set(read["steps_ms"]) == {"b1x32", "b2x32"} and read["decode_share_pct"] == {
        "b1x32": None
    }


def test_the_calibration_figures_give_the_host_terms_in_microseconds(tmp_path: Path) -> None:
    # The GPU check's own calibration on the H200 (benchmarks/results/gpu-h200-2026-11-27).
    calibration = ROOT / "benchmarks/results/gpu-h200-2026-11-27/call2/calibrate"
    shutil.copy(calibration / "profile.json", tmp_path / "profile.json")
    read = figures.calibration(tmp_path)
    assert "timer_holds" not in read  # (timed before the holds were checked)
    host = read["host"]
    assert host["layer_us"] == pytest.approx(372.2, abs=0.1)
    assert host["attention_launch_us"] == pytest.approx(16.5, abs=0.1)
    assert host["stall_share"] == pytest.approx(0.14, abs=0.01) and host["cuda_graphs"] is True
    assert "layer_s" not in host
    # Its repeats (this call's pair stored no preparation times: nothing said of the hosts).
    shutil.copy(calibration / "profile-repeats.json", tmp_path / "profile-repeats.json")
    read = figures.calibration(tmp_path)
    assert len(read["profiles_differ_median_pct"]) == 1
    assert "host_prepare_differ_pct" not in read
    repeats = json.loads((tmp_path / "profile-repeats.json").read_text())
    for pair in repeats["pairs"]:
        pair["where"]["steps"]["prepare"] = {"n": 300, "median_pct": 12.345, "median_abs_pct": 13}
    (tmp_path / "profile-repeats.json").write_text(json.dumps(repeats))
    assert figures.calibration(tmp_path)["host_prepare_differ_pct"] == [12.35]
    assert "profiles_differ_one_host_median_pct" not in figures.calibration(tmp_path)
    # And the two once the later one is priced back on the first's host.
    for pair in repeats["pairs"]:
        pair["one_host"] = {"host_slowdown": 1.12345, "num_steps": 300, "median_pct": 2.345,
                            "p90_pct": 6.0}  # fmt: skip
    (tmp_path / "profile-repeats.json").write_text(json.dumps(repeats))
    read = figures.calibration(tmp_path)
    assert read["profiles_differ_one_host_median_pct"] == [2.35]
    assert read["host_slowdown_between"] == [1.12]


def test_the_decode_split_ab_is_read_from_the_kernel_rows(tmp_path: Path) -> None:
    rows = [
        {"kernel": "decode_graph", "shape": {"batch": 1}, "graph_us": 5.0, "verdicts": {}},
        {
            "kernel": "decode_split",
            "shape": {"batch": 8, "long": 2048, "short": 128, "plan_len": 8192},
            "graph_us": 9.123,
            "baseline_graph_us": 31.5,
            "verdicts": {"per_sequence<=fixed in graph": True},
        },
    ]
    (tmp_path / "kernels_bench.json").write_text(json.dumps({"rows": rows}))
    bench = figures.kernels_bench(tmp_path)
    assert bench["decode_split"] == [
        {"batch": 8, "long": 2048, "per_sequence_us": 9.12, "fixed_us": 31.5}
    ]
    assert bench["verdicts"] == 1 and bench["verdicts_failed"] == 0


def test_the_split_ab_sets_the_fixed_run_beside_engine_selfs(tmp_path: Path) -> None:
    """Read on call 2's two engine runs (both of the fixed split, so the A/B here is one run
    against itself and the other): each run's decode-only medians by batch size and its TPOT."""
    call2 = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu-h200-2026-11-27/call2"
    runs = call2 / "engine-self"
    shutil.copytree(runs / "run2", tmp_path / "engine-split-fixed" / "run1")
    shutil.copytree(runs, tmp_path / "engine-self")
    ab = figures.split_ab(tmp_path / "engine-split-fixed")
    assert ab["batch_bins"][0] == "1-1" and len(ab["batch_bins"]) == len(figures.SPLIT_BINS)
    assert ab["fixed"] == ab["per_sequence_run2"]
    assert ab["per_sequence_run1"]["decode_only_steps"] == 1987  # as decode_walk.txt counts
    # Batch 1's median, independently: run 1's decode-only steps of one sequence.
    from records.step_shapes import load_step_shapes

    ones = sorted(
        s.duration_s
        for s in load_step_shapes(runs / "run1" / "step_shapes.jsonl.gz")
        if not s.prefill_chunks and len(s.decode_context_tokens) == 1
    )
    middle = len(ones) // 2
    median = ones[middle] if len(ones) % 2 else (ones[middle - 1] + ones[middle]) / 2
    assert ab["per_sequence_run1"]["decode_only_median_ms"][0] == round(1e3 * median, 2)
    assert 1 < ab["per_sequence_run1"]["median_tpot_ms"] < 100


def test_the_piecewise_ab_sets_the_piecewise_run_beside_engine_selfs(tmp_path: Path) -> None:
    """Read on call 2's two engine runs (neither piecewise: the reader is checked, not the
    engine): each run's medians of the steps with a prompt chunk by their tokens, of the
    decode-only steps, and of TTFT and TPOT."""
    call2 = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu-h200-2026-11-27/call2"
    runs = call2 / "engine-self"
    shutil.copytree(runs / "run1", tmp_path / "engine-piecewise" / "run1")
    shutil.copytree(runs, tmp_path / "engine-self")
    ab = figures.piecewise_ab(tmp_path / "engine-piecewise")
    assert ab["token_bins"] == ["1-64", "65-256", "257-512", ">512"]
    assert ab["piecewise"] == ab["eager_mixed_run1"] != ab["eager_mixed_run2"]
    from records.step_shapes import load_step_shapes

    shapes = load_step_shapes(runs / "run1" / "step_shapes.jsonl.gz")
    mixed = [s for s in shapes if s.prefill_chunks]
    assert ab["piecewise"]["steps_with_prefill"] == len(mixed) > 0
    small = sorted(
        s.duration_s
        for s in mixed
        if sum(n for n, _ in s.prefill_chunks) + len(s.decode_context_tokens) <= 64
    )
    medians = ab["piecewise"]["with_prefill_median_ms"]
    assert len(medians) == 4 and any(m is not None for m in medians)
    if small:
        middle = len(small) // 2
        median = small[middle] if len(small) % 2 else (small[middle - 1] + small[middle]) / 2
        assert medians[0] == round(1e3 * median, 2)
    assert 1 < ab["piecewise"]["median_tpot_ms"] < 100
    assert ab["piecewise"]["median_ttft_ms"] > ab["piecewise"]["median_tpot_ms"] / 10


def test_validation_figures_carry_the_hosts_measured_speed(tmp_path: Path) -> None:
    metrics = {m: {"median_abs_pct": 5.0} for m in ("ttft", "tpot", "e2e")}
    model = {"requests": {"metrics": metrics}, "steps": {"all": {"median_abs_pct": 4.0}}}
    speed = {"slowdown": 1.2345, "spread": 0.05, "by_fifth": [1.0, 1.1, 1.2, 1.3, 1.4]}
    result = {
        "models": {"calibrated": model},
        "host_speed": {**speed, "num_steps": 90, "core_share": 0.999, "applied": 1.0},
        "engine_floor": {
            "requests": {"metrics": metrics},
            "host_speed": {**speed, "slowdown": 0.9},
        },
    }
    (tmp_path / "validation.json").write_text(json.dumps(result))
    found = figures.validation(tmp_path)
    assert found["host_slowdown"] == 1.23 and found["rerun_host_slowdown"] == 0.9
    assert found["host_slowdown_by_fifth"] == [1.0, 1.1, 1.2, 1.3, 1.4]
    assert found["core_share"] == 1.0
    # A run whose host could not be measured (a profile without preparation times) says none.
    result["host_speed"] = {"error": "no preparation times", "applied": 1.0}
    (tmp_path / "validation.json").write_text(json.dumps(result))
    assert "host_slowdown" not in figures.validation(tmp_path)


def test_validation_figures_carry_the_slow_tail_and_the_gpu_scale(tmp_path: Path) -> None:
    metrics = {m: {"median_abs_pct": 5.0} for m in ("ttft", "tpot", "e2e")}
    tail = {"n": 900, "total_pct": 9.0, "median_step_pct": 2.0, "tail_pts": 7.004}
    model = {
        "requests": {"metrics": metrics},
        "steps": {"all": {"median_abs_pct": 4.0}},
        "tail": {**tail, "hiccup": 1.2, "hiccup_share": 0.1, "tail_without_hiccups_pts": 1.996},
    }
    result = {
        "models": {"calibrated": model, "roofline": {**model, "tail": tail}},
        "profile_spread": {"steps_spread_pct": 2.0, "device_scale": 1.2734},
    }
    (tmp_path / "validation.json").write_text(json.dumps(result))
    found = figures.validation(tmp_path)
    assert found["calibrated"]["tail_pts"] == 7.0 and found["calibrated"]["tail_calm_pts"] == 2.0
    assert found["roofline"]["tail_pts"] == 7.0 and "tail_calm_pts" not in found["roofline"]
    assert found["profile_device_scale"] == 1.27


def test_the_calibration_figures_say_how_often_the_holds_were_outrun(tmp_path: Path) -> None:
    profile = {"engine": {"kind": "servesim-graphs", "timer_calls": "1260", "timer_retimed":
               "31", "timer_late": "2"}, "steps": []}  # fmt: skip
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    assert figures.calibration(tmp_path)["timer_holds"] == {"calls": 1260, "retimed": 31, "late": 2}


def test_a_graph_decode_table_is_read_beside_the_eager_one(tmp_path: Path) -> None:
    """By batch size, the median over contexts of the graphs' table over the eager one."""
    ops = {
        "decode_attention": {
            "num_seqs": [1.0, 4.0, 64.0],
            "context_tokens": [16.0, 2048.0, 4096.0],
            "time_s": [[10e-6, 20e-6, 30e-6], [11e-6, 40e-6, 60e-6], [20e-6, 90e-6, 150e-6]],
        },
        "decode_attention_graph": {
            "num_seqs": [1.0, 4.0],
            "context_tokens": [16.0, 2048.0, 4096.0],
            "time_s": [[10e-6, 8e-6, 9e-6], [11e-6, 36e-6, 66e-6]],
        },
    }
    profile = {"engine": {"kind": "servesim-graphs"}, "steps": [], "ops": ops}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    assert figures.calibration(tmp_path)["decode_graph_over_eager"] == {"1": 0.4, "4": 1.0}
    del ops["decode_attention_graph"]
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    assert "decode_graph_over_eager" not in figures.calibration(tmp_path)


def test_validation_figures_carry_the_decode_residual_by_batch(tmp_path: Path) -> None:
    metrics = {m: {"median_abs_pct": 5.0} for m in ("ttft", "tpot", "e2e")}
    by_batch = {
        "1": {"n": 603, "median_pct": 4.0, "median_residual_s": -203.44e-6},
        "17-32": {"n": 1034, "median_pct": -0.5, "median_residual_s": 33.01e-6},
    }
    steps = {"all": {"median_abs_pct": 2.1}, "by_decode_batch": by_batch}
    model = {"requests": {"metrics": metrics}, "steps": steps}
    (tmp_path / "validation.json").write_text(json.dumps({"models": {"roofline": model}}))
    found = figures.validation(tmp_path)["roofline"]
    assert found["decode_residual_us_by_batch"] == {"1": -203.44, "17-32": 33.01}
    del steps["by_decode_batch"]  # (a validation from before the groups)
    (tmp_path / "validation.json").write_text(json.dumps({"models": {"roofline": model}}))
    assert "decode_residual_us_by_batch" not in figures.validation(tmp_path)["roofline"]


def test_the_pinned_eager_run_is_read_beside_the_unpinned_ones(tmp_path: Path) -> None:
    """On 2026-11-28's two eager runs (run2 stands in for a pinned run): each run's decode-only
    steps, whose p90 the host's slow stretches put far above the median."""
    eager = ROOT / "benchmarks/results/gpu-h200-2026-11-28/call2/engine-self-eager"
    shutil.copytree(eager, tmp_path / "engine-self-eager")
    shutil.copytree(eager / "run2", tmp_path / "engine-pinned-eager" / "run1")
    found = figures.host_modes_ab(tmp_path / "engine-pinned-eager")
    assert set(found) == {"pinned", "unpinned_run1", "unpinned_run2"}
    assert found["pinned"] == found["unpinned_run2"]
    run1 = found["unpinned_run1"]
    assert run1["decode_only_steps"] > 1000
    # Two speeds (about 13 and 19-20 ms): the p90 sits in the slow one.
    assert 12 < run1["decode_only_median_ms"] < run1["decode_only_p90_ms"] < 30
    assert run1["p90_over_median"] > 1.1
    assert 0 < run1["prepare_median_ms"] < 5 and run1["median_tpot_ms"] > 10
