"""Request state: lengths, status machine, per-request timestamps and counters."""

from __future__ import annotations

import enum
import itertools
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"

    @property
    def is_done(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.ABORTED)


class TokenTimeline:
    """When a request emitted tokens, as runs of consecutive steps of its replica.

    The scheduler keeps one array of step end times (``step_end_s``); an emission is the end
    of a step, and a request that decodes in every step from its first token to its last is
    a single run ``(first_step_idx, count)``. So 100k requests of 500 tokens stay small in
    memory, yet TTFT, TPOT and every inter-token latency can be computed exactly.
    """

    __slots__ = (
        "external_first_s",
        "num_emissions",
        "run_counts",
        "run_starts",
        "step_end_s",
    )

    def __init__(self, step_end_s: array[float] | None = None) -> None:
        self.step_end_s: array[float] = step_end_s if step_end_s is not None else array("d")
        self.num_emissions = 0
        self.run_starts: list[int] = []
        self.run_counts: list[int] = []
        # A first token emitted elsewhere (a disaggregated prefill replica), before any run.
        self.external_first_s: float | None = None

    def add_external_first(self, time_s: float) -> None:
        """The request's first token was emitted at ``time_s`` by another replica."""
        if self.num_emissions:
            raise ValueError("an external first token must come before every other")
        self.external_first_s = time_s
        self.num_emissions = 1

    # The first and last emission times are read off the runs (two floats fewer a request).

    @property
    def first_s(self) -> float | None:
        if self.external_first_s is not None:
            return self.external_first_s
        return self.step_end_s[self.run_starts[0]] if self.run_starts else None

    @property
    def last_s(self) -> float | None:
        if self.run_counts:
            return self.step_end_s[self.run_starts[-1] + self.run_counts[-1] - 1]
        return self.external_first_s

    def add(self, step_idx: int, count: int = 1) -> None:
        """Emissions at the ends of steps ``step_idx .. step_idx + count - 1``."""
        starts, counts = self.run_starts, self.run_counts
        if counts and starts[-1] + counts[-1] == step_idx:
            counts[-1] += count
        elif not counts:
            # The first run, usually the only one: lists of exactly one item (an append
            # would reserve four), 48 bytes less a request over a whole trace.
            self.run_starts = [step_idx]
            self.run_counts = [count]
        else:
            starts.append(step_idx)
            counts.append(count)
        self.num_emissions += count

    def times_s(self) -> list[float]:
        """Every emission time, expanded."""
        ends = self.step_end_s
        out: list[float] = [] if self.external_first_s is None else [self.external_first_s]
        for start, count in zip(self.run_starts, self.run_counts, strict=True):
            out.extend(ends[start : start + count])
        return out

    def gaps_s(self) -> list[float]:
        """Every inter-emission gap, expanded."""
        times = self.times_s()
        return [b - a for a, b in itertools.pairwise(times)]


_NO_OUTPUT_IDS: Mapping[int, list[int]] = MappingProxyType({})


def _no_output_ids() -> Mapping[int, list[int]]:
    return _NO_OUTPUT_IDS


COUNTERS = (
    "num_preemptions",
    "num_recomputed_tokens",
    "num_blocks_swapped_out",
    "num_blocks_swapped_in",
    "num_prefix_hit_tokens",
    "num_prefix_lookup_tokens",
    "num_cow_copies",
)
"""`Request`'s counters of what the core did to it: a request made of others (a fanned-out
parent, a disaggregated request's two halves) sums them."""


@dataclass(eq=False, slots=True, init=False)
class Request:
    """One inference request and everything the scheduler tracks about it.

    Token accounting follows vLLM v1: the request's ``num_tokens`` are its prompt plus the
    output tokens sampled so far, and ``num_computed_tokens`` of them have their KV in the
    cache. A step gives the request ``num_new_tokens`` more. With ``n > 1`` samples the prompt
    is computed once; at the end of the prompt the request forks into ``n`` sequences, and each
    position after that costs one token per live sample.
    """

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    max_output_tokens: int
    n: int = 1
    prompt_token_ids: tuple[int, ...] | None = None
    prefix_hash_ids: tuple[int, ...] | None = None
    hash_block_tokens: int = 512
    # Served before requests of a higher value under ``scheduling_policy="priority"`` (vLLM's
    # ``priority``); ignored under FCFS.
    priority: int = 0

    status: RequestStatus = RequestStatus.WAITING
    reject_reason: str | None = None
    # Output tokens sampled so far by each live sample (all live samples move in lockstep).
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    # One sequence id per sample; finished samples leave ``live_seq_ids``. Until ``forked``
    # only ``live_seq_ids[0]`` holds blocks: the prompt is computed once, then shared.
    seq_ids: list[int] = field(default_factory=list)
    live_seq_ids: list[int] = field(default_factory=list)
    forked: bool = False
    # Sampled token ids by sequence (the engine's; the simulator samples no ids). Until the
    # first, one shared empty map: most requests in a simulation never need a dict of their own.
    output_token_ids: Mapping[int, list[int]] = field(default_factory=_no_output_ids)
    # Set by the scheduler: a unique int used to name blocks whose content is unknown, and
    # (``prompt_idx``, when not -1) the one naming its prompt's blocks instead: the children
    # of a fanned-out request have one prompt, whatever the trace says of its content.
    internal_idx: int = -1
    prompt_idx: int = -1
    # Disaggregated serving. Prefill side: keep the KV after finishing, until it has been
    # sent (``Scheduler.release_kv``). Decode side: the prompt's KV comes over a link, and
    # the request cannot run until it is there (``Scheduler.kv_arrived``).
    hold_kv_on_finish: bool = False
    kv_ready: bool = True

    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    tokens: TokenTimeline = field(default_factory=TokenTimeline)

    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    num_blocks_swapped_out: int = 0
    num_blocks_swapped_in: int = 0
    num_prefix_hit_tokens: int = 0
    # Known tokens looked up in the prefix cache, summed over every admission (a request
    # recomputed after preemption looks its tokens up again): the hit rate's denominator.
    num_prefix_lookup_tokens: int = 0
    num_cow_copies: int = 0

    # Only the request's description is passed in; the rest is the core's state and starts as
    # the defaults above say. Written out, as ``ScheduledRequest``'s: generated, it cost 2% of a
    # compiled run's instructions (docs/compiled_core.md).
    def __init__(
        self,
        request_id: str,
        arrival_s: float,
        num_prompt_tokens: int,
        max_output_tokens: int,
        n: int = 1,
        prompt_token_ids: tuple[int, ...] | None = None,
        prefix_hash_ids: tuple[int, ...] | None = None,
        hash_block_tokens: int = 512,
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.n = n
        self.prompt_token_ids = prompt_token_ids
        self.prefix_hash_ids = prefix_hash_ids
        self.hash_block_tokens = hash_block_tokens
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.reject_reason = None
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.seq_ids = []
        self.live_seq_ids = []
        self.forked = False
        self.output_token_ids = _NO_OUTPUT_IDS
        self.internal_idx = -1
        self.prompt_idx = -1
        self.hold_kv_on_finish = False
        self.kv_ready = True
        self.first_scheduled_s = None
        self.first_token_s = None
        self.finish_s = None
        self.tokens = TokenTimeline()
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self.num_prefix_hit_tokens = 0
        self.num_prefix_lookup_tokens = 0
        self.num_cow_copies = 0
        self._check()

    def _check(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError(f"num_prompt_tokens must be >= 1, got {self.num_prompt_tokens!r}")
        if self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {self.max_output_tokens!r}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n!r}")
        ids = self.prompt_token_ids
        if ids is not None and len(ids) != self.num_prompt_tokens:
            raise ValueError(
                f"prompt_token_ids has {len(ids)} ids but num_prompt_tokens is "
                f"{self.num_prompt_tokens}"
            )
        if self.hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, got {self.hash_block_tokens!r}")

    # -- lengths -------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Prompt plus sampled output tokens, per sample."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_output_tokens

    @property
    def width(self) -> int:
        """Tokens one position costs: 1 until the fork, then one per live sample."""
        return len(self.live_seq_ids) if self.forked else 1

    @property
    def num_pending_positions(self) -> int:
        """Positions the next step may compute before it must stop (end of prompt for n > 1)."""
        if self.n > 1 and not self.forked:
            return self.num_prompt_tokens - self.num_computed_tokens
        return self.num_tokens - self.num_computed_tokens

    @property
    def active_seq_ids(self) -> list[int]:
        """Sequences that hold blocks now: all live samples after the fork, else the first."""
        return self.live_seq_ids if self.forked else self.live_seq_ids[:1]

    @property
    def is_prefill(self) -> bool:
        """True while the request computes known tokens (prompt, or outputs after recompute)."""
        return self.num_pending_positions > 1 or self.num_computed_tokens < self.num_prompt_tokens

    # -- derived metrics (seconds) ------------------------------------------------------

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        if self.finish_s is None or self.status is not RequestStatus.FINISHED:
            return None
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (last - first) / (emissions - 1)."""
        t = self.tokens
        if t.num_emissions < 2 or t.first_s is None or t.last_s is None:
            return None
        return (t.last_s - t.first_s) / (t.num_emissions - 1)

    @property
    def queueing_s(self) -> float | None:
        if self.first_scheduled_s is None:
            return None
        return self.first_scheduled_s - self.arrival_s
