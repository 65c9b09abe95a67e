"""The engine's CUDA graphs on a real GPU (skipped without one; run by
``python -m engine gpu-check``): captured for every bucket with a fixed split count, the
decode steps replaying them give the eager engine's greedy tokens, the padding writes no KV
slot, and the KV cache is sized after their memory; the piecewise graphs of mixed steps
(``--mixed-graphs piecewise``), replayed, give the forward's logits and the eager engine's
tokens."""

from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")

from engine import LLM, SamplingParams  # noqa: E402
from engine.cuda_graphs import graph_batch_sizes  # noqa: E402
from engine.mixed_graphs import mixed_token_sizes  # noqa: E402
from tests.engine.graph_case import check_padded_bucket, make_case  # noqa: E402
from tests.engine.mixed_case import check_mixed_step  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs CUDA and TRITON_INTERPRET=0",
    ),
]
PROMPTS = [[5 + i, 9, 13 * i % 200 + 3, 7] * (1 + i % 5) for i in range(12)]


def _llm(**kwargs: object) -> LLM:
    return LLM(  # type: ignore[arg-type]
        model="tiny-llama", weights="random", device="cuda", dtype="float32", max_num_seqs=24,
        num_blocks=512, **kwargs,
    )  # fmt: skip


def test_graph_decodes_give_the_eager_engines_tokens() -> None:
    params = [SamplingParams(max_tokens=2 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    graphs = _llm()
    stats = graphs.engine.graph_stats
    assert stats is not None and stats.num_graphs == len(graph_batch_sizes(24))
    assert stats.memory_bytes > 0 and stats.capture_s > 0
    runner = graphs.engine.runner
    assert runner.graphs is not None
    splits = {size: runner.graphs.num_splits(size) for size in runner.graphs.sizes}
    assert splits[1] >= splits[24] >= 1, splits
    sizes: list[int] = []
    run = runner.graphs.run
    runner.graphs.run = lambda host, size: sizes.append(size) or run(host, size)  # type: ignore[method-assign]
    got = [o.outputs[0].token_ids for o in graphs.generate(PROMPTS, params)]
    eager = _llm(enforce_eager=True)
    assert eager.engine.runner.graphs is None
    assert got == [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)]
    assert len(set(sizes)) >= 3, sorted(set(sizes))


@pytest.mark.gpu_memory
def test_the_kv_cache_is_sized_after_the_graphs() -> None:
    with_graphs = LLM(model="tiny-llama", weights="random", device="cuda", max_num_seqs=64)
    blocks = with_graphs.engine.cache_config.num_blocks
    stats = with_graphs.engine.graph_stats
    del with_graphs
    gc.collect()  # (the engine and its runner refer to each other)
    torch.cuda.empty_cache()
    eager = LLM(
        model="tiny-llama", weights="random", device="cuda", max_num_seqs=64, enforce_eager=True
    )
    assert stats is not None and eager.engine.cache_config.num_blocks > blocks


@pytest.mark.parametrize("size", [8, 16])
def test_a_replayed_padded_bucket_gives_the_real_rows_their_logits(size: int) -> None:
    check_padded_bucket(make_case("triton", "cuda"), size, replay=True)


@pytest.mark.parametrize("sizes", [(8, 32), (24,)])
def test_replayed_pieces_give_a_mixed_steps_logits(sizes: tuple[int, ...]) -> None:
    check_mixed_step(make_case("triton", "cuda"), sizes, replay=True)


def test_mixed_steps_on_the_pieces_give_the_eager_engines_tokens() -> None:
    params = [SamplingParams(max_tokens=2 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    pieces = _llm(mixed_graphs="piecewise", max_num_batched_tokens=64)
    runner = pieces.engine.runner
    assert runner.mixed_graphs is not None
    assert runner.mixed_graphs.sizes == mixed_token_sizes(64)
    stats = pieces.engine.graph_stats
    num_pieces = len(mixed_token_sizes(64)) * (pieces.engine.model.config.num_layers + 1)
    assert stats is not None and stats.num_graphs == len(graph_batch_sizes(24)) + num_pieces
    calls: list[int] = []
    run = runner.mixed_graphs.run
    runner.mixed_graphs.run = lambda *a: calls.append(len(a[0])) or run(*a)  # type: ignore[method-assign]
    got = [o.outputs[0].token_ids for o in pieces.generate(PROMPTS, params)]
    eager = _llm(enforce_eager=True, max_num_batched_tokens=64)
    assert got == [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)]
    assert calls, "no step ran on the pieces"
