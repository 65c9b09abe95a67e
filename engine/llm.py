"""The offline Python API, in vLLM's convention: ``LLM(...).generate(prompts, params)``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.request import Request, RequestStatus
from core.settings import build
from engine.llm_engine import EngineConfig, LLMEngine
from engine.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One sample of a request: its index among the ``n`` and the tokens it generated."""

    index: int
    token_ids: list[int]
    finish_reason: str  # "length" or "stop"


@dataclass(frozen=True, slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_preemptions: int
    num_prefix_hit_tokens: int


class LLM:
    """A model on the real engine, driven by the shared core.

    ``model`` is a preset name (``tiny-llama``, the default) or a local Hugging Face
    directory. The other keyword arguments are `EngineConfig`'s settings by name, the same
    names as the flags of ``python -m engine run`` (``block_size=32``, ``policy="continuous"``,
    ``enable_prefix_caching=True``, ``weights="random"`` for seeded random weights...); each
    left out keeps the config's default.
    """

    def __init__(self, model: str | None = None, **settings: Any) -> None:
        given = settings if model is None else {"model": model, **settings}
        self.engine = LLMEngine(build(EngineConfig, given))
        self._next_id = 0

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (all arrive now); outputs come back in prompt order."""
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompt_token_ids)
        else:
            params = list(sampling_params)
            if len(params) != len(prompt_token_ids):
                raise ValueError(
                    f"{len(params)} sampling params for {len(prompt_token_ids)} prompts"
                )
        engine = self.engine
        now = engine.clock()
        requests: list[Request] = []
        for prompt, param in zip(prompt_token_ids, params, strict=True):
            request_id = str(self._next_id)
            self._next_id += 1
            request = engine.add_request(request_id, list(prompt), param, now)
            if request.status is RequestStatus.REJECTED:
                for queued in requests:
                    engine.scheduler.abort(queued.request_id, now)
                raise ValueError(f"prompt {len(requests)}: {request.reject_reason}")
            requests.append(request)
        engine.scheduler.mark_arrivals_done()
        while engine.has_unfinished():
            batch = engine.step().batch
            if batch.is_empty and batch.next_wakeup_s is not None:
                time.sleep(max(0.0, batch.next_wakeup_s - engine.clock()))
        engine.scheduler.arrivals_done = False
        return [_output(request, engine.eos_token_ids) for request in requests]


def _output(request: Request, eos_token_ids: frozenset[int]) -> RequestOutput:
    samples = []
    for index, seq_id in enumerate(request.seq_ids):
        tokens = list(request.output_token_ids.get(seq_id, []))
        done = len(tokens) >= request.max_output_tokens
        stopped = not done and bool(tokens) and tokens[-1] in eos_token_ids
        samples.append(CompletionOutput(index, tokens, "stop" if stopped else "length"))
    assert request.prompt_token_ids is not None
    return RequestOutput(
        request.request_id,
        list(request.prompt_token_ids),
        samples,
        request.num_preemptions,
        request.num_prefix_hit_tokens,
    )
