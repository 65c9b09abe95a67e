"""Piecewise CUDA graphs for mixed and prefill steps, tested without a GPU: the captured token
counts and the size a step picks; the cut forward, padded and run eagerly on CPU
(``MixedGraphs(replay=False)``), against the model's own forward (tests/engine/mixed_case.py;
on the Triton kernels in test_triton_backend.py); an engine whose other steps all run through
the pieces gives the eager engine's tokens; and the setting's checks and flag."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from engine import LLM  # noqa: E402
from engine.cli import build_parser, config_from_args  # noqa: E402
from engine.llm_engine import EngineConfig  # noqa: E402
from engine.mixed_graphs import (  # noqa: E402
    MIXED_MAX_TOKENS,
    MixedGraphs,
    check_mixed_graphs,
    mixed_token_sizes,
)
from engine.sampling import SamplingParams  # noqa: E402
from tests.engine.graph_case import make_case  # noqa: E402
from tests.engine.mixed_case import check_mixed_step  # noqa: E402


def test_token_sizes_follow_vllms_capture_grid_up_to_the_budget() -> None:
    sizes = mixed_token_sizes(8192)
    assert sizes[:6] == (1, 2, 4, 8, 16, 32)
    assert sizes[-3:] == (448, 480, MIXED_MAX_TOKENS)
    assert [b - a for a, b in itertools.pairwise(sizes[4:20])] == [16] * 15
    assert mixed_token_sizes(100) == (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100)
    assert mixed_token_sizes(3) == (1, 2, 3)
    assert mixed_token_sizes(512) == sizes
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1"):
        mixed_token_sizes(0)


def test_a_step_takes_the_smallest_size_that_holds_it() -> None:
    case = make_case("torch")
    mixed = MixedGraphs(case.model, case.kv.layers, (8, 32, 64), "torch", replay=False)
    picks = {n: mixed.size_for(n) for n in (0, 1, 8, 9, 32, 33, 64, 65)}
    assert picks == {0: None, 1: 8, 8: 8, 9: 32, 32: 32, 33: 64, 64: 64, 65: None}
    assert mixed.num_pieces == case.model.config.num_layers + 1
    cfg = case.model.config
    width = 2 * 8 + 4 * (2 * cfg.hidden_size + cfg.q_size * 2 + 2 * cfg.kv_size)  # fp32 rows
    assert mixed.buffer_bytes == 64 * (width + 8)  # ids, positions and slots: int64


@pytest.mark.parametrize("sizes", [(8, 32), (24,)])
def test_the_padded_pieces_give_the_forwards_logits_and_kv(sizes: tuple[int, ...]) -> None:
    assert check_mixed_step(make_case("torch"), sizes) < 1e-4


def test_graphs_need_cuda_and_ascending_sizes() -> None:
    case = make_case("torch")
    model, layers = case.model, case.kv.layers
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        MixedGraphs(model, layers, (8,), "torch", replay=True)
    for bad in ((), (8, 4), (0, 8), (8, 8)):
        with pytest.raises(ValueError, match="sizes must be ascending positive"):
            MixedGraphs(model, layers, bad, "torch", replay=False)
    with pytest.raises(ValueError, match="kv_caches has 1 layers, the model 4"):
        MixedGraphs(model, layers[:1], (8,), "torch", replay=False)
    with pytest.raises(ValueError, match="capture needs replay=True"):
        MixedGraphs(model, layers, (8,), "torch", replay=False).capture()


def test_a_step_larger_than_every_size_is_refused() -> None:
    case = make_case("torch")
    mixed = MixedGraphs(case.model, case.kv.layers, (2,), "torch", replay=False)
    ids = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="a step of 3 tokens fits no size of \\(2,\\)"):
        mixed.run(ids, ids, case.kv.layers, None, ids)  # type: ignore[arg-type]
    other = [(k.clone(), v.clone()) for k, v in case.kv.layers]
    meta = SimpleNamespace(num_tokens=2)
    with pytest.raises(ValueError, match="the KV cache they were built on"):
        mixed.run(ids[:2], ids[:2], other, meta, ids[:1])  # type: ignore[arg-type]


def _greedy(llm: LLM) -> list[list[int]]:
    prompts = [[3, 17, 5, 9, 11, 2, 8, 30, 1], [7] * 21, [4, 4, 2], list(range(40, 77))]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


def test_an_engine_on_the_pieces_gives_the_eager_engines_tokens() -> None:
    settings = {
        "model": "tiny-llama",
        "weights": "random",
        "max_num_seqs": 24,
        "max_num_batched_tokens": 24,
    }
    eager = LLM(**settings)
    pieces = LLM(**settings)
    runner = pieces.engine.runner
    runner.mixed_graphs = MixedGraphs(
        runner.model, runner.kv_cache.layers, mixed_token_sizes(24), runner.backend, replay=False
    )
    calls = 0
    run = runner.mixed_graphs.run

    def counted(*args: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return run(*args)  # type: ignore[arg-type]

    runner.mixed_graphs.run = counted  # type: ignore[method-assign]
    assert _greedy(pieces) == _greedy(eager)
    assert calls > 0, "no step ran on the pieces"


def test_the_setting_is_checked_and_has_a_flag() -> None:
    assert EngineConfig().mixed_graphs == "off"
    with pytest.raises(ValueError, match="mixed_graphs must be one of"):
        check_mixed_graphs("full")
    with pytest.raises(ValueError, match="mixed_graphs must be one of"):
        EngineConfig(mixed_graphs="full")
    with pytest.raises(ValueError, match=r"'piecewise' needs CUDA graphs.*device 'cpu'"):
        EngineConfig(mixed_graphs="piecewise")
    with pytest.raises(ValueError, match=r"needs CUDA graphs.*enforce_eager True"):
        EngineConfig(device="cuda", mixed_graphs="piecewise", enforce_eager=True)
    assert EngineConfig(device="cuda", mixed_graphs="piecewise").mixed_graphs == "piecewise"
    args = build_parser().parse_args(["run", "t.csv", "--mixed-graphs", "piecewise"])
    assert args.mixed_graphs == "piecewise"
    assert config_from_args(build_parser().parse_args(["run", "t.csv"])).mixed_graphs == "off"


def test_an_engine_refuses_piecewise_graphs_on_the_torch_kernels() -> None:
    from engine.llm_engine import LLMEngine

    config = EngineConfig(device="cuda", mixed_graphs="piecewise", backend="torch")
    with pytest.raises(ValueError, match="needs CUDA graphs, which run on the Triton kernels"):
        LLMEngine(config)


def test_a_profile_names_the_piecewise_engine_it_timed() -> None:
    from engine.profiling.measure import engine_kind

    assert engine_kind(SimpleNamespace(graph_stats=None)) == "servesim-eager"  # type: ignore[arg-type]
    graphs = SimpleNamespace(graph_stats=object(), runner=SimpleNamespace(mixed_graphs=None))
    assert engine_kind(graphs) == "servesim-graphs"  # type: ignore[arg-type]
    graphs.runner.mixed_graphs = object()
    assert engine_kind(graphs) == "servesim-piecewise"  # type: ignore[arg-type]


def test_calibrate_takes_the_setting_and_refuses_it_on_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.cli.main import main

    out = tmp_path / "p.json"
    argv = ["calibrate", "--model", "tiny-llama", "--device", "cpu", "--out", str(out)]
    assert main([*argv, "--mixed-graphs", "piecewise", "--quiet"]) == 2
    assert "mixed_graphs 'piecewise' needs CUDA graphs" in capsys.readouterr().err
    assert not out.exists()


def test_validate_takes_the_setting_and_refuses_it_on_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.cli.main import main

    out = tmp_path / "v"
    argv = ["validate", "traces/data/example.csv", "--model", "tiny-llama", "--out", str(out)]
    assert main([*argv, "--mixed-graphs", "piecewise", "--max-requests", "2", "--quiet"]) == 2
    assert "mixed_graphs 'piecewise' needs CUDA graphs" in capsys.readouterr().err
    assert not (out / "validation.json").exists()
