"""`profile import-vidur` on small CSVs in Vidur's format, written here: the tables it makes,
that `load_profile` and the calibrated model read them, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.model.presets import get_model_preset
from sim.cli.main import main
from sim.costmodel.base import make_cost_model
from sim.costmodel.profile import load_profile
from sim.costmodel.profile_import import vidur_profile
from sim.costmodel.step_shape import StepShape
from sim.costmodel.vidur_profiles import MLP_OPS, VidurFileError
from sim.specs.hardware import HARDWARE_PRESETS

LLAMA = get_model_preset("Llama-2-7B")
SHAPE = "32,32,4096,11008,32768,True"
MLP_HEADER = ",".join(f"time_stats.{op}.median" for op in MLP_OPS)
MLP_HEADER += ",n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp"
MLP_HEADER += ",num_tokens,num_tensor_parallel_workers"


def _mlp_line(num_tokens: int, tp: int) -> str:
    # Op i takes (i + 1) * num_tokens / tp microseconds: easy to sum by hand.
    times = [(i + 1) * num_tokens / tp / 1000 for i in range(len(MLP_OPS))]
    return ",".join(f"{t:g}" for t in times) + f",{SHAPE},{num_tokens},{tp}"


ATTENTION_HEADER = (
    "time_stats.attn_prefill.median,time_stats.attn_decode.median,n_embd,n_q_head,n_kv_head,"
    "block_size,num_tensor_parallel_workers,batch_size,prefill_chunk_size,kv_cache_size,"
    "is_prefill"
)


def _write(root: Path) -> Path:
    mlp = root / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
    mlp.parent.mkdir(parents=True)
    lines = [_mlp_line(n, tp) for tp in (1, 2) for n in (1, 2, 4)]
    mlp.write_text("\n".join([MLP_HEADER, *lines, _mlp_line(4, 2)]) + "\n")
    attention = root / "compute/a100/meta-llama/Llama-2-7b-attention/attention.csv"
    attention.parent.mkdir(parents=True)
    rows = [ATTENTION_HEADER]
    # Prefill: a triangle (chunk + context <= 192); decode: batch {1, 2} x context {32, 64}.
    for chunk, context, ms in ((64, 0, 0.01), (64, 128, 0.03), (128, 0, 0.02), (128, 64, 0.04)):
        rows.append(f"{ms},,4096,32,32,16,2,1,{chunk},{context},True")
    rows.append("0.05,,4096,32,32,16,2,1,64,64,True")
    for batch, context, ms in ((1, 32, 0.011), (1, 64, 0.012), (2, 32, 0.013), (2, 64, 0.015)):
        rows.append(f",{ms},4096,32,32,16,2,{batch},0,{context},False")
    attention.write_text("\n".join(rows) + "\n")
    network = root / "network/a100_dgx/all_reduce.csv"
    network.parent.mkdir(parents=True)
    lines = [",time_stats.all_reduce.median,rank,num_workers,size,collective,devices_per_node"]
    lines += [f"{i},{0.03 + i / 100},0,2,{2048 + 8192 * i},all_reduce,2" for i in range(3)]
    lines += ["9,1.0,0,4,2048,all_reduce,4"]
    network.write_text("\n".join(lines) + "\n")
    return root


def test_import_builds_the_tables(tmp_path: Path) -> None:
    profile = vidur_profile(_write(tmp_path), LLAMA, 2, "test")
    ops = profile["ops"]
    # linear: attn_pre_proj (op 3), attn_post_proj (5), mlp_up_proj (7), mlp_down_proj (9).
    assert ops["linear"]["num_tokens"] == [1, 2, 4]
    assert ops["linear"]["time_s"] == pytest.approx(
        [(3 + 5 + 7 + 9) * n / 2 / 1e6 for n in (1, 2, 4)]
    )
    # elementwise: norms (2, 6), rope (4), act (8), add (10) twice, emb (1) over 32 layers.
    per_layer = 2 + 6 + 4 + 8 + 2 * 10 + 1 / 32
    assert ops["elementwise"]["time_s"] == pytest.approx(
        [per_layer * n / 2 / 1e6 for n in (1, 2, 4)]
    )
    prefill = ops["prefill_attention"]
    assert prefill["num_query_tokens"] == [64, 128]
    assert prefill["num_context_tokens"] == [0, 64]
    want = [[1e-5, 5e-5], [2e-5, 4e-5]]
    assert all(r == pytest.approx(w) for r, w in zip(prefill["time_s"], want, strict=True))
    decode = ops["decode_attention"]
    assert (decode["num_seqs"], decode["context_tokens"]) == ([1, 2], [32, 64])
    want = [[1.1e-5, 1.2e-5], [1.3e-5, 1.5e-5]]
    assert all(r == pytest.approx(w) for r, w in zip(decode["time_s"], want, strict=True))
    assert ops["allreduce"]["num_bytes"] == [2048, 10240, 18432]
    assert ops["allreduce"]["time_s"] == pytest.approx([3e-5, 4e-5, 5e-5])
    assert profile["block_size"] == 16 and profile["tp"] == 2 and profile["model"] == "Llama-2-7B"
    assert "lm_head" not in ops and "store_kv" not in ops  # left to the roofline


def test_tp1_has_no_allreduce_or_attention(tmp_path: Path) -> None:
    ops = vidur_profile(_write(tmp_path), LLAMA, 1, "test")["ops"]
    assert set(ops) == {"linear", "elementwise"}


def test_cli_writes_a_profile_the_cost_model_reads(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    argv = ["profile", "import-vidur", "--vidur-dir", str(_write(tmp_path / "v"))]
    assert main([*argv, "--model", "Llama-2-7B", "--tp", "2", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.tp == 2 and set(profile.ops) >= {"linear", "allreduce", "decode_attention"}
    model = make_cost_model(LLAMA, HARDWARE_PRESETS["A100-80GB"], 2, out, block_size=16)
    terms = model.step_breakdown(StepShape(decode_context_tokens=(32, 64)))
    # Two sequences, mean context 48: halfway between the measured 13 and 15 us, per layer.
    assert terms["decode_attention"] == pytest.approx(32 * 1.4e-5)
    assert terms["linear"] == pytest.approx(32 * 24 * 2 / 2 / 1e6)
    assert json.loads(out.read_text())["command"].startswith("python -m sim profile")


def test_nothing_to_import_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _write(tmp_path)
    with pytest.raises(VidurFileError, match="no measured op fits Llama-3-8B"):
        vidur_profile(root, get_model_preset("Llama-3-8B"), 1, "test")
    argv = ["profile", "import-vidur", "--vidur-dir", str(root), "--model", "Llama-3-8B"]
    assert main([*argv, "--tp", "1", "--out", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_a_gpu_or_node_the_directory_lacks_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _write(tmp_path)
    with pytest.raises(VidurFileError, match=r"no measured ops for --gpu 'h100' \(compute/ holds"):
        vidur_profile(root, LLAMA, 2, "test", gpu="h100")
    with pytest.raises(VidurFileError, match=r"no network/a100_foo/all_reduce\.csv \(--node: dgx"):
        vidur_profile(root, LLAMA, 2, "test", node="foo")
    argv = ["profile", "import-vidur", "--vidur-dir", str(root), "--model", "Llama-2-7B"]
    assert main([*argv, "--tp", "1", "--node", "dgx", "--out", str(tmp_path / "p.json")]) == 0
    assert "note: --node: one GPU (--tp 1) runs no all-reduce" in capsys.readouterr().err
