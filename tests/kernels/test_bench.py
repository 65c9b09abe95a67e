"""The benchmark's CPU-side behaviour: the sweep it plans, its exit without a GPU, and the
block-size comparison it reports (the timings themselves need a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels import bench  # noqa: E402


def test_dry_run_lists_every_family(capsys):
    assert bench.main(["--dry-run", "--quick"]) == 0
    families = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert families == {"decode", "prefill", "cache"}


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
