"""The offline Python API, in vLLM's convention: ``LLM(...).generate(prompts, params)``."""

from __future__ import annotations

import operator
import time
from collections.abc import Iterable, Sequence
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
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (all arrive now); outputs come back in prompt order.
        ``priority``, one per prompt as vLLM's, orders them under
        ``scheduling_policy="priority"`` (lower first)."""
        prompts = token_id_lists(prompt_token_ids)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts):
            raise ValueError(f"{len(priorities)} priorities for {len(prompts)} prompts")
        engine = self.engine
        now = engine.clock()
        requests: list[Request] = []
        for prompt, param, rank in zip(prompts, params, priorities, strict=True):
            request_id = str(self._next_id)
            self._next_id += 1
            request = engine.add_request(request_id, prompt, param, now, priority=rank)
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


def token_id_lists(prompts: object) -> list[list[int]]:
    """``prompts`` as lists of token ids, or a ``TypeError`` that says what was given: this
    engine has no tokenizer, so a prompt is a list of ints (a ``str`` is the usual mistake)."""
    hint = (
        "LLM.generate takes prompts as lists of token ids (list[list[int]]); this engine has "
        "no tokenizer, so encode text first (e.g. with the model's Hugging Face tokenizer)"
    )
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"{hint}; got {type(prompts).__name__} {_preview(prompts)}")
    out = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Iterable):
            raise TypeError(f"{hint}; prompt {index} is {type(prompt).__name__} {_preview(prompt)}")
        ids = []
        for position, token in enumerate(prompt):
            if isinstance(token, bool) or not hasattr(token, "__index__"):
                raise TypeError(
                    f"{hint}; prompt {index} holds {type(token).__name__} {_preview(token)} "
                    f"at position {position}"
                )
            ids.append(operator.index(token))
        out.append(ids)
    return out


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
