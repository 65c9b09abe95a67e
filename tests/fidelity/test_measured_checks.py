"""What ``measured import`` and ``measured validate`` refuse or warn about rather than lose in
silence: a workload the run names but that is missing, lengths that contradict the workload, a
request recorded twice, a directory that is not a measured run, and a recorded setting that the
replay's options cannot run."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from fidelity.measured_importers import import_llmservingsim, import_vllm_bench
from sim.cli.main import main
from tests.fidelity.llmservingsim_run import request_line, workload_line, write_llmservingsim_run
from traces.loaders import load_trace

SHARED_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "vllm-runs" / "llmservingsim"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """root/run (meta.json, requests.jsonl, config.json) and root/workloads/w.jsonl."""
    (tmp_path / "root").mkdir()
    return write_llmservingsim_run(tmp_path / "root")


def _import(run: Path, out: Path, *more: str) -> int:
    return main(
        ["measured", "import", str(run), "--format", "llmservingsim", *more, "--out", str(out)]
    )


def test_a_named_workload_that_is_missing_stops_the_import(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = run_dir.parent / "workloads" / "w.jsonl"
    kept = tmp_path / "kept.jsonl"
    shutil.move(workload, kept)
    with pytest.raises(ValueError, match=r"run/meta\.json: the run's workload \(dataset_path"):
        import_llmservingsim(run_dir)
    assert _import(run_dir, tmp_path / "a") == 2
    err = capsys.readouterr().err
    assert f"is not at {run_dir.parent.resolve() / 'workloads' / 'w.jsonl'}" in err
    assert "no prompt token ids" in err and "--workload FILE" in err and "--no-workload" in err
    assert not (tmp_path / "a").exists()
    # Given, it is read and named.
    assert _import(run_dir, tmp_path / "b", "--workload", str(kept)) == 0
    assert f"prompt token ids: from {kept}" in capsys.readouterr().out
    assert load_trace(tmp_path / "b" / "trace.csv").requests[1].prompt_token_ids == (
        200,
        201,
        202,
        203,
    )
    # Left out on purpose: lengths and arrivals only, said at import and at validation.
    out = tmp_path / "c"
    assert _import(run_dir, out, "--no-workload") == 0
    assert "prompt token ids: none" in capsys.readouterr().out
    assert all(r.prompt_token_ids is None for r in load_trace(out / "trace.csv").requests)
    assert json.loads((out / "summary.json").read_text())["measured"]["workload"] is None
    assert main(["measured", "validate", str(out)]) == 0
    assert "note: " in (err := capsys.readouterr().err) and "no prompt token ids" in err


def test_a_run_that_names_no_workload_imports_with_a_warning(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = json.loads((run_dir / "meta.json").read_text())
    del meta["dataset_path"]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    assert _import(run_dir, tmp_path / "out") == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "names no workload (dataset_path)" in err
    notes = json.loads((tmp_path / "out" / "summary.json").read_text())["notes"]
    assert any("names no workload" in note for note in notes)


def test_the_workload_is_found_above_the_parent_and_its_hash_checked(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # LLMServingSim's repository: bench/examples/<GPU>/<model>/vllm/, workloads/ at its root.
    deep = run_dir.parent / "bench" / "examples" / "GPU" / "model" / "vllm"
    shutil.move(run_dir, deep)
    run = import_llmservingsim(deep)
    assert run.workload == str(run_dir.parent.resolve() / "workloads" / "w.jsonl")
    assert run.warnings == ()
    workload = Path(run.workload)
    meta = json.loads((deep / "meta.json").read_text())
    meta["dataset_hash"] = hashlib.sha256(workload.read_bytes()).hexdigest()
    (deep / "meta.json").write_text(json.dumps(meta))
    assert import_llmservingsim(deep).warnings == ()
    meta["dataset_hash"] = "0" * 64
    (deep / "meta.json").write_text(json.dumps(meta))
    (warning,) = import_llmservingsim(deep).warnings
    assert "records dataset_hash 0000000000000000..." in warning


def test_output_lengths_must_be_the_workloads(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run_dir / "requests.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = request_line(1, 0.5, 0.55, 0.65, 4, 1)  # the workload's line 2 asks for 2
    path.write_text("\n".join(lines) + "\n")
    assert _import(run_dir, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert (
        f"{path}:2: request 'bench-1' has output_toks 1 but workload line 2 has 2 "
        "(LLMServingSim's runner sends that line's prompt and pins the output" in err
    )
    # Without the workload nothing contradicts the run's own count.
    assert import_llmservingsim(run_dir, without_workload=True).requests["output_tokens"][1] == 1


def test_a_request_recorded_twice_is_named_by_file_and_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run_dir / "requests.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[0]]) + "\n")
    assert _import(run_dir, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"error: {path}:4: request_id 'bench-0' repeats line 1" in err


def test_a_vllm_bench_output_may_stop_early_but_never_run_long(tmp_path: Path) -> None:
    result = {
        "model_id": "Qwen/Qwen3-32B",
        "input_lens": [8, 4, 6],
        "output_lens": [3, 1, 0],
        "ttfts": [0.1, 0.2, 0.0],
        "itls": [[0.02, 0.04], [], []],
        "start_times": [50.0, 50.5, 50.9],
        "errors": ["", "", "HTTP 500"],
    }
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    workload = tmp_path / "w.jsonl"
    lines = [workload_line(8, 3, 0, 1), workload_line(4, 2, 0, 1), workload_line(6, 5, 0, 1)]
    workload.write_text("\n".join(lines) + "\n")
    # Request 1 wrote 1 of its 2 (an end-of-sequence token); request 2 failed, so wrote none.
    (warning,) = import_vllm_bench(path, workload).warnings
    assert "1 request(s) wrote fewer output tokens" in warning and ": 1 (1 of 2);" in warning
    result["output_lens"] = [4, 1, 0]
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match=r"request 0 has output_lens 4 but workload line 1 asks"):
        import_vllm_bench(path, workload)


def test_validate_refuses_a_directory_that_is_not_a_measured_run(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = tmp_path / "measured"
    assert _import(run_dir, measured) == 0
    simulated = tmp_path / "simulated"
    assert main(["run", str(measured / "trace.csv"), "--out", str(simulated), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["measured", "validate", str(simulated)]) == 2
    err = capsys.readouterr().err
    assert f"error: {simulated} is not a measured run: its summary.json has no 'measured'" in err
    assert "no trace.csv to replay" in err and "python -m sim measured import" in err
    assert "does not exist" not in err


def test_recorded_prefix_caching_under_a_contiguous_policy_is_named_as_recorded(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = tmp_path / "measured"
    assert _import(run_dir, measured) == 0
    capsys.readouterr()
    assert main(["measured", "validate", str(measured), "--policy", "static"]) == 2
    err = capsys.readouterr().err
    assert "enable_prefix_caching is on in the run's record" in err and "summary.json" in err
    assert "policy 'static', which runs contiguous memory by default" in err
    assert "--memory-model paged" in err and "--no-enable-prefix-caching" in err
    given = ["--policy", "chunked", "--memory-model", "contiguous"]
    assert main(["measured", "validate", str(measured), *given]) == 2
    assert "and --memory-model contiguous has no prefix cache" in capsys.readouterr().err
    paged = ["--policy", "static", "--memory-model", "paged", "--quiet"]
    assert main(["measured", "validate", str(measured), *paged]) == 0
    without = ["--policy", "static", "--no-enable-prefix-caching", "--quiet"]
    assert main(["measured", "validate", str(measured), *without]) == 0


@pytest.mark.shared
def test_a_real_run_copied_without_its_workload_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = SHARED_RUNS / "RTXPRO6000-Llama-3.1-8B"
    if not (source / "meta.json").is_file():
        pytest.skip(f"measured runs not found at {SHARED_RUNS}")
    shutil.copytree(source, tmp_path / "mr" / "run")
    assert _import(tmp_path / "mr" / "run", tmp_path / "mi") == 2
    err = capsys.readouterr().err
    assert "dataset_path 'workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl'" in err
    assert not (tmp_path / "mi").exists()


def test_an_out_that_is_a_file_is_refused_before_the_import(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _import(run_dir, blocker) == 2
    assert f"--out {blocker}: exists and is not a directory" in capsys.readouterr().err
