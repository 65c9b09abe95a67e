"""The KV capacity a measured run had: read from the vLLM log or the run's metadata and used by
the replay, which says so; otherwise derived by vLLM's rule and printed beside the run's
memory settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fidelity.measured_importers import import_llmservingsim
from fidelity.vllm_log import kv_capacity_from_log, kv_capacity_from_metadata
from sim.cli.main import main
from tests.fidelity.llmservingsim_run import write_llmservingsim_run

V1_LOG = """\
(EngineCore_DP0 pid=1) INFO 04-25 18:47:29 [gpu_worker.py:298] Available KV cache memory: 7.1 GiB
(EngineCore_DP0 pid=1) INFO 04-25 18:47:29 [kv_cache_utils.py:1087] GPU KV cache size: 58,528 tokens
(EngineCore_DP0 pid=1) INFO 04-25 18:47:29 [kv_cache_utils.py:1091] Maximum concurrency: 4.5x
"""


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_llmservingsim_run(tmp_path)


def test_a_v1_log_gives_tokens_a_v0_log_blocks(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(V1_LOG)
    found = kv_capacity_from_log(log, 16)
    assert found is not None and found.num_gpu_blocks == 58528 // 16 == 3658
    assert found.source == f"{log}:2"
    log.write_text("INFO llm_engine.py:337] # GPU blocks: 2,151, # CPU blocks: 512\n")
    found = kv_capacity_from_log(log, 16)
    assert found is not None and (found.num_gpu_blocks, found.source) == (2151, f"{log}:1")
    log.write_text("nothing about the cache\n")
    assert kv_capacity_from_log(log, 16) is None
    log.write_text("GPU KV cache size: 1,000 tokens\n")
    with pytest.raises(ValueError, match=r"vllm\.log:1: 1000 KV tokens is not a whole number"):
        kv_capacity_from_log(log, 16)


def test_metadata_states_blocks_in_several_places() -> None:
    assert kv_capacity_from_metadata({}, "m.json") is None
    found = kv_capacity_from_metadata({"num_gpu_blocks": 900}, "m.json")
    assert found is not None and (found.num_gpu_blocks, found.source) == (
        900,
        "m.json num_gpu_blocks",
    )
    found = kv_capacity_from_metadata({"engine_kwargs": {"num_gpu_blocks_override": 77}}, "m")
    assert found is not None and found.source == "m engine_kwargs.num_gpu_blocks_override"
    found = kv_capacity_from_metadata({"cache_config": {"num_gpu_blocks": 5}}, "m")
    assert found is not None and found.num_gpu_blocks == 5
    # LLMServingSim's later runs: vLLM's resolved config and its kv_cache summary.
    meta = {"resolved_config": {"cache_config": {"num_gpu_blocks": 2588}}}
    found = kv_capacity_from_metadata(meta, "m")
    assert found is not None and found.source == "m resolved_config.cache_config.num_gpu_blocks"
    found = kv_capacity_from_metadata({"kv_cache": {"num_gpu_blocks": 2588}}, "m")
    assert found is not None and found.source == "m kv_cache.num_gpu_blocks"
    with pytest.raises(ValueError, match=r"m: field 'num_gpu_blocks' must be an integer"):
        kv_capacity_from_metadata({"num_gpu_blocks": "many"}, "m")


def test_a_recorded_capacity_is_replayed_and_said(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "server.log"
    log.write_text(V1_LOG)
    out = tmp_path / "measured"
    args = ["measured", "import", str(run_dir), "--format", "llmservingsim", "--vllm-log", str(log)]
    assert main([*args, "--out", str(out)]) == 0
    assert f"KV capacity: 3658 GPU blocks, from {log}:2" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["num_blocks"] == summary["num_blocks"] == 3658
    sim_out = tmp_path / "sim"
    assert main(["measured", "validate", str(out), "--out", str(sim_out)]) == 0
    assert (
        f"KV cache: 3658 GPU blocks/rank, as the run recorded ({log}:2)" in capsys.readouterr().out
    )
    assert json.loads((sim_out / "summary.json").read_text())["num_blocks"] == 3658
    # A --num-blocks given replaces it, and the line says so.
    assert main(["measured", "validate", str(out), "--num-blocks", "3000"]) == 0
    assert "KV cache: 3000 GPU blocks/rank, as given (--num-blocks)" in capsys.readouterr().out


def test_without_a_record_the_rule_is_printed_term_by_term(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "measured"
    assert (
        main(["measured", "import", str(run_dir), "--format", "llmservingsim", "--out", str(out)])
        == 0
    )
    assert main(["measured", "validate", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("KV cache: "))
    # The run's 96 GB card at its 0.9 utilization, less Llama-3.1-8B's weights and the rest.
    assert "derived as vLLM does (the run records none)" in line
    assert "96.00 GiB x gpu_memory_utilization 0.9 = 86.40 - weights 14.96" in line


def test_a_log_without_the_line_is_refused(run_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("started\n")
    with pytest.raises(ValueError, match=r"empty\.log: no 'GPU KV cache size: N tokens'"):
        import_llmservingsim(run_dir, None, log)
