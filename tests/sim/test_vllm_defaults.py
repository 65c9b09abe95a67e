"""``--vllm-defaults``: the token budget and ``max_num_seqs`` vLLM picks when they are not
given, by GPU and by usage (``EngineArgs``' batch defaults)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.main import main
from sim.specs.hardware import get_hardware_preset
from sim.specs.vllm_defaults import gpu_tier, vllm_batch_defaults

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "data" / "example.csv"


@pytest.mark.parametrize(
    ("preset", "tier"),
    [
        ("H100-SXM", "large"),
        ("H200", "large"),
        ("B200", "large"),
        ("MI300X", "large"),
        ("RTX-PRO-6000", "large"),  # 96 GB
        ("A100-80GB", "other"),  # 80 GB, but vLLM keeps A100s on the small budget
        ("A100-40GB", "other"),
        ("L40S", "other"),
        ("RTX-4090", "other"),
    ],
)
def test_the_gpu_tier_is_memory_and_not_an_a100(preset: str, tier: str) -> None:
    assert gpu_tier(get_hardware_preset(preset)) == tier


def test_the_budgets_by_tier_usage_and_chunking() -> None:
    h100, a100 = get_hardware_preset("H100-SXM"), get_hardware_preset("A100-80GB")
    assert vllm_batch_defaults(h100, "serve", True, 8192) == (8192, 1024)
    assert vllm_batch_defaults(h100, "offline", True, 8192) == (16384, 1024)
    assert vllm_batch_defaults(a100, "serve", True, 8192) == (2048, 256)
    assert vllm_batch_defaults(a100, "offline", True, 8192) == (8192, 256)
    # Without chunked prefill the budget is max_model_len, and max_num_seqs stays within it.
    assert vllm_batch_defaults(h100, "serve", False, 131072) == (131072, 1024)
    assert vllm_batch_defaults(h100, "serve", False, 512) == (512, 512)
    with pytest.raises(ValueError, match="usage must be one of"):
        vllm_batch_defaults(h100, "api", True, 8192)


def _recorded(tmp_path: Path, *flags: str) -> tuple[str, int, int]:
    out = tmp_path / "run"
    assert main(["run", str(EXAMPLE), "--quiet", "--out", str(out), *flags]) == 0
    config = json.loads((out / "summary.json").read_text())["config"]
    return config["policy"], config["max_num_batched_tokens"], config["max_num_seqs"]


def test_a_run_records_the_budgets_vllm_would_pick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _recorded(tmp_path) == ("chunked", 8192, 256)  # servesim's own defaults
    assert _recorded(tmp_path, "--vllm-defaults", "serve") == ("chunked", 8192, 1024)
    a100 = ["--vllm-defaults", "serve", "--hardware", "A100-80GB"]
    assert _recorded(tmp_path, *a100) == ("chunked", 2048, 256)
    offline = ["--vllm-defaults", "offline", "--policy", "continuous"]
    assert _recorded(tmp_path, *offline) == ("continuous", 8192, 1024)  # Llama-3-8B's length
    # A budget given stays, and max_num_seqs follows it down, as vLLM's does.
    given = ["--vllm-defaults", "serve", "--max-num-batched-tokens", "512"]
    assert _recorded(tmp_path, *given) == ("chunked", 512, 512)
    assert "note:" not in capsys.readouterr().err
    assert _recorded(tmp_path, "--vllm-defaults", "serve", "--policy", "static")[1:] == (8192, 256)
    assert "note: --vllm-defaults: vLLM has no static batching" in capsys.readouterr().err


def test_compare_takes_each_items_policy(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", str(EXAMPLE), "--policies", "continuous,chunked", "--vllm-defaults"]
    assert main([*argv, "offline", "--quiet", "--out", str(out)]) == 0
    budgets = {}
    for policy in ("continuous", "chunked"):
        config = json.loads((out / policy / "summary.json").read_text())["config"]
        budgets[policy] = (config["max_num_batched_tokens"], config["max_num_seqs"])
    assert budgets == {"continuous": (8192, 1024), "chunked": (16384, 1024)}
