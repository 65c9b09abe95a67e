"""The engine under priority scheduling: preempting the lowest priority, even a request the
step had already scheduled, leaves its greedy outputs those of Hugging Face ``generate``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from core.request import Request
from core.step import Step
from tests.engine.test_engine import GREEDY, _generate, expected, model_dir, prompts

__all__ = ["expected", "model_dir", "prompts"]  # the reference's fixtures, used by name


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_priority_scheduling_keeps_the_reference_outputs(
    policy: str,
    model_dir: Path,
    prompts: list[list[int]],
    expected: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under priority scheduling on a tiny cache the lowest priority is preempted, even a
    request the step had already scheduled (taken out of it again, its block table with it):
    the engine still computes the reference's tokens. The low-priority half arrives first,
    so that it runs ahead of the high-priority half in the running list."""
    taken_out = []
    unschedule = Step._unschedule

    def counted(self: Step, request: Request) -> None:
        taken_out.append(request.request_id)
        unschedule(self, request)

    monkeypatch.setattr(Step, "_unschedule", counted)
    llm = _generate(
        model_dir, prompts, block_size=4, policy=policy, num_blocks=40, scheduling_policy="priority"
    )
    engine = llm.engine
    half = len(prompts) // 2
    requests = []
    for index, prompt in enumerate(prompts):
        if index == half:
            for _ in range(3):  # the first half runs a few steps on its own
                engine.step()
        priority = 2 if index < half else 0
        requests.append(engine.add_request(f"r{index}", prompt, GREEDY, 0.0, priority=priority))
    engine.scheduler.mark_arrivals_done()
    while engine.has_unfinished():
        engine.step()
    assert [r.output_token_ids[r.seq_ids[0]] for r in requests] == expected
    assert sum(r.num_preemptions for r in requests) > 0
    assert taken_out, "no preemption took a request out of a step it was in"
