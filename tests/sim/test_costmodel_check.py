"""The kernel cost mechanisms at their limits, the Vidur CSV readers' errors, and
`costmodel check` on a handmade profile directory whose answers are known."""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from core.model.presets import get_model_preset
from sim.cli.main import main
from sim.costmodel.check import AllReduceTable, run_check
from sim.costmodel.kernel_costs import allreduce_s, gemm_s, row_kernel_s
from sim.costmodel.layer_ops import LayerOps
from sim.costmodel.vidur_profiles import (
    MLP_OPS,
    AllReduceRow,
    VidurFileError,
    read_allreduce_csv,
    read_mlp_csv,
)
from sim.specs.hardware import HARDWARE_PRESETS, hardware_for_node

A100 = HARDWARE_PRESETS["A100-80GB"]
LLAMA = get_model_preset("Llama-2-7B")


def test_allreduce_is_latency_bound_for_small_messages() -> None:
    alpha = A100.allreduce_call_latency_s + 2 * A100.interconnect_latency_s
    small = allreduce_s(A100, 1024, 2)
    assert small == pytest.approx(alpha, rel=0.01)
    assert allreduce_s(A100, 2048, 2) == pytest.approx(small, rel=0.01)


def test_allreduce_is_bandwidth_bound_for_large_messages() -> None:
    big = 512 * 2**20
    one, two = allreduce_s(A100, big, 8), allreduce_s(A100, 2 * big, 8)
    assert two / one == pytest.approx(2.0, rel=0.01)
    bus = A100.interconnect_bandwidth_bytes_per_s * A100.interconnect_bus_efficiency
    assert one == pytest.approx(2 * 7 / 8 * big / bus, rel=0.01)


def test_allreduce_beyond_the_nvlink_domain_uses_the_slow_link() -> None:
    pairs = hardware_for_node(A100, "pairwise_nvlink")
    big = 256 * 2**20
    within, across = allreduce_s(pairs, big, 2), allreduce_s(pairs, big, 4)
    assert across > 5 * within  # PCIe at 32 GB/s against NVLink at 300 GB/s
    assert allreduce_s(A100, big, 4, devices_per_node=2) > 5 * allreduce_s(A100, big, 4)
    assert allreduce_s(A100, big, 1) == 0.0
    with pytest.raises(ValueError, match="node type"):
        hardware_for_node(A100, "torus")


def test_gemm_waves_step_every_tile_of_tokens() -> None:
    rows = A100.gemm_tile_tokens
    n, k = 108 * A100.gemm_tile_cols, 8192  # one tile row fills exactly one wave of 108 SMs
    ten_waves, eleven_waves = gemm_s(A100, 10 * rows, n, k, 2), gemm_s(A100, 10 * rows + 1, n, k, 2)
    wave_s = 2 * rows * A100.gemm_tile_cols * k / (312e12 / 108 * A100.gemm_flops_efficiency)
    assert ten_waves == pytest.approx(10 * wave_s + A100.gemm_latency_s)
    assert eleven_waves == pytest.approx(11 * wave_s + A100.gemm_latency_s)
    assert gemm_s(A100, 11 * rows, n, k, 2) == eleven_waves  # same waves, same time
    # One token: a weight read at the streaming efficiency, plus the GEMM's fixed latency.
    n = 12288
    read_s = (n * k + k + n) * 2 / (A100.hbm_bandwidth_bytes_per_s * 0.8)
    assert gemm_s(A100, 1, n, k, 2) == pytest.approx(read_s + A100.gemm_latency_s)


def test_row_kernels_have_a_floor_that_grows_with_the_row() -> None:
    narrow, wide = row_kernel_s(A100, 1.0, 1024), row_kernel_s(A100, 1.0, 28672)
    assert narrow == pytest.approx(A100.kernel_launch_floor_s + A100.dram_latency_s)
    assert wide == pytest.approx(A100.kernel_launch_floor_s + 28 * A100.dram_latency_s)
    big = 1e9
    assert row_kernel_s(A100, big, 4096) == pytest.approx(
        big / (A100.hbm_bandwidth_bytes_per_s * A100.elementwise_bandwidth_efficiency)
    )


_MLP_SHAPE = {
    "n_head": 32,
    "n_kv_head": 32,
    "n_embd": 4096,
    "n_expanded_embd": 11008,
    "vocab_size": 32768,
    "use_gated_mlp": True,
}
_MEASURED_OVER_PREDICTED = 1.25  # the handmade op times are 25% above our predictions
_ALLREDUCE_OVER_PREDICTED = 0.8


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _handmade_dir(root: Path) -> Path:
    """mlp.csv for Llama-2-7B's shape at tp 1 and 2, times 1.25 x our prediction; a DGX
    all_reduce.csv at 2 workers, times 0.8 x our prediction."""
    rows: list[dict[str, object]] = []
    for tp in (1, 2):
        ops = LayerOps(LLAMA, A100, tp)
        for num_tokens in (1, 2, 128):
            row: dict[str, object] = {}
            for op in MLP_OPS:
                row[f"time_stats.{op}.median"] = (
                    ops.op_s(op, num_tokens) * 1e3 * _MEASURED_OVER_PREDICTED
                )
            row |= _MLP_SHAPE | {"num_tokens": num_tokens, "num_tensor_parallel_workers": tp}
            rows.append(row)
    _write_csv(root / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv", rows)
    network = []
    for size in range(2048, 4096 * 128 * 2 + 8192, 8192):
        predicted = allreduce_s(A100, size, 2, 2)
        network.append(
            {
                "time_stats.all_reduce.median": predicted * 1e3 * _ALLREDUCE_OVER_PREDICTED,
                "rank": 0,
                "num_workers": 2,
                "size": size,
                "collective": "all_reduce",
                "devices_per_node": 2,
            }
        )
    _write_csv(root / "network/a100_dgx/all_reduce.csv", network)
    return root


def test_check_on_a_handmade_directory_gives_the_known_errors(tmp_path: Path) -> None:
    result = run_check(_handmade_dir(tmp_path), LLAMA, A100)
    by_kind: dict[str, list[float]] = {}
    for c in result.comparisons:
        by_kind.setdefault(c.kind, []).append(c.error_pct)
    for kind in ("linear", "elementwise"):
        assert by_kind[kind] == pytest.approx([-20.0] * len(by_kind[kind]))
    assert by_kind["allreduce"] == pytest.approx([25.0] * len(by_kind["allreduce"]))
    steps = {c.shape: c for c in result.comparisons if c.kind.endswith("_step")}
    assert steps["tp=1 batch=1 (ops)"].error_pct == pytest.approx(-20.0)
    assert steps["tp=1 tokens=128 (ops)"].error_pct == pytest.approx(-20.0)
    # tp 2: ops measured 1.25x, the two all-reduces a layer 0.8x; worked out by hand.
    step = steps["tp=2 batch=2 (ops+allreduce)"]
    ops = LayerOps(LLAMA, A100, 2)
    layer = sum(ops.op_s(op, 2) for op in MLP_OPS if op != "emb") + ops.op_s("add", 2)
    allreduce = 2 * allreduce_s(A100, 2 * 4096 * 2, 2)
    predicted = 32 * (layer + allreduce) + ops.op_s("emb", 2)
    measured = 32 * (1.25 * layer + 0.8 * allreduce) + 1.25 * ops.op_s("emb", 2)
    assert step.predicted_s == pytest.approx(predicted)
    # The step takes the median of the 5 measured sizes nearest its message (+-16 KiB here).
    assert step.measured_s == pytest.approx(measured, rel=1e-3)
    assert {"decode_step", "prefill_step"} <= set(by_kind)


def test_check_cli_prints_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "check.json"
    argv = ["costmodel", "check", "--vidur-dir", str(_handmade_dir(tmp_path / "v"))]
    argv += ["--model", "Llama-2-7B", "--hardware", "A100-80GB", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "mlp_up_proj" in printed and "decode_step" in printed
    payload = json.loads(out.read_text())
    linear = next(r for r in payload["summary_by_kind"] if r["kind"] == "linear")
    assert linear["median_abs_error_pct"] == pytest.approx(20.0)
    assert linear["bias_pct"] == pytest.approx(-20.0)


def test_malformed_csv_names_file_line_and_column(tmp_path: Path) -> None:
    root = _handmade_dir(tmp_path)
    mlp = root / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
    text = mlp.read_text().splitlines()
    header = text[0].split(",")
    column = header.index("time_stats.mlp_up_proj.median")
    cells = text[2].split(",")
    cells[column] = "fast"
    text[2] = ",".join(cells)
    mlp.write_text("\n".join(text) + "\n")
    with pytest.raises(VidurFileError, match=r"mlp\.csv: line 3: column 'time_stats\.mlp_up_proj"):
        read_mlp_csv(mlp)


def test_missing_column_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _handmade_dir(tmp_path)
    network = root / "network/a100_dgx/all_reduce.csv"
    lines = network.read_text().splitlines()
    network.write_text("\n".join([lines[0].replace("num_workers", "workers"), *lines[1:]]))
    with pytest.raises(VidurFileError, match=r"all_reduce\.csv: missing column 'num_workers'"):
        read_allreduce_csv(network)
    argv = ["costmodel", "check", "--vidur-dir", str(root), "--model", "Llama-2-7B"]
    assert main([*argv, "--hardware", "A100-80GB"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "all_reduce.csv" in err and "num_workers" in err


def test_bad_tp_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _handmade_dir(tmp_path)
    argv = ["costmodel", "check", "--vidur-dir", str(root), "--model", "Llama-2-70B"]
    assert main([*argv, "--hardware", "A100-80GB", "--tp", "3"]) == 2
    assert "tp=3" in capsys.readouterr().err


def test_pairwise_node_changes_only_the_wiring() -> None:
    # The NVLink pair node type changes only the wiring, nothing a single GPU does.
    pairs = hardware_for_node(A100, "pairwise_nvlink")
    network = {
        "nvlink_domain_size": 8,
        "scale_out_bandwidth_bytes_per_s": 10e9,
        "scale_out_latency_s": A100.scale_out_latency_s,
        "scale_out_bus_efficiency": A100.scale_out_bus_efficiency,
    }
    assert replace(pairs, **network) == A100
    assert math.isclose(A100.scale_out_bandwidth_bytes_per_s, 10e9)


def test_allreduce_over_pcie_uses_its_own_hop_and_bus_efficiency() -> None:
    # Two NVLink pairs joined by PCIe gen4, 4 ranks: 6 ring steps, each waiting for a PCIe hop.
    pairs = hardware_for_node(A100, "pairwise_nvlink")
    hop, bus = pairs.scale_out_latency_s, pairs.scale_out_bus_efficiency
    assert (hop, bus) == (4e-6, 0.75)
    alpha = 35e-6 + 6 * 4e-6
    assert allreduce_s(pairs, 1024, 4) == pytest.approx(alpha + 6 / 4 * 1024 / (32e9 * 0.75))
    big = 256 * 2**20  # bandwidth-bound: 24 of 32 GB/s (Vidur's PCIe rows measure 23.6)
    assert allreduce_s(pairs, big, 4) == pytest.approx(6 / 4 * big / 24e9, rel=0.01)
    # Within a pair nothing changed: NVLink's hop and bus efficiency.
    assert allreduce_s(pairs, big, 2) == allreduce_s(A100, big, 2)


def test_rotary_streams_at_its_own_efficiency() -> None:
    ops = LayerOps(LLAMA, A100)
    num_tokens = 8192  # far above the row floor: bandwidth-bound
    # Rotary reads and writes Q and K: 2 x (4096 + 4096) values of 2 bytes per token.
    num_bytes = num_tokens * 2 * (4096 + 4096) * 2
    expected = num_bytes / (A100.hbm_bandwidth_bytes_per_s * A100.rotary_bandwidth_efficiency)
    assert ops.op_s("attn_rope", num_tokens) == pytest.approx(expected)
    slower = replace(A100, rotary_bandwidth_efficiency=A100.rotary_bandwidth_efficiency / 2)
    assert LayerOps(LLAMA, slower).op_s("attn_rope", num_tokens) == pytest.approx(2 * expected)
    # The other row kernels keep the elementwise efficiency.
    assert LayerOps(LLAMA, slower).op_s("mlp_act", num_tokens) == ops.op_s("mlp_act", num_tokens)
    with pytest.raises(ValueError, match=r"HardwareSpec\.rotary_bandwidth_efficiency"):
        replace(A100, rotary_bandwidth_efficiency=0.0)


def test_allreduce_table_mixture_is_the_local_mean() -> None:
    times = [1.0, 3.0] * 10  # two modes, alternating size by size
    rows = [AllReduceRow(10 * i, 2, 2, t) for i, t in enumerate(times)]
    median = AllReduceTable(rows, 2)
    mixture = AllReduceTable(rows, 2, mixture=True)
    assert median(100) in (1.0, 3.0)  # 5 neighbours alternate: the majority mode
    assert mixture(100) == pytest.approx(2.0, abs=0.15)  # 15 neighbours: 7 or 8 of each
    assert mixture(1000) is None


VIDUR = Path(__file__).resolve().parents[3] / "shared/profiles/vidur"


@pytest.mark.shared
@pytest.mark.parametrize("model", ["Llama-2-7B", "Llama-3-70B"])
def test_real_a100_files_stay_within_the_targets(model: str) -> None:
    if not VIDUR.is_dir():
        pytest.skip("../shared/profiles/vidur is absent")
    result = run_check(VIDUR, get_model_preset(model), A100, tp=1)
    errors: dict[str, list[float]] = {}
    for c in result.comparisons:
        errors.setdefault(c.kind, []).append(abs(c.error_pct))
    medians = {kind: sorted(e)[len(e) // 2] for kind, e in errors.items()}
    assert medians["linear"] <= 10.0
    assert medians["elementwise"] <= 15.0
    assert medians["prefill_step"] <= 10.0


def test_embedding_walks_few_indices_one_by_one() -> None:
    ops = LayerOps(LLAMA, A100)
    # Up to 16 tokens: launch floor plus one dependent fetch per index (hand computation).
    assert ops.op_s("emb", 1) == pytest.approx(2e-6 + 7.5e-7)
    assert ops.op_s("emb", 16) == pytest.approx(2e-6 + 16 * 7.5e-7)
    # Linear in the tokens below the switch, and the step is the index_select kernel's switch.
    small = [ops.op_s("emb", t) for t in range(1, 17)]
    assert all(b - a == pytest.approx(7.5e-7) for a, b in itertools.pairwise(small))
    assert ops.op_s("emb", 17) < ops.op_s("emb", 16)
    moved = replace(A100, small_index_max_rows=8)
    assert LayerOps(LLAMA, moved).op_s("emb", 16) < ops.op_s("emb", 16)
    with pytest.raises(ValueError, match=r"HardwareSpec\.small_index_row_s"):
        replace(A100, small_index_row_s=-1e-9)
    with pytest.raises(ValueError, match=r"HardwareSpec\.small_index_max_rows"):
        replace(A100, small_index_max_rows=-1)
    # 0 turns the small-index path off: one token is a row gather like seventeen.
    off = LayerOps(LLAMA, replace(A100, small_index_max_rows=0))
    assert off.op_s("emb", 1) == pytest.approx(
        row_kernel_s(A100, 6 * LLAMA.hidden_size * LLAMA.dtype_bytes, LLAMA.hidden_size, 0.43)
    )


def test_embedding_gather_streams_at_its_own_efficiency() -> None:
    ops = LayerOps(LLAMA, A100)
    num_tokens = 8192  # bandwidth-bound: 6 row passes of 4096 fp16 values per token
    num_bytes = num_tokens * 6 * 4096 * 2
    expected = num_bytes / (A100.hbm_bandwidth_bytes_per_s * A100.embedding_bandwidth_efficiency)
    assert ops.op_s("emb", num_tokens) == pytest.approx(expected)
    slower = replace(A100, embedding_bandwidth_efficiency=A100.embedding_bandwidth_efficiency / 2)
    assert LayerOps(LLAMA, slower).op_s("emb", num_tokens) == pytest.approx(2 * expected)
    assert LayerOps(LLAMA, slower).op_s("mlp_act", num_tokens) == ops.op_s("mlp_act", num_tokens)
    with pytest.raises(ValueError, match=r"HardwareSpec\.embedding_bandwidth_efficiency"):
        replace(A100, embedding_bandwidth_efficiency=1.5)


def test_residual_add_streams_three_tensors_at_the_streaming_efficiency() -> None:
    ops = LayerOps(LLAMA, A100)
    num_tokens = 8192  # two reads and one write of 4096 fp16 values per token
    num_bytes = num_tokens * 3 * 4096 * 2
    expected = num_bytes / (A100.hbm_bandwidth_bytes_per_s * A100.streaming_bandwidth_efficiency)
    assert ops.op_s("add", num_tokens) == pytest.approx(expected)
    # Few tokens: the launch floor, whatever the efficiency.
    assert ops.op_s("add", 1) == A100.kernel_launch_floor_s
    # Weight reads keep the memory efficiency: the add's constant does not move a GEMM.
    slower = replace(A100, streaming_bandwidth_efficiency=0.5)
    assert LayerOps(LLAMA, slower).op_s("mlp_down_proj", 8) == ops.op_s("mlp_down_proj", 8)
    assert LayerOps(LLAMA, slower).op_s("add", num_tokens) > ops.op_s("add", num_tokens)
    with pytest.raises(ValueError, match=r"HardwareSpec\.streaming_bandwidth_efficiency"):
        replace(A100, streaming_bandwidth_efficiency=0.0)


def test_a_model_no_measured_op_fits_is_an_error_not_an_all_reduce_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The handmade directory measured Llama-2-7B's ops: for Qwen3-8B only the all-reduce
    table, which is no model's, would be left to compare."""
    root = _handmade_dir(tmp_path)
    argv = ["costmodel", "check", "--vidur-dir", str(root), "--hardware", "A100-80GB"]
    assert main([*argv, "--model", "Qwen3-8B"]) == 2
    err = capsys.readouterr().err
    assert "no measured GPU op fits Qwen3-8B (read: network/dgx)" in err
    assert main([*argv, "--model", "Llama-2-7B", "--tp", "4"]) == 2
    assert "no measured GPU op fits Llama-2-7B at --tp 4 (read: mlp, network/dgx)" in (
        capsys.readouterr().err
    )
