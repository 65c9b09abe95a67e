"""The persistent batch: block tables kept from the changes each batch names, and the step's
inputs written with numpy into persistent buffers, equal what rebuilding everything from the
scheduler's live state gives (the runner's old way), step after step, under every policy, with
forks, copy-on-write, preemption (swap and recompute) and prefix caching."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from core.batch import ScheduledBatch, StepResult  # noqa: E402
from core.config import CacheConfig, SchedulerConfig  # noqa: E402
from core.policies import POLICIES  # noqa: E402
from core.request import Request, RequestStatus  # noqa: E402
from core.scheduler import Scheduler  # noqa: E402
from engine.attention import HostMetadata, host_metadata  # noqa: E402
from engine.input_batch import (  # noqa: E402
    BlockTables,
    StepBuffers,
    UnknownSequenceError,
)
from engine.sampling import SamplingParams  # noqa: E402
from engine.step_inputs import HostStep, ScheduledRows, collect_rows, fill_host_step  # noqa: E402

BLOCK_SIZE = 4
MAX_LEN = 96
PARAMS = SamplingParams()


def _requests(rng: random.Random, num: int) -> list[Request]:
    shared = [rng.randrange(3, 500) for _ in range(20)]
    out = []
    for idx in range(num):
        length = rng.randint(1, 40)
        own = [rng.randrange(3, 500) for _ in range(length)]
        prompt = (shared + own)[:length] if idx % 3 == 0 else own
        out.append(
            Request(f"r{idx}", 0.01 * idx, length, rng.randint(1, 20), rng.choice([1, 1, 2, 3]),
                    tuple(prompt))
        )  # fmt: skip
    return out


def _token(request: Request, seq_id: int, pos: int) -> int:
    assert request.prompt_token_ids is not None
    prompt = request.prompt_token_ids
    return prompt[pos] if pos < len(prompt) else request.output_token_ids[seq_id][pos - len(prompt)]


Rebuilt = tuple[list[int], list[int], HostMetadata, list[tuple[int, int, int, int]]]


def _rebuilt(scheduler: Scheduler, batch: ScheduledBatch) -> Rebuilt:
    """The step rebuilt from the scheduler's live tables and the requests, with lists: token
    ids, positions, metadata and samples ``(row, owner, sample_idx, position)``."""
    decodes: list[tuple[Request, int, int, list[int]]] = []
    chunks: list[tuple[Request, int, int, int, list[int]]] = []
    for scheduled in batch.requests:
        request = scheduled.request
        live = scheduler.block_tables(request)
        for seq_id, table in zip(scheduled.seq_ids, live, strict=True):
            start, num = scheduled.num_computed_tokens, scheduled.num_positions
            if num == 1:
                decodes.append((request, seq_id, start, list(table)))
            else:
                chunks.append((request, seq_id, start, num, list(table)))
    ids: list[int] = []
    positions: list[int] = []
    samples: list[tuple[int, int, int, int]] = []

    def add_samples(request: Request, seq_id: int, row: int, end: int) -> None:
        if end != request.num_tokens:
            return
        owners = request.live_seq_ids if request.n > 1 and not request.forked else [seq_id]
        for owner in owners:
            samples.append((row, owner, request.seq_ids.index(owner), request.num_output_tokens))

    for request, seq_id, start, _ in decodes:
        ids.append(_token(request, seq_id, start))
        positions.append(start)
        add_samples(request, seq_id, len(ids) - 1, start + 1)
    for request, seq_id, start, num, _ in chunks:
        ids.extend(_token(request, seq_id, p) for p in range(start, start + num))
        positions.extend(range(start, start + num))
        add_samples(request, seq_id, len(ids) - 1, start + num)
    meta = host_metadata(
        [start + 1 for _, _, start, _ in decodes],
        [table for *_, table in decodes],
        [(start, num) for _, _, start, num, _ in chunks],
        [table for *_, table in chunks],
        BLOCK_SIZE,
    )
    return ids, positions, meta, samples


def _assert_same_step(got_host: HostStep, want: Rebuilt) -> None:
    """Equal inputs (samples in any order: the runner lists them in batch order)."""
    ids, positions, meta, samples = want
    got = got_host.meta
    assert got_host.input_ids.tolist() == ids
    assert got_host.positions.tolist() == positions
    assert got.slot_mapping.tolist() == meta.slot_mapping.tolist()
    assert got.decode_seq_lens.tolist() == meta.decode_seq_lens.tolist()
    for got_tables, want_tables, lens in (
        (got.decode_block_tables, meta.decode_block_tables, meta.decode_seq_lens),
        (got.prefill_block_tables, meta.prefill_block_tables, meta.prefill_seq_lens),
    ):
        assert len(got_tables) == len(want_tables)
        for got_row, want_row, length in zip(got_tables, want_tables, lens, strict=True):
            used = -(-int(length) // BLOCK_SIZE)  # entries past a table's end are never read
            assert got_row[:used].tolist() == want_row[:used].tolist()
    for name in ("prefill_query_start_loc", "prefill_seq_lens", "prefill_context_lens"):
        assert getattr(got, name).tolist() == getattr(meta, name).tolist(), name
    got_samples = [
        (s.row, owner, s.sample_idx, s.position)
        for s, owner in zip(got_host.specs, got_host.owners, strict=True)
    ]
    assert sorted(got_samples) == sorted(samples)


CASES = {
    "swap": dict(preemption="swap", num_cpu_blocks=300, prefix=False),
    "recompute": dict(preemption="recompute", num_cpu_blocks=0, prefix=False),
    "prefix-caching": dict(preemption="recompute", num_cpu_blocks=0, prefix=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_persistent_inputs_equal_inputs_rebuilt_from_live_state(policy: str, case: str) -> None:
    opts = CASES[case]
    rng = random.Random(5)
    cache = CacheConfig(
        num_blocks=36,
        block_size=BLOCK_SIZE,
        memory_model="paged",
        num_cpu_blocks=int(opts["num_cpu_blocks"]),  # type: ignore[call-overload]
        enable_prefix_caching=bool(opts["prefix"]),
        max_model_len=MAX_LEN,
    )
    config = SchedulerConfig(
        policy=policy,
        max_num_batched_tokens=40,
        preemption_mode=opts["preemption"],  # type: ignore[arg-type]
        batch_size=4,
        max_wait_s=0.0,
    )
    scheduler = Scheduler(cache, config, record_block_tables=True)
    requests = _requests(rng, 30)
    for request in requests:
        scheduler.add_request(request, 0.0)
    scheduler.mark_arrivals_done()
    tables = BlockTables(-(-MAX_LEN // BLOCK_SIZE), num_rows=2)  # (grows)
    buffers = StepBuffers(tables.max_blocks_per_seq, torch.device("cpu"), num_rows=3)
    now_s, num_steps = 0.0, 0
    stop_rate = 0.0 if policy in ("static", "dynamic") else 0.1
    while scheduler.has_unfinished():
        batch = scheduler.schedule(now_s)
        assert batch.block_tables is not None
        tables.update(batch.block_tables)
        host = fill_host_step(collect_rows(batch, tables, lambda r: (PARAMS, 0)), tables, buffers,
                              BLOCK_SIZE)  # fmt: skip
        _assert_same_step(host, _rebuilt(scheduler, batch))
        sampled = {owner: rng.randrange(3, 500) for owner in host.owners}
        # Samples stop early (an n > 1 request may go on with a child alone), except under
        # static batching, where early stops break the core (tests/core/test_block_table_changes).
        stops = frozenset(o for o in host.owners if stop_rate and rng.random() < stop_rate)
        now_s += 0.01
        for done in scheduler.update(batch, StepResult(0.01, sampled, stops), now_s):
            tables.forget(done.seq_ids)
        num_steps += 1
        assert num_steps < 5000
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    assert tables.num_sequences == 0, "every finished sequence's row was freed"
    if policy in ("continuous", "chunked"):
        assert sum(r.num_preemptions for r in requests) > 0, "no preemption: raise the load"


def test_padded_decode_rows_read_and_write_nothing() -> None:
    tables = BlockTables(4)
    tables.update({7: (3, 1), 9: (2,)})
    buffers = StepBuffers(4, torch.device("cpu"), num_rows=2)
    rows = ScheduledRows(
        decode_rows=[tables.row(7), tables.row(9)], decode_positions=[5, 0], decode_tokens=[11, 12]
    )
    host = fill_host_step(rows, tables, buffers, block_size=4, num_padded_decodes=3)
    assert host.input_ids.tolist() == [11, 12, 0, 0, 0]
    assert host.positions.tolist() == [5, 0, 0, 0, 0]
    assert host.meta.slot_mapping.tolist() == [1 * 4 + 1, 2 * 4 + 0, -1, -1, -1]
    assert host.meta.decode_seq_lens.tolist() == [6, 1, 0, 0, 0]
    assert host.meta.num_padding_tokens == 3
    rows.chunk_rows.append(tables.row(9))
    with pytest.raises(ValueError, match="only a decode-only step is padded"):
        fill_host_step(rows, tables, buffers, block_size=4, num_padded_decodes=1)


def test_block_tables_rows_are_reused_and_grown() -> None:
    tables = BlockTables(3, num_rows=1)
    tables.update({1: [4, 5], 2: [6]})
    assert tables.array[tables.row(1), :2].tolist() == [4, 5] and len(tables.array) == 2
    tables.forget([1])
    tables.update({3: [7, 8, 9]})
    assert tables.row(3) == 1 - tables.row(2) and tables.num_sequences == 2
    with pytest.raises(UnknownSequenceError, match="sequence 1 runs"):
        tables.row(1)
    with pytest.raises(ValueError, match="holds 4 blocks, more than the 3"):
        tables.update({4: [1, 2, 3, 4]})


def test_step_buffers_grow_and_upload_views() -> None:
    buffers = StepBuffers(2, torch.device("cpu"), num_rows=2)
    ids = buffers.host("input_ids", 5)
    ids[:] = np.arange(5)
    assert buffers.upload("input_ids", ids).tolist() == [0, 1, 2, 3, 4]
    assert buffers.host("prefill_query_start_loc", 3).shape == (3,)
    with pytest.raises(AssertionError, match="not this buffer"):
        buffers.upload("positions", ids)
