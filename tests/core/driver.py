"""A deterministic step-loop driver for scheduler tests: replays requests against a synthetic
executor, records what every step scheduled, and fails loudly on a stuck or livelocked loop."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.batch import ScheduledBatch, StepResult
from core.block_allocator import BlockPair
from core.config import CacheConfig, SchedulerConfig
from core.memory import MemorySnapshot
from core.request import Request, RequestStatus
from core.scheduler import Scheduler

StepTime = Callable[[ScheduledBatch], float]
StopFn = Callable[[ScheduledBatch], frozenset[int]]
StepHook = Callable[[Scheduler, ScheduledBatch], None]


def linear_step_time(
    base_s: float = 0.01, per_token_s: float = 1e-4, per_padding_token_s: float = 1e-4
) -> StepTime:
    """Step duration ``base + per_token * batched tokens + per_padding * padding tokens``."""

    def step_time(batch: ScheduledBatch) -> float:
        return (
            base_s
            + per_token_s * batch.num_batched_tokens
            + per_padding_token_s * batch.num_padding_tokens
        )

    return step_time


@dataclass(frozen=True, slots=True)
class EntryRecord:
    """One request's share of a recorded step, copied out of the live ``ScheduledRequest``."""

    request_id: str
    num_positions: int
    num_computed_tokens: int
    seq_ids: tuple[int, ...]
    is_prefill: bool
    num_new_tokens: int
    num_preemptions: int  # the request's count when the step was scheduled


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """The facts of one step (empty steps included), frozen when it was scheduled."""

    step_idx: int
    now_s: float
    duration_s: float
    entries: tuple[EntryRecord, ...]
    copies: tuple[BlockPair, ...]
    swap_out: tuple[BlockPair, ...]
    swap_in: tuple[BlockPair, ...]
    preempted_ids: tuple[str, ...]
    num_padding_tokens: int
    next_wakeup_s: float | None
    memory: MemorySnapshot | None
    # ``(request_id, is_prefill)`` of the running requests just before ``schedule``.
    running_before: tuple[tuple[str, bool], ...]
    finished_ids: tuple[str, ...]  # what ``update`` returned for this step

    @property
    def is_empty(self) -> bool:
        return not self.entries

    @property
    def num_batched_tokens(self) -> int:
        return sum(e.num_new_tokens for e in self.entries)

    @property
    def num_seqs(self) -> int:
        return sum(len(e.seq_ids) for e in self.entries)

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(e.request_id for e in self.entries)


@dataclass(slots=True)
class ReplayResult:
    """Everything a replay produced: the (mutated) requests, every step, the finished stream."""

    requests: list[Request]
    batches: list[BatchRecord]
    finished: list[Request]
    rejected: list[Request]
    scheduler: Scheduler
    end_s: float
    by_id: dict[str, Request] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {r.request_id: r for r in self.requests}

    @property
    def num_steps(self) -> int:
        return sum(1 for b in self.batches if not b.is_empty)

    def entries_of(self, request_id: str) -> list[EntryRecord]:
        """Every share of ``request_id`` in step order."""
        return [e for b in self.batches for e in b.entries if e.request_id == request_id]


def _record(
    batch: ScheduledBatch,
    duration_s: float,
    running_before: tuple[tuple[str, bool], ...],
    finished: Sequence[Request],
) -> BatchRecord:
    entries = tuple(
        EntryRecord(
            request_id=s.request_id,
            num_positions=s.num_positions,
            num_computed_tokens=s.num_computed_tokens,
            seq_ids=tuple(s.seq_ids),
            is_prefill=s.is_prefill,
            num_new_tokens=s.num_new_tokens,
            num_preemptions=s.request.num_preemptions,
        )
        for s in batch.requests
    )
    return BatchRecord(
        step_idx=batch.step_idx,
        now_s=batch.now_s,
        duration_s=duration_s,
        entries=entries,
        copies=tuple(batch.copies),
        swap_out=tuple(batch.swap_out),
        swap_in=tuple(batch.swap_in),
        preempted_ids=tuple(batch.preempted_ids),
        num_padding_tokens=batch.num_padding_tokens,
        next_wakeup_s=batch.next_wakeup_s,
        memory=batch.memory,
        running_before=running_before,
        finished_ids=tuple(r.request_id for r in finished),
    )


def _stuck_message(why: str, scheduler: Scheduler, now_s: float, num_left: int) -> str:
    return (
        f"{why} at now={now_s:.6f}: running={len(scheduler.running)} "
        f"waiting={len(scheduler.waiting)} swapped={len(scheduler.swapped)} "
        f"held={len(scheduler.held)} unfinished={scheduler.num_unfinished} "
        f"arrivals_left={num_left}"
    )


def replay(
    requests: Sequence[Request],
    cache_config: CacheConfig,
    scheduler_config: SchedulerConfig,
    step_time: StepTime | None = None,
    *,
    stopped: StopFn | None = None,
    on_step: StepHook | None = None,
    max_steps: int = 50_000,
    mark_arrivals_done: bool = True,
    record_block_tables: bool = False,
) -> ReplayResult:
    """Run ``schedule → execute → update`` until every request is done.

    Requests arrive in ``arrival_s`` order (ties keep input order) once ``now`` reaches them.
    An empty step moves ``now`` to the next arrival or the batch's ``next_wakeup_s``. Raises
    ``AssertionError`` if the loop is stuck (empty step, unfinished requests, nothing to wait
    for) or runs more than ``max_steps`` steps (livelock). ``on_step`` sees the scheduler and
    the live batch between ``schedule`` and ``update``; ``stopped`` names sequences the
    synthetic executor stops early. ``record_block_tables`` builds the scheduler as the real
    engine does (each batch names the block tables that changed).
    """
    step_time = step_time if step_time is not None else linear_step_time()
    scheduler = Scheduler(cache_config, scheduler_config, record_block_tables=record_block_tables)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    arrivals = [requests[i] for i in order]
    batches: list[BatchRecord] = []
    finished: list[Request] = []
    rejected: list[Request] = []
    now_s = 0.0
    next_idx = 0
    marked = False
    for _ in range(max_steps):
        next_idx = _add_arrivals(scheduler, arrivals, next_idx, now_s, rejected)
        if next_idx == len(arrivals) and mark_arrivals_done and not marked:
            scheduler.mark_arrivals_done()
            marked = True
        if next_idx == len(arrivals) and not scheduler.has_unfinished():
            break
        running_before = tuple((r.request_id, r.is_prefill) for r in scheduler.running)
        batch = scheduler.schedule(now_s)
        if on_step is not None:
            on_step(scheduler, batch)
        if batch.is_empty:
            done = scheduler.update(batch, StepResult(0.0), now_s)
            finished.extend(done)
            batches.append(_record(batch, 0.0, running_before, done))
            if next_idx == len(arrivals) and not scheduler.has_unfinished():
                break
            to_come = arrivals[next_idx] if next_idx < len(arrivals) else None
            left = len(arrivals) - next_idx
            now_s = _after_empty_step(scheduler, batch, now_s, (to_come, left), bool(done))
            continue
        duration_s = step_time(batch)
        assert duration_s > 0, f"step_time gave {duration_s} for a non-empty batch"
        stop = stopped(batch) if stopped is not None else frozenset()
        now_s += duration_s
        done = scheduler.update(batch, StepResult(duration_s, stopped_seq_ids=stop), now_s)
        finished.extend(done)
        batches.append(_record(batch, duration_s, running_before, done))
    else:
        left = len(arrivals) - next_idx
        raise AssertionError(
            _stuck_message(f"no end after {max_steps} steps (livelock?)", scheduler, now_s, left)
        )
    return ReplayResult(
        requests=list(requests),
        batches=batches,
        finished=finished,
        rejected=rejected,
        scheduler=scheduler,
        end_s=now_s,
    )


def _add_arrivals(
    scheduler: Scheduler,
    arrivals: list[Request],
    next_idx: int,
    now_s: float,
    rejected: list[Request],
) -> int:
    """Add the requests from ``arrivals[next_idx]`` on that have arrived by ``now_s`` (the
    rejected ones into ``rejected``); returns the index of the first still to come."""
    while next_idx < len(arrivals) and arrivals[next_idx].arrival_s <= now_s:
        request = arrivals[next_idx]
        if not scheduler.add_request(request, now_s):
            rejected.append(request)
        next_idx += 1
    return next_idx


def _after_empty_step(
    scheduler: Scheduler,
    batch: ScheduledBatch,
    now_s: float,
    arrivals: tuple[Request | None, int],
    released: bool,
) -> float:
    """When the loop goes on after an empty step: at the next arrival or the batch's
    wake-up, or at once (``now_s``) when a static batch ended during scheduling (``released``)
    and there is nothing to wait for. ``arrivals`` is the next request to arrive (None when
    all have) and how many are left. Raises AssertionError when stuck."""
    to_come, left = arrivals
    wakeups = [] if to_come is None else [to_come.arrival_s]
    if batch.next_wakeup_s is not None:
        wakeups.append(batch.next_wakeup_s)
    if released and not wakeups:
        return now_s  # ask again at once
    if not wakeups:
        raise AssertionError(_stuck_message("stuck", scheduler, now_s, left))
    wake_s = min(wakeups)
    if wake_s <= now_s:
        raise AssertionError(
            _stuck_message(f"empty step asked to wake at {wake_s}", scheduler, now_s, left)
        )
    return wake_s


def make_workload(
    seed: int,
    num_requests: int,
    *,
    rate_per_s: float = 20.0,
    prompt_tokens: tuple[int, int] = (1, 200),
    output_tokens: tuple[int, int] = (1, 64),
    max_n: int = 1,
    num_prefixes: int = 0,
    prefix_tokens: int = 64,
    vocab_size: int = 1000,
) -> list[Request]:
    """Seeded requests with Poisson arrivals and uniform prompt/output lengths.

    ``max_n > 1`` draws each request's sample count from ``1..max_n``. ``num_prefixes > 0``
    gives every request ``prompt_token_ids`` that start with one of ``num_prefixes`` shared
    prefixes (cut to the prompt length), so prefix caching has something to hit.
    """
    rng = random.Random(seed)
    prefixes = [
        tuple(rng.randrange(vocab_size) for _ in range(prefix_tokens)) for _ in range(num_prefixes)
    ]
    requests: list[Request] = []
    now_s = 0.0
    for idx in range(num_requests):
        now_s += rng.expovariate(rate_per_s)
        num_prompt = rng.randint(*prompt_tokens)
        token_ids: tuple[int, ...] | None = None
        if prefixes:
            prefix = rng.choice(prefixes)[:num_prompt]
            rest = tuple(rng.randrange(vocab_size) for _ in range(num_prompt - len(prefix)))
            token_ids = prefix + rest
        requests.append(
            Request(
                request_id=f"r{idx}",
                arrival_s=now_s,
                num_prompt_tokens=num_prompt,
                max_output_tokens=rng.randint(*output_tokens),
                n=rng.randint(1, max_n),
                prompt_token_ids=token_ids,
            )
        )
    return requests


def is_done(request: Request) -> bool:
    """Finished, or rejected with a reason."""
    if request.status is RequestStatus.REJECTED:
        return bool(request.reject_reason)
    return request.status is RequestStatus.FINISHED
