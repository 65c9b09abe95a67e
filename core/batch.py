"""What one step schedules (``ScheduledBatch``) and what executing it returns (``StepResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.block_allocator import BlockPair
from core.kv_manager import RangeCopy
from core.memory import MemorySnapshot
from core.request import Request


@dataclass(slots=True, init=False)
class ScheduledRequest:
    """One request's share of a step.

    ``num_positions`` positions are computed for each of the request's active sequences, so
    the step processes ``num_new_tokens = num_positions * len(seq_ids)`` tokens for it, on top
    of ``num_computed_tokens`` tokens of context already in the cache.
    """

    request: Request
    num_positions: int
    num_computed_tokens: int
    seq_ids: tuple[int, ...]
    is_prefill: bool

    # Written out, as this module's other classes' and ``Request``'s: the compiled build runs
    # the ``__init__`` that ``dataclass`` generates as Python (docs/compiled_core.md, measured:
    # generated, this one cost 7% of a compiled run's instructions, ScheduledBatch's 4%,
    # StepResult's 1%). Made for every request in every step the simulator does not skip.
    def __init__(
        self,
        request: Request,
        num_positions: int,
        num_computed_tokens: int,
        seq_ids: tuple[int, ...],
        is_prefill: bool,
    ) -> None:
        self.request = request
        self.num_positions = num_positions
        self.num_computed_tokens = num_computed_tokens
        self.seq_ids = seq_ids
        self.is_prefill = is_prefill

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_new_tokens(self) -> int:
        return self.num_positions * len(self.seq_ids)


@dataclass(slots=True, init=False)
class ScheduledBatch:
    """The scheduler's decision for one step, plus the memory moves the executor must make.

    ``copies`` are copy-on-write block copies ``(src, dst)``; ``range_copies`` are the
    contiguous model's prompt copies ``(src_slot, dst_slot, num_slots)``; ``swap_out`` pairs
    are ``(gpu_block, cpu_block)`` and ``swap_in`` pairs ``(cpu_block, gpu_block)``. All must
    happen before the step's model execution. ``num_padding_tokens`` are tokens a static batch
    computes for nothing (prompt padding, finished sequences kept in the batch).

    ``block_tables`` is None unless the scheduler records block tables (the real engine:
    ``Scheduler(record_block_tables=True)``). Then it maps every sequence whose block table
    changed since the last step to its whole table now: sequences admitted, grown by a block,
    copied on write, swapped in or forked. A scheduled sequence it does not name kept its
    table (it grew inside its last block), so an executor can keep the tables between steps.
    """

    step_idx: int
    now_s: float
    requests: list[ScheduledRequest] = field(default_factory=list)
    copies: list[BlockPair] = field(default_factory=list)
    range_copies: list[RangeCopy] = field(default_factory=list)
    swap_out: list[BlockPair] = field(default_factory=list)
    swap_in: list[BlockPair] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    # Decode side of disaggregated serving: requests whose blocks were reserved this step and
    # whose KV transfer can start.
    transfers: list[Request] = field(default_factory=list)
    num_padding_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    memory: MemorySnapshot | None = None
    # When the policy wants to be asked again although nothing arrives (dynamic batching).
    next_wakeup_s: float | None = None
    block_tables: dict[int, tuple[int, ...]] | None = None

    def __init__(
        self,
        step_idx: int,
        now_s: float,
        requests: list[ScheduledRequest] | None = None,
        copies: list[BlockPair] | None = None,
        range_copies: list[RangeCopy] | None = None,
        swap_out: list[BlockPair] | None = None,
        swap_in: list[BlockPair] | None = None,
        preempted_ids: list[str] | None = None,
        finished: list[Request] | None = None,
        transfers: list[Request] | None = None,
        num_padding_tokens: int = 0,
        num_running: int = 0,
        num_waiting: int = 0,
        num_swapped: int = 0,
        memory: MemorySnapshot | None = None,
        next_wakeup_s: float | None = None,
    ) -> None:
        self.step_idx = step_idx
        self.now_s = now_s
        self.requests = [] if requests is None else requests
        self.copies = [] if copies is None else copies
        self.range_copies = [] if range_copies is None else range_copies
        self.swap_out = [] if swap_out is None else swap_out
        self.swap_in = [] if swap_in is None else swap_in
        self.preempted_ids = [] if preempted_ids is None else preempted_ids
        self.finished = [] if finished is None else finished
        self.transfers = [] if transfers is None else transfers
        self.num_padding_tokens = num_padding_tokens
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.num_swapped = num_swapped
        self.memory = memory
        self.next_wakeup_s = next_wakeup_s
        self.block_tables = None

    @property
    def is_empty(self) -> bool:
        return not self.requests

    @property
    def num_prefill_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.requests if r.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.requests if not r.is_prefill)

    @property
    def num_batched_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.requests)


@dataclass(frozen=True, slots=True, init=False)
class StepResult:
    """What executing a batch gives back.

    ``sampled_token_ids`` maps sequence id to the token it sampled (the real engine; the
    simulator has no token ids). ``stopped_seq_ids`` are sequences that hit a stop token
    before their maximum length.
    """

    duration_s: float
    sampled_token_ids: dict[int, int] = field(default_factory=dict)
    stopped_seq_ids: frozenset[int] = frozenset()

    def __init__(
        self,
        duration_s: float,
        sampled_token_ids: dict[int, int] | None = None,
        stopped_seq_ids: frozenset[int] = frozenset(),
    ) -> None:
        object.__setattr__(self, "duration_s", duration_s)
        object.__setattr__(
            self, "sampled_token_ids", {} if sampled_token_ids is None else sampled_token_ids
        )
        object.__setattr__(self, "stopped_seq_ids", stopped_seq_ids)
