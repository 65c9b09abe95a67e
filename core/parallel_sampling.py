"""n > 1 samples as vLLM v1 runs them: the request fans out into n child requests
(``fan_out``) that are scheduled each on its own and share only through the prefix cache, and
the parent reports what its children did once the last one finishes (``SampleGroup``)."""

from __future__ import annotations

from core.request import COUNTERS, Request, RequestStatus


def child_id(parent_id: str, index: int) -> str:
    """vLLM's name for sample ``index`` of request ``parent_id`` (``ParentRequest``)."""
    return f"{index}_{parent_id}"


def fan_out(parent: Request) -> list[Request]:
    """The parent's n children, in the order vLLM's front end adds them: the same prompt,
    arrival, output length and priority, one sample each."""
    return [
        Request(
            child_id(parent.request_id, index),
            parent.arrival_s,
            parent.num_prompt_tokens,
            parent.max_output_tokens,
            1,
            parent.prompt_token_ids,
            parent.prefix_hash_ids,
            parent.hash_block_tokens,
            parent.priority,
        )
        for index in range(parent.n)
    ]


class SampleGroup:
    """A parent request and its children. When the last child finishes, the parent takes what
    a client of all n samples sees: the first scheduling and the first token of any child
    (TTFT), the last child's finish (E2E), that child's token timeline (TPOT and inter-token
    gaps of the sample that ended last), the longest output, each child's sampled ids under
    the child's sequence id, and the counters summed."""

    __slots__ = ("children", "num_unfinished", "parent")

    def __init__(self, parent: Request, children: list[Request]) -> None:
        if len(children) != parent.n:
            raise ValueError(f"{parent.request_id}: {len(children)} children for n={parent.n}")
        self.parent = parent
        self.children = children
        self.num_unfinished = len(children)
        parent.seq_ids = [seq for child in children for seq in child.seq_ids]
        parent.live_seq_ids = []

    def child_done(self, now_s: float) -> bool:
        """A child finished at ``now_s``; True when it was the last (the parent is then
        finished, its fields filled in)."""
        self.num_unfinished -= 1
        if self.num_unfinished:
            return False
        self._fill_parent(now_s)
        return True

    def _fill_parent(self, now_s: float) -> None:
        parent, children = self.parent, self.children
        parent.status = RequestStatus.FINISHED
        parent.finish_s = max(
            (c.finish_s for c in children if c.finish_s is not None), default=now_s
        )
        scheduled = [c.first_scheduled_s for c in children if c.first_scheduled_s is not None]
        parent.first_scheduled_s = min(scheduled, default=None)
        firsts = [c.first_token_s for c in children if c.first_token_s is not None]
        parent.first_token_s = min(firsts, default=None)
        parent.num_output_tokens = max(c.num_output_tokens for c in children)
        parent.num_computed_tokens = max(c.num_computed_tokens for c in children)
        last = max(reversed(children), key=lambda c: c.finish_s or now_s)
        parent.tokens = last.tokens
        for counter in COUNTERS:
            setattr(parent, counter, sum(getattr(c, counter) for c in children))
        ids: dict[int, list[int]] = {}
        for child in children:
            ids.update(child.output_token_ids)
        if ids:
            parent.output_token_ids = ids

    def abort(self, now_s: float) -> None:
        self.parent.status = RequestStatus.ABORTED
        self.parent.finish_s = now_s
