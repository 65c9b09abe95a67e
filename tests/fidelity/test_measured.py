"""Measured-run importers (LLMServingSim folders, vllm bench result JSON) on short handmade
files, the per-request error maths, and the ``measured import`` / ``validate`` commands."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from fidelity.measured import write_measured_run
from fidelity.measured_importers import import_llmservingsim, import_vllm_bench
from records.compare import compare_requests, format_comparison
from records.run_dir import load_run
from sim.cli.main import main
from sim.specs.hardware_file import load_hardware_file
from tests.fidelity.llmservingsim_run import workload_line, write_llmservingsim_run
from traces.loaders import load_trace


@pytest.fixture
def llmservingsim_dir(tmp_path: Path) -> Path:
    """root/run (meta.json, requests.jsonl, config.json) and root/workloads/w.jsonl."""
    return write_llmservingsim_run(tmp_path)


def test_llmservingsim_import_by_hand(llmservingsim_dir: Path) -> None:
    run = import_llmservingsim(llmservingsim_dir)
    frame = run.requests.set_index("request_id")
    assert frame["arrival_s"].tolist() == pytest.approx([0.0, 0.5, 0.9])
    assert frame["ttft_ms"].tolist() == pytest.approx([100.0, 50.0, 200.0])
    assert frame.loc["bench-0", "tpot_ms"] == pytest.approx(100.0)
    assert frame.loc["bench-1", "tpot_ms"] == pytest.approx(100.0)
    assert math.isnan(frame.loc["bench-2", "tpot_ms"])  # one output token: no TPOT
    assert frame["e2el_ms"].tolist() == pytest.approx([300.0, 150.0, 200.0])
    assert frame["queueing_ms"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    # The replay trace: measured arrivals, lengths, and the workload's token ids.
    second = run.trace.requests[1]
    assert (second.request_id, second.prompt_tokens, second.output_tokens) == ("bench-1", 4, 2)
    assert second.prompt_token_ids == (200, 201, 202, 203)
    assert run.replay == {
        "policy": "chunked",
        "enable_prefix_caching": True,
        "block_size": 16,
        "tp": 1,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "model": "Llama-3.1-8B",
        "gpu_memory_utilization": 0.9,
    }
    # "RTXPRO6000" at 1597 GB/s: the Server Edition's figure, so that edition's preset.
    assert run.hardware is not None and run.hardware["base"] == "RTX-PRO-6000-Server"


def test_llmservingsim_link_becomes_the_gpu_to_gpu_link(llmservingsim_dir: Path) -> None:
    # LLMServingSim's link: GB/s and ns per ring step, the whole cost of a step (ASTRA-Sim's
    # analytical network): bus efficiency 1 and no per-call latency on top.
    path = llmservingsim_dir / "config.json"
    cluster = json.loads(path.read_text())
    path.write_text(json.dumps({"num_nodes": 1, "link_bw": 16, "link_latency": 20000, **cluster}))
    hardware = import_llmservingsim(llmservingsim_dir).hardware
    assert hardware is not None
    for prefix in ("interconnect", "scale_out"):
        # ASTRA-Sim's analytical backend, which defines the file's units, reads a GB as 2**30
        assert hardware[f"{prefix}_bandwidth_bytes_per_s"] == 16 * 2**30
        assert hardware[f"{prefix}_latency_s"] == pytest.approx(20e-6)
        assert hardware[f"{prefix}_bus_efficiency"] == 1.0
    assert hardware["allreduce_call_latency_s"] == 0.0
    path.write_text(json.dumps({"link_bw": "fast", "link_latency": 20000, **cluster}))
    with pytest.raises(ValueError, match=r"config\.json: link_bw \(GB/s\)"):
        import_llmservingsim(llmservingsim_dir)


def test_llmservingsim_written_run_reads_back(llmservingsim_dir: Path, tmp_path: Path) -> None:
    out = write_measured_run(import_llmservingsim(llmservingsim_dir), tmp_path / "out")
    records = load_run(out)
    assert records.summary["completed"] == 3
    assert records.summary["median_ttft_ms"] == pytest.approx(100.0)
    assert records.summary["duration_s"] == pytest.approx(1.1)  # first arrival to last finish
    assert records.summary["total_output_tokens"] == 6
    assert records.config["hardware"] == "hardware.json"
    spec = load_hardware_file(out / "hardware.json")
    assert spec.hbm_bandwidth_bytes_per_s == 1597e9
    trace = load_trace(out / "trace.csv")
    assert trace.requests[0].prompt_token_ids == tuple(range(100, 108))


def test_llmservingsim_bad_line_names_file_line_and_field(llmservingsim_dir: Path) -> None:
    path = llmservingsim_dir / "requests.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    del record["first_token_ts"]
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"requests\.jsonl:2: missing field 'first_token_ts'"):
        import_llmservingsim(llmservingsim_dir)


def test_llmservingsim_wrong_workload_is_refused(llmservingsim_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(workload_line(5, 3, 0, 0) for _ in range(3)) + "\n")
    with pytest.raises(ValueError, match=r"input_toks 8 but workload line 1 has 5 \(.*\); wrong"):
        import_llmservingsim(llmservingsim_dir, other)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(workload_line(8, 3, 0, 0) + '\n{"input_toks": 4, "output_toks": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: not valid JSON"):
        import_llmservingsim(llmservingsim_dir, broken)


BENCH = {
    "date": "20260101-000000",
    "model_id": "Qwen/Qwen3-32B",
    "completed": 2,
    "mean_ttft_ms": 150.0,
    "input_lens": [8, 4, 6],
    "output_lens": [3, 2, 0],
    "ttfts": [0.1, 0.2, 0.0],
    "itls": [[0.02, 0.04], [0.03], []],
    "start_times": [50.0, 50.5, 50.9],
    "errors": ["", "", "HTTP 500"],
}


def test_vllm_bench_import_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(BENCH))
    run = import_vllm_bench(path)
    frame = run.requests.set_index("request_id")
    assert frame["arrival_s"].tolist() == pytest.approx([0.0, 0.5, 0.9])
    assert frame.loc["bench-0", "ttft_ms"] == pytest.approx(100.0)
    assert frame.loc["bench-0", "tpot_ms"] == pytest.approx(30.0)  # (20 + 40) / 2
    assert frame.loc["bench-0", "e2el_ms"] == pytest.approx(160.0)
    assert frame.loc["bench-0", "itl_max_ms"] == pytest.approx(40.0)
    assert frame.loc["bench-0", "itl_min_ms"] == pytest.approx(20.0)
    assert frame.loc["bench-1", "e2el_ms"] == pytest.approx(230.0)
    assert frame.loc["bench-2", "status"] == "failed"
    assert frame.loc["bench-2", "reject_reason"] == "HTTP 500"
    assert run.replay == {"policy": "chunked", "model": "Qwen3-32B"}
    assert run.reported["mean_ttft_ms"] == 150.0
    assert run.trace.requests[0].prompt_token_ids is None  # no workload: lengths only


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("input_lens", [8, "four", 6], "input_lens[1] is not a number: 'four'"),
        ("output_lens", [3, 2.5, 0], "output_lens[1] is not a whole number: 2.5"),
        ("ttfts", [0.1, True, 0.0], "ttfts[1] is not a number: True"),
        ("start_times", [50.0, [1], 50.9], "start_times[1] is not a number: [1]"),
    ],
)
def test_a_bench_entry_that_is_not_a_number_is_named_by_index(
    key: str, value: list[object], said: str, tmp_path: Path
) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**BENCH, key: value}))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {said}")):
        import_vllm_bench(path)


def test_vllm_bench_without_start_times_needs_a_workload(tmp_path: Path) -> None:
    payload = {k: v for k, v in BENCH.items() if k != "start_times"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"old\.json: no start_times.*--workload"):
        import_vllm_bench(path)
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        "\n".join(
            [
                workload_line(8, 3, 0, 1),
                workload_line(4, 2, 250_000_000, 1),
                workload_line(6, 1, 400_000_000, 1),
            ]
        )
    )
    run = import_vllm_bench(path, workload)
    assert run.requests["arrival_s"].tolist() == pytest.approx([0.0, 0.25, 0.4])
    assert run.trace.requests[1].prompt_token_ids == (1, 2, 3, 4)


def test_vllm_bench_list_of_wrong_length_is_named(tmp_path: Path) -> None:
    path = tmp_path / "short.json"
    path.write_text(json.dumps({**BENCH, "ttfts": [0.1]}))
    with pytest.raises(ValueError, match=r"short\.json: field 'ttfts' has 1 items, input_lens 3"):
        import_vllm_bench(path)
    path.write_text(json.dumps({k: v for k, v in BENCH.items() if k != "itls"}))
    with pytest.raises(ValueError, match=r"field 'itls' must be a list \(save the result with"):
        import_vllm_bench(path)


def _frame(ids: list[str], ttft: list[float], status: list[str] | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": ids,
            "status": status or ["finished"] * len(ids),
            "ttft_ms": ttft,
            "tpot_ms": [10.0] * len(ids),
            "e2el_ms": [1000.0] * len(ids),
        }
    )


def test_error_maths_by_hand() -> None:
    ids = ["a", "b", "c", "d", "e"]
    measured = _frame([*ids, "f"], [100.0] * 6)
    # Signed errors -10, +5, +20, +50, 0 %; "f" is missing from the prediction and "x" was
    # rejected there, so neither compares.
    predicted = _frame(
        [*ids, "x"], [90.0, 105.0, 120.0, 150.0, 100.0, 1.0], status=[*["finished"] * 5, "rejected"]
    )
    comparison = compare_requests(measured, predicted)
    ttft = comparison.by_metric()["TTFT"]
    assert ttft.num_requests == 5
    assert ttft.median_abs_pct == pytest.approx(10.0)  # |err| sorted 0, 5, 10, 20, 50
    assert ttft.p90_abs_pct == pytest.approx(38.0)  # 20 + 0.6 x (50 - 20)
    assert ttft.bias_pct == pytest.approx(5.0)  # signed sorted -10, 0, 5, 20, 50
    assert ttft.measured_median_ms == 100.0 and ttft.predicted_median_ms == 105.0
    assert comparison.by_metric()["TPOT"].median_abs_pct == 0.0
    assert (comparison.num_joined, comparison.only_measured, comparison.only_predicted) == (5, 1, 0)
    assert "ITL max" not in comparison.by_metric()  # neither frame records gaps
    table = format_comparison(comparison)
    assert "TTFT" in table and "+5.0%" in table


def test_error_maths_refuses_bad_joins() -> None:
    with pytest.raises(ValueError, match="no request is finished in both runs"):
        compare_requests(_frame(["a"], [1.0]), _frame(["b"], [1.0]))
    with pytest.raises(ValueError, match=r"measured requests repeat request_id 'a'"):
        compare_requests(_frame(["a", "a"], [1.0, 2.0]), _frame(["a"], [1.0]))


def test_cli_import_then_validate(
    llmservingsim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "measured"
    args = ["measured", "import", str(llmservingsim_dir), "--format", "llmservingsim"]
    assert main([*args, "--out", str(out)]) == 0
    table = tmp_path / "errors.json"
    assert main(["measured", "validate", str(out), "--json", str(table)]) == 0
    printed = capsys.readouterr().out
    # The recorded settings were used: the model, the GPU from config.json, the budget.
    assert "Llama-3.1-8B on " in printed and "hardware.json x1" in printed
    assert "budget 64" in printed
    errors = {row["metric"]: row for row in json.loads(table.read_text())["errors"]}
    assert errors["TTFT"]["num_requests"] == 3 and errors["TPOT"]["num_requests"] == 2
    # A run option given on the command line replaces the recorded one.
    report = tmp_path / "side.html"
    args = ["measured", "validate", str(out), "--max-batch-tokens", "32"]
    assert main([*args, "--report", str(report)]) == 0
    assert "budget 32" in capsys.readouterr().out
    html = report.read_text()
    assert "measured" in html and "simulated" in html


@pytest.fixture
def imported(llmservingsim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The handmade LLMServingSim run, imported with ``measured import``."""
    out = tmp_path / "measured"
    args = ["measured", "import", str(llmservingsim_dir), "--format", "llmservingsim"]
    assert main([*args, "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def test_validate_measured_is_the_same_command(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = imported
    outputs = []
    for argv in (
        ["measured", "validate", str(out), "--max-batch-tokens", "32"],
        ["validate", "--measured", str(out), "--max-batch-tokens", "32"],
        ["validate", "--max-batch-tokens", "32", f"--measured={out}"],
    ):
        table = tmp_path / "errors.json"
        assert main([*argv, "--json", str(table)]) == 0
        outputs.append((capsys.readouterr().out, json.loads(table.read_text())["errors"]))
    assert "budget 32" in outputs[0][0]
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]
    assert main(["validate", "--measured"]) == 2
    assert "error: --measured needs a RUN_DIR" in capsys.readouterr().err
    assert main(["validate", "--out", str(tmp_path / "v")]) == 2
    assert (
        "error: validate needs a TRACE (or --replay RUN, or --measured RUN_DIR)"
        in capsys.readouterr().err
    )


def test_a_flag_given_at_its_default_replaces_the_recorded_setting(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The run recorded max_num_seqs 4, a budget of 64 and its own hardware.json.
    out = imported
    given = ["--hardware", "H100-SXM", "--max-num-seqs", "256", "--max-batch-tokens", "256"]
    assert main(["measured", "validate", str(out), *given]) == 0
    printed = capsys.readouterr().out
    # H100-SXM and 256 are the defaults: given, they still win over the record.
    assert "on H100-SXM x1" in printed and "max_num_seqs 256, budget 256" in printed
    # Left out, the record's settings are replayed.
    assert main(["measured", "validate", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hardware.json x1, chunked, max_num_seqs 4, budget 64" in printed
    assert "not replayed" not in printed
    # A recorded setting the simulator does not have is named, not dropped in silence.
    summary = out / "summary.json"
    payload = json.loads(summary.read_text())
    payload["config"]["dtype"] = "bfloat16"
    summary.write_text(json.dumps(payload))
    assert main(["measured", "validate", str(out)]) == 0
    assert "but not settings of the simulator, so not replayed: dtype" in capsys.readouterr().out


def test_vllm_defaults_fill_only_what_the_run_did_not_record(
    imported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["measured", "validate", str(imported), "--vllm-defaults", "serve"]) == 0
    assert "max_num_seqs 4, budget 64" in capsys.readouterr().out  # the record's
    summary = imported / "summary.json"
    payload = json.loads(summary.read_text())
    del payload["config"]["max_num_seqs"]
    summary.write_text(json.dumps(payload))
    assert main(["measured", "validate", str(imported), "--vllm-defaults", "serve"]) == 0
    # vLLM's 1,024 on the run's 96 GB GPU, held to the recorded budget.
    assert "max_num_seqs 64, budget 64" in capsys.readouterr().out


def test_the_replayed_config_is_checked_as_a_whole(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = imported
    # Below the recorded max_num_seqs (4): vLLM would not start, and neither does the replay.
    assert main(["measured", "validate", str(out), "--max-batch-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "error: max_num_batched_tokens must be >= max_num_seqs (4)" in err and "got 2" in err
    # A max_num_seqs above the recorded budget (64) is refused the same way.
    assert main(["measured", "validate", str(out), "--max-num-seqs", "100"]) == 2
    err = capsys.readouterr().err
    assert "max_num_seqs (100) under policy 'chunked', got 64" in err
    # The budget alone at 4, the recorded max_num_seqs: allowed.
    assert main(["measured", "validate", str(out), "--max-batch-tokens", "4"]) == 0
    assert "max_num_seqs 4, budget 4" in capsys.readouterr().out


def test_cli_import_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["measured", "import", str(tmp_path / "nope"), "--format", "llmservingsim"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a directory" in err


SHARED_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "vllm-runs" / "llmservingsim"


@pytest.mark.shared
@pytest.mark.parametrize("name", ["RTXPRO6000-Llama-3.1-8B", "RTXPRO6000-Qwen3-32B"])
def test_real_llmservingsim_runs_import(name: str) -> None:
    if not (SHARED_RUNS / name / "meta.json").is_file():
        pytest.skip(f"measured runs not found at {SHARED_RUNS}")
    run = import_llmservingsim(SHARED_RUNS / name)
    assert len(run.requests) == 300 and (run.requests["status"] == "finished").all()
    # Every prompt's real token ids come with it, for prefix caching on real content.
    assert all(r.prompt_token_ids is not None for r in run.trace.requests)
    raw = [json.loads(line) for line in (SHARED_RUNS / name / "requests.jsonl").open()]
    ttft_ms = sorted((r["first_token_ts"] - r["queued_ts"]) * 1000 for r in raw)
    assert run.requests["ttft_ms"].median() == pytest.approx((ttft_ms[149] + ttft_ms[150]) / 2)
    assert run.replay["max_num_seqs"] == 128 and run.replay["max_num_batched_tokens"] == 2048
    assert run.replay["tp"] == (1 if "Llama" in name else 2)


def test_a_data_parallel_expert_parallel_run_imports_and_replays(
    llmservingsim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = json.loads((llmservingsim_dir / "meta.json").read_text())
    meta["model"] = "Qwen/Qwen3-30B-A3B-Instruct-2507"  # a release of a preset: its shapes
    meta["engine_kwargs"] |= {
        "model": meta["model"],
        "data_parallel_size": 2,
        "enable_expert_parallel": True,
    }
    (llmservingsim_dir / "meta.json").write_text(json.dumps(meta))
    run = import_llmservingsim(llmservingsim_dir)
    assert run.replay["model"] == "Qwen3-30B-A3B"
    assert run.replay["data_parallel_size"] == 2 and run.replay["enable_expert_parallel"]
    out = write_measured_run(run, tmp_path / "measured")
    assert main(["measured", "validate", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "x1, data parallel x2" in printed
    meta["engine_kwargs"]["data_parallel_size"] = 0
    (llmservingsim_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"data_parallel_size must be a positive integer"):
        import_llmservingsim(llmservingsim_dir)


def test_a_gpu_name_takes_the_edition_whose_bandwidth_the_run_states() -> None:
    from fidelity.measured_llmservingsim import _hardware_preset

    assert _hardware_preset("RTXPRO6000", 1597e9) == "RTX-PRO-6000-Server"
    assert _hardware_preset("RTXPRO6000", 1792e9) == "RTX-PRO-6000"
    assert _hardware_preset("RTXPRO6000") == "RTX-PRO-6000"
    assert _hardware_preset("RTX4090", 1008e9) == "RTX-4090"
    assert _hardware_preset("TPUv5", 1e12) is None
