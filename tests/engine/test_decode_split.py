"""The engine's decode split setting (``EngineConfig.decode_split``): checked, recorded in a
run's settings (which ``sim validate`` reads back), offered on the command line, and carried
to each step's decode plan."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from core.decode_split import DEFAULT_SPLIT
from core.settings import build, flat_settings
from engine.cli import build_parser
from engine.llm_engine import EngineConfig


def test_the_engine_splits_per_sequence_unless_told() -> None:
    assert EngineConfig().decode_split == DEFAULT_SPLIT == "per_sequence"
    assert flat_settings(EngineConfig(decode_split="fixed"))["decode_split"] == "fixed"
    with pytest.raises(ValueError, match="decode_split must be one of"):
        EngineConfig(decode_split="halves")


def test_the_run_command_takes_the_split() -> None:
    args = build_parser().parse_args(["run", "traces/example.csv", "--decode-split", "fixed"])
    assert args.decode_split == "fixed"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "traces/example.csv", "--decode-split", "halves"])


def test_the_engines_split_reaches_the_decode_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting travels engine -> runner and graphs -> each step's metadata -> the kernel's
    plan (planned here only: nothing is launched, so the interpreter is only named)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch

    from engine.attention import _plan_launches, device_metadata, host_metadata
    from engine.cuda_graphs import DecodeGraphs
    from engine.input_batch import StepBuffers
    from engine.llm_engine import LLMEngine
    from tests.engine.graph_case import MAX_LEN, make_case

    engine = LLMEngine(
        build(EngineConfig, weights="random", cpu_kv_cache_gib=0.01, decode_split="fixed")
    )
    assert engine.runner.decode_split == "fixed"
    case = make_case("torch")
    buffers = StepBuffers(case.tables.max_blocks_per_seq, case.kv.device)
    for split in ("per_sequence", "fixed"):
        graphs = DecodeGraphs(
            case.model, case.kv, buffers, (8,), MAX_LEN, "triton", replay=False,
            decode_split=split,
        )  # fmt: skip
        assert graphs._graph_metadata(8).decode_split == split
        host = host_metadata([5, 9], [[0, 1], [2, 3, 4]], [], [], 4)

        def upload(_: str, array: object) -> torch.Tensor:
            return torch.from_numpy(array)  # type: ignore[arg-type]

        meta = device_metadata(host, upload, 4, "triton", decode_split=split)
        k_cache, v_cache = case.kv.layers[0]
        q = torch.zeros(2, 4 * k_cache.shape[2], k_cache.shape[3])
        launches = _plan_launches(q, k_cache, v_cache, meta, 0.5)
        assert launches.decode is not None and launches.decode.split_mode == split
