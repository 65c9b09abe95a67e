"""CUDA graphs for decode, tested without a GPU: the captured batch sizes and the bucket a
step picks, and the padded bucket run eagerly on CPU (``DecodeGraphs(replay=False)``): its
real rows get the unpadded step's logits, bit-identical whatever the padding rows hold, and
the padding rows touch no KV slot; an engine whose decodes all go through buckets gives
``transformers``' greedy tokens (tests/engine/test_engine.py); graphs are off on CPU and with
``enforce_eager``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine import LLM  # noqa: E402
from engine.cli import build_parser, config_from_args  # noqa: E402
from engine.cuda_graphs import (  # noqa: E402
    GRAPH_MAX_BATCH,
    DecodeGraphs,
    graph_batch_sizes,
    padded_batch_size,
)
from engine.input_batch import StepBuffers  # noqa: E402
from engine.llm_engine import EngineConfig  # noqa: E402
from tests.engine.graph_case import MAX_LEN, DecodeCase, check_padded_bucket, make_case  # noqa: E402


def test_batch_sizes_are_vllms_buckets() -> None:
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(3) == (1, 2, 3)
    assert graph_batch_sizes(8) == (1, 2, 4, 8)
    assert graph_batch_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert graph_batch_sizes(256) == (1, 2, 4, 8, *range(16, 257, 8))
    assert graph_batch_sizes(100)[-3:] == (88, 96, 100)
    assert graph_batch_sizes(10_000)[-1] == GRAPH_MAX_BATCH == 512
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        graph_batch_sizes(0)


def test_a_step_takes_the_smallest_bucket_that_holds_it() -> None:
    sizes = graph_batch_sizes(40)
    picks = {n: padded_batch_size(sizes, n) for n in (0, 1, 2, 3, 5, 8, 9, 16, 17, 40, 41)}
    assert picks == {0: None, 1: 1, 2: 2, 3: 4, 5: 8, 8: 8, 9: 16, 16: 16, 17: 24, 40: 40, 41: None}


@pytest.fixture(scope="module")
def case() -> DecodeCase:
    return make_case("torch")


@pytest.mark.parametrize("size", [8, 16])
def test_a_padded_bucket_gives_the_real_rows_their_logits(case: DecodeCase, size: int) -> None:
    check_padded_bucket(case, size)


def test_graphs_need_cuda_to_replay(case: DecodeCase) -> None:
    model, kv, tables = case.model, case.kv, case.tables
    buffers = StepBuffers(tables.max_blocks_per_seq, torch.device("cpu"))
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(model, kv, buffers, (1, 2), MAX_LEN, "torch", replay=True)
    eager = DecodeGraphs(model, kv, buffers, (1, 2), MAX_LEN, "torch", replay=False)
    with pytest.raises(ValueError, match="capture needs replay=True"):
        eager.capture()


def test_graphs_are_off_on_cpu_and_with_enforce_eager() -> None:
    engine = LLM(model="tiny-llama", weights="random", enforce_eager=True).engine
    assert engine.config.enforce_eager and engine.runner.graphs is None
    assert engine.graph_stats is None
    assert LLM(model="tiny-llama", weights="random").engine.runner.graphs is None
    assert not EngineConfig().enforce_eager
    args = build_parser().parse_args(["run", "trace.csv", "--enforce-eager"])
    assert config_from_args(args).enforce_eager
    assert not config_from_args(build_parser().parse_args(["run", "trace.csv"])).enforce_eager
