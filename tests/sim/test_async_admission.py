"""When an arrival reaches the scheduler under vLLM's async scheduling (sim.async_admission):
a request that arrives while a step runs joins the step after next; one that finds the engine
idle joins at once; ``--no-scheduling-lag`` and a synchronous engine let it join the next step;
fast-forward gives the same times; the run waits for the last arrival held."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.request import RequestStatus
from core.settings import build
from sim.cli.main import main
from sim.run import RunConfig, RunResult, simulate
from traces.schema import Trace, TraceRequest

SMALL = {"model": "Llama-2-7B", "hardware": "A100-80GB", "num_blocks": 600, "policy": "chunked"}


def _run(trace: Trace, **settings: object) -> RunResult:
    return simulate(trace, build(RunConfig, **{**SMALL, **settings}))


def _step_ends(result: RunResult) -> list[float]:
    frame = result.steps.to_frame()
    assert (frame["num_steps"] == 1).all(), "expects one row per step (no fast-forward)"
    return list(frame["start_s"] + frame["duration_s"])


def _two_requests(second_s: float) -> Trace:
    return Trace(
        "two",
        (
            TraceRequest("a", 0.0, 64, 40),
            TraceRequest("b", second_s, 32, 4),
        ),
    )


def _mid_step_arrival() -> float:
    """A time inside the fourth step of request a alone."""
    alone = _run(Trace("a", (TraceRequest("a", 0.0, 64, 40),)), fast_forward=False)
    ends = _step_ends(alone)
    return (ends[2] + ends[3]) / 2


def test_an_arrival_during_a_step_joins_the_step_after_next() -> None:
    arrival = _mid_step_arrival()
    lagged = _run(_two_requests(arrival), fast_forward=False)
    ends = _step_ends(lagged)
    b = next(r for r in lagged.requests if r.request_id == "b")
    # b arrived in the fourth step (ends[3]); the fifth was scheduled before b was taken in.
    assert b.first_scheduled_s == ends[4]
    prompt_rows = lagged.steps.to_frame()["num_prefill_tokens"]
    assert prompt_rows.iloc[5] == 32 and prompt_rows.iloc[4] == 0


@pytest.mark.parametrize("settings", [{"scheduling_lag": False}, {"async_scheduling": False}])
def test_without_the_lag_an_arrival_joins_the_next_step(settings: dict[str, object]) -> None:
    arrival = _mid_step_arrival()
    result = _run(_two_requests(arrival), fast_forward=False, **settings)
    ends = _step_ends(result)
    b = next(r for r in result.requests if r.request_id == "b")
    first = min(i for i, end in enumerate(ends) if end >= arrival)
    assert b.first_scheduled_s == ends[first]


def test_an_arrival_at_an_idle_engine_is_scheduled_at_once() -> None:
    trace = Trace("late", (TraceRequest("a", 0.0, 16, 2), TraceRequest("b", 5.0, 16, 2)))
    result = _run(trace, fast_forward=False)
    b = next(r for r in result.requests if r.request_id == "b")
    assert b.first_scheduled_s == 5.0


def _bursty() -> Trace:
    requests = []
    for i in range(60):
        # bursts of arrivals landing inside runs of identical decode steps
        requests.append(TraceRequest(f"r{i}", 0.05 * (i // 3) + 0.001 * i, 40 + 7 * i, 30 + i))
    return Trace("bursty", tuple(requests))


def test_fast_forward_gives_the_same_times_with_the_lag() -> None:
    on, off = _run(_bursty()), _run(_bursty(), fast_forward=False)
    times = lambda result: [  # noqa: E731
        (r.request_id, r.first_scheduled_s, r.first_token_s, r.finish_s) for r in result.requests
    ]
    assert times(on) == times(off)
    assert times(on) != times(_run(_bursty(), scheduling_lag=False))


def test_every_request_finishes_when_the_last_arrival_is_held() -> None:
    arrival = _mid_step_arrival()
    for fast_forward in (True, False):
        result = _run(_two_requests(arrival), fast_forward=fast_forward)
        assert [r.status for r in result.requests] == [RequestStatus.FINISHED] * 2


def test_a_request_too_large_is_rejected_on_arrival_not_held() -> None:
    arrival = _mid_step_arrival()
    trace = Trace("big", (TraceRequest("a", 0.0, 64, 40), TraceRequest("b", arrival, 10**6, 4)))
    result = _run(trace, fast_forward=False)
    b = next(r for r in result.requests if r.request_id == "b")
    assert b.status is RequestStatus.REJECTED
    assert b.finish_s == arrival


def test_the_flag_turns_the_lag_off_and_is_recorded(tmp_path: Path) -> None:
    trace = Path(__file__).resolve().parents[2] / "traces" / "data" / "example.csv"
    for extra, expected in (([], True), (["--no-scheduling-lag"], False)):
        out = tmp_path / str(expected)
        assert main(["run", str(trace), "--quiet", "--out", str(out), *extra]) == 0
        assert f'"scheduling_lag": {str(expected).lower()}' in (out / "summary.json").read_text()


def test_data_parallel_ranks_hold_arrivals_too() -> None:
    trace = _bursty()
    settings = {
        "model": "Qwen3-30B-A3B",
        "hardware": "H100-SXM",
        "num_blocks": None,
        "data_parallel_size": 2,
    }
    lagged, plain = _run(trace, **settings), _run(trace, scheduling_lag=False, **settings)
    assert all(r.status is RequestStatus.FINISHED for r in lagged.requests)
    ttft = lambda result: sum(r.first_token_s - r.arrival_s for r in result.requests)  # noqa: E731
    assert ttft(lagged) > ttft(plain)


def _lagged_start(trace: Trace, **settings: object) -> None:
    """b waits for a to finish while c keeps running: under the lag b joins one step after
    the step that follows a's last, without it the step that follows; fast-forward agrees."""
    for lag in (True, False):
        result = _run(trace, fast_forward=False, scheduling_lag=lag, **settings)
        ends = _step_ends(result)
        a, b, c = (next(r for r in result.requests if r.request_id == i) for i in "abc")
        assert c.finish_s > b.first_scheduled_s  # c ran throughout
        assert b.first_scheduled_s == ends[ends.index(a.finish_s) + (1 if lag else 0)]
        skipped = _run(trace, scheduling_lag=lag, **settings)
        assert [r.finish_s for r in skipped.requests] == [r.finish_s for r in result.requests]


def test_a_finished_request_holds_its_slot_through_the_next_schedule() -> None:
    """Two sequence slots, a and c in them: vLLM schedules the step after a's last before it
    learns a ended, and counts a as running there (it skips it)."""
    requests = (
        TraceRequest("a", 0.0, 16, 5),
        TraceRequest("c", 0.0, 16, 40),
        TraceRequest("b", 0.0005, 16, 3),
    )
    _lagged_start(Trace("two-slots", requests), max_num_seqs=2)


def test_a_finished_request_holds_its_blocks_through_the_next_schedule() -> None:
    """Blocks for a and c but not for b as well: b's blocks come from a once it is freed,
    one schedule later under the lag."""
    requests = (
        TraceRequest("a", 0.0, 160, 8),
        TraceRequest("c", 0.0, 64, 60),
        TraceRequest("b", 0.0005, 160, 4),
    )
    _lagged_start(Trace("tight", requests), num_blocks=22, block_size=16)
