"""The engine's warm-up requests (``engine.warm_up``): the shapes warm-up walks every decode
batch size down from ``max_num_seqs`` to 1 over short and long prompts, shrinks to what the
cache holds, fits every request in the model, and runs on the engine without touching its
own scheduler."""

from __future__ import annotations

import pytest

from core.settings import build
from engine.warm_up import SHAPES_LONG_PROMPT_TOKENS, shape_requests, short_request

torch = pytest.importorskip("torch")

from engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402


def _decode_batch_sizes(requests: list[tuple[int, int]]) -> set[int]:
    """The decode batch sizes when every request is prefilled in one step (which gives each its
    first token)."""
    longest = max(outputs for _, outputs in requests)
    return {sum(1 for _, o in requests if o > step) for step in range(1, longest)}


def test_the_shapes_cover_every_decode_batch_size_with_long_prompts_among_them() -> None:
    requests = shape_requests(256, 8192, usable_blocks=55_800, block_size=16)
    assert len(requests) == 256
    assert _decode_batch_sizes(requests) == set(range(1, 257))
    prompts = {prompt for prompt, _ in requests}
    assert set(SHAPES_LONG_PROMPT_TOKENS) < prompts
    assert sum(p for p, _ in requests) < 100_000  # about 9 chunks of 8192 tokens to prefill


def test_the_shapes_halve_until_the_cache_holds_them() -> None:
    requests = shape_requests(256, 8192, usable_blocks=600, block_size=16)
    assert 0 < len(requests) < 256
    assert sum(-(-(p + o) // 16) for p, o in requests) <= 0.9 * 600
    assert _decode_batch_sizes(requests) == set(range(1, len(requests) + 1))
    assert shape_requests(256, 8192, usable_blocks=1, block_size=16) == []


def test_every_shape_fits_a_short_model() -> None:
    requests = shape_requests(64, 100, usable_blocks=10_000, block_size=16)
    assert requests and all(p + o <= 100 and p >= 1 for p, o in requests)
    assert short_request(3) == (1, 2)
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        shape_requests(0, 100, 10, 16)


def test_the_shapes_warm_up_runs_every_decode_batch_size_and_leaves_the_engine_alone() -> None:
    config = build(
        EngineConfig,
        model="tiny-llama",
        weights="random",
        policy="chunked",
        max_num_seqs=12,  # one prefill step of 12 prompts, then decodes of 12, 11, ... 1
        num_blocks=2048,
    )
    engine = LLMEngine(config)
    scheduler = engine.scheduler
    free_before = scheduler.kv.allocator.num_free_blocks
    batches: list[int] = []
    step = engine.step

    def recording_step(now_s: float) -> object:
        output = step(now_s=now_s)
        batches.append(output.batch.num_decode_tokens)
        return output

    engine.step = recording_step  # type: ignore[method-assign,assignment]
    assert engine.warm_up() == len(batches) <= 5  # by default the short request alone
    batches.clear()
    num_steps = engine.warm_up(shapes=True)
    assert num_steps == len(batches) > 12
    assert set(range(1, 13)) <= set(batches)
    assert engine.scheduler is scheduler and not scheduler.has_unfinished()
    assert scheduler.step_idx == 0
    assert scheduler.kv.allocator.num_free_blocks == free_before
    assert engine._sampling == {}
