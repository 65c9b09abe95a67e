"""The benchmark's CPU-side behaviour: the sweep it plans, its arguments, its exit without a GPU,
the verdicts and lines it reports, and the calls it times inside CUDA graphs run on CPU under
the interpreter (the timings themselves need a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels import bench, bench_graph  # noqa: E402
from kernels.paged_attention import paged_decode_attention  # noqa: E402
from kernels.reference import paged_decode_attention_ref  # noqa: E402


def test_dry_run_lists_every_family(capsys):
    assert bench.main(["--dry-run", "--quick"]) == 0
    families = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert families == {"decode", "prefill", "cache", "graph", "split", "fused"}


@pytest.mark.parametrize("family", ["graph", "fused"])
def test_only_one_family(capsys, family):
    assert bench.main(["--dry-run", "--only", family]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and {line.split()[0] for line in lines} == {family}


def test_unknown_family_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--dry-run", "--only", "rmsnorm"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'rmsnorm'" in capsys.readouterr().err


@pytest.mark.parametrize("quick", [True, False])
def test_graph_shapes_are_the_small_decodes(quick):
    shapes = bench_graph.graph_decode_shapes(quick)
    assert {s["batch"] for s in shapes} >= {1, 16}
    for shape in shapes:
        assert 1 <= shape["batch"] <= 16 and shape["context"] <= 2048
        # the eager decode family judges these sizes by the same 20 us target
        assert shape["batch"] * shape["context"] < bench.DECODE_MEDIUM_TOKENS


def test_fused_shapes_cover_every_op_at_decode_and_prefill_sizes():
    for quick in (True, False):
        shapes = bench_graph.fused_shapes(quick)
        for op in bench_graph.FUSED_OPS:
            tokens = {s["tokens"] for s in shapes if s["op"] == op}
            assert min(tokens) == 1 and max(tokens) >= 2048


@pytest.mark.parametrize(("batch", "context"), [(1, 128), (4, 1024), (16, 2048), (256, 8192)])
def test_kv_copies_keep_the_graphs_reads_out_of_l2(batch, context):
    copies = bench_graph.kv_copies(batch, context)
    kv_bytes = 2 * batch * context * bench.NUM_KV_HEADS * bench.HEAD_DIM * bench.ELEMENT_BYTES
    assert 1 <= copies <= bench_graph.MAX_KV_COPIES
    assert copies * kv_bytes >= bench_graph.COLD_KV_BYTES or copies == 1
    assert (copies - 1) * kv_bytes < bench_graph.COLD_KV_BYTES  # no more than needed


def test_every_graph_shape_reads_more_kv_than_any_l2():
    for shape in bench_graph.graph_decode_shapes(quick=False):
        copies = bench_graph.kv_copies(shape["batch"], shape["context"])
        kv_bytes = 2 * shape["batch"] * shape["context"] * bench.NUM_KV_HEADS * bench.HEAD_DIM * 2
        assert copies * kv_bytes >= 256 << 20, shape


def test_fused_bytes():
    assert bench_graph.fused_bytes("add_rms_norm", 1) == 5 * 4096 * 2
    assert bench_graph.fused_bytes("silu_and_mul", 2) == 6 * 14336 * 2
    assert bench_graph.fused_bytes("rotary", 1) == (2 * 40 * 128 + 128) * 2
    with pytest.raises(ValueError, match="unknown fused op 'gelu'"):
        bench_graph.fused_bytes("gelu", 1)


@pytest.mark.parametrize("op", bench_graph.FUSED_OPS)
def test_fused_and_unfused_calls_compute_the_same(op):
    """What the benchmark compares is the same computation (CPU, fp32, Triton interpreted)."""
    torch.manual_seed(0)
    fused, _ = bench_graph.fused_calls(op, 3, device="cpu", dtype=torch.float32)
    torch.manual_seed(0)
    _, unfused = bench_graph.fused_calls(op, 3, device="cpu", dtype=torch.float32)
    expected = unfused()
    assert expected.abs().mean() > 0.1
    torch.testing.assert_close(fused(), expected, atol=1e-5, rtol=1e-5)


def test_decode_graph_call_cycles_through_disjoint_blocks():
    shape = {"batch": 2, "context": 40, "block_size": 16}
    torch.manual_seed(0)
    run = bench_graph.decode_graph_call(shape, copies=3, device="cpu", dtype=torch.float32)
    outs = [run() for _ in range(4)]
    assert torch.equal(outs[0], outs[3])  # the fourth call is back on the first copy
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])
    # The copies are the halves of one shuffled cache: rebuild it and check one by reference.
    torch.manual_seed(0)
    k_cache, v_cache, tables = bench.paged_cache(6, 40, 16, "cpu", torch.float32)
    q = torch.randn(2, bench.NUM_Q_HEADS, bench.HEAD_DIM)
    lens = torch.full((2,), 40, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables[2:4], lens, bench.HEAD_DIM**-0.5)
    torch.testing.assert_close(outs[1], paged_decode_attention_ref(*args), atol=1e-5, rtol=1e-5)
    assert torch.equal(outs[1], paged_decode_attention(*args, max_seq_len=40))


def test_split_calls_compute_the_same_attention_in_both_modes():
    """The split benchmark compares two plans of one computation: one 40-token context among
    two of 16, planned for 512 tokens (CPU, fp32, Triton interpreted), against the reference."""
    shape = {"batch": 3, "long": 40, "short": 16, "plan_len": 512, "block_size": 16}
    torch.manual_seed(0)
    calls = bench_graph.split_calls(shape, device="cpu", dtype=torch.float32)
    assert set(calls) == {"per_sequence", "fixed"}
    per_sequence, fixed = calls["per_sequence"](), calls["fixed"]()
    torch.manual_seed(0)
    k_cache, v_cache, tables = bench.paged_cache(3, 40, 16, "cpu", torch.float32)
    q = torch.randn(3, bench.NUM_Q_HEADS, bench.HEAD_DIM)
    lens = torch.tensor([40, 16, 16], dtype=torch.int32)
    expected = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, bench.HEAD_DIM**-0.5)
    torch.testing.assert_close(per_sequence, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fixed, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("quick", [True, False])
def test_split_shapes_put_one_long_context_among_short_ones(quick):
    shapes = bench_graph.split_shapes(quick)
    assert {s["batch"] for s in shapes} >= {1, 8}
    for shape in shapes:
        assert shape["long"] > shape["short"] and shape["plan_len"] >= shape["long"]


def test_format_row_shows_graph_and_torch_columns():
    row = bench.Row("rotary", {"tokens": 64}, 31.0, bandwidth_gbs=12.5, graph_us=2.25)
    row.torch_us, row.torch_graph_us = 60.0, 7.5
    row.verdicts["fused<=torch in graph"] = True
    line = bench.format_row(row)
    assert "graph     2.25 us" in line and "torch     60.0 us, graph     7.50 us" in line
    assert line.endswith("fused<=torch in graph:PASS") and "12.5 GB/s" in line
    split = bench.Row("decode_split", {"batch": 8}, 9.0, graph_us=4.5, baseline_graph_us=7.25)
    assert "graph     4.50 us baseline graph     7.25 us" in bench.format_row(split)
    bare = bench.format_row(bench.Row("decode_graph", {"batch": 1}, 5.0))
    assert "GB/s" not in bare and "TF/s" not in bare


def test_decode_sweep_respects_the_kv_budget():
    shapes = bench.decode_shapes(quick=False, max_kv_tokens=1 << 16)
    assert shapes and all(s["batch"] * s["context"] <= 1 << 16 for s in shapes)
    assert {s["block_size"] for s in shapes} == {16, 128}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_cuda_exits_2_with_a_message(capsys):
    assert bench.main(["--only", "cache"]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_block_size_verdicts_flag_slow_small_blocks():
    def row(block_size: int, us: float) -> bench.Row:
        return bench.Row("decode", {"batch": 4, "context": 2048, "block_size": block_size}, us)

    assert list(bench.block_size_verdicts([row(16, 11.4), row(128, 10.0)]).values()) == [True]
    assert list(bench.block_size_verdicts([row(16, 11.6), row(128, 10.0)]).values()) == [False]
