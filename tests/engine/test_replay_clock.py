"""The engine's step timing: every step records its wall and thread-CPU time; ``--clock cpu``
replays on a virtual timeline advanced by those CPU times (idle gaps jump to the next arrival,
nothing is slept for); a warm-up request runs before the replay without touching the engine's
own scheduler; and a clock that cannot measure the run is refused."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from core.settings import build

pytest.importorskip("torch")

from engine.cli import main as engine_main
from engine.llm_engine import EngineConfig, LLMEngine
from engine.replay import CPU_CLOCK_NOTE, ReplayConfig, replay
from records.step_shapes import load_step_shapes
from traces.loaders import load_trace

GAP_S = 500.0  # an idle gap no test could sleep through


def _trace(path: Path) -> Path:
    rows = ["request_id,arrival_s,prompt_tokens,output_tokens,num_samples"]
    rows += [f"a{i},{0.001 * i:.3f},{10 + 7 * i},{3 + i % 3},1" for i in range(4)]
    rows += [f"b{i},{GAP_S + 0.001 * i:.3f},{12 + 5 * i},{2 + i % 2},1" for i in range(3)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _engine_config(**changes: object) -> EngineConfig:
    base = {"model": "tiny-llama", "weights": "random", "policy": "continuous"}
    return build(EngineConfig, {**base, **changes})


def test_cpu_clock_replays_on_a_virtual_timeline(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", str(_trace(tmp_path / "t.csv")), "--weights", "random", "--clock", "cpu"]
    assert engine_main([*argv, "--policy", "continuous", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["clock"] == summary["clock"] == "cpu"
    assert CPU_CLOCK_NOTE in summary["notes"]
    assert summary["wall_s"] < GAP_S  # the idle gap was jumped, not slept through
    steps = pd.read_csv(out / "steps.csv")
    shapes = load_step_shapes(out / "step_shapes.jsonl")
    assert len(steps) == len(shapes) > 0
    # duration_s is the CPU time of schedule + execute; cpu_s adds the update after it.
    assert (steps["cpu_s"] >= steps["duration_s"]).all()
    assert (steps["wall_s"] > 0).all()
    for before, after in itertools.pairwise(shapes):
        # The timeline moves by exactly each step's busy CPU time, or jumps to an arrival.
        assert after.start_s >= before.start_s + before.busy_s - 1e-12
        assert before.cpu_s == pytest.approx(before.busy_s)
    first_late = min(s.start_s for s in shapes if any(r.startswith("b") for r in s.request_ids))
    assert first_late == pytest.approx(GAP_S)
    requests = pd.read_csv(out / "requests.csv")
    late = requests[requests.request_id.str.startswith("b")]
    assert (late.first_scheduled_s >= GAP_S).all()
    assert (requests.status == "finished").all()


def test_wall_clock_records_both_times_for_every_step(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path / "t.csv"))
    short = replace(trace, requests=trace.requests[:4])
    result = replay(short, ReplayConfig(engine=_engine_config()))
    frame = result.steps.to_frame()
    assert {"wall_s", "cpu_s"} <= set(frame.columns)
    assert (frame["wall_s"] >= frame["duration_s"]).all()  # the wall also holds the update
    assert (frame["cpu_s"] > 0).all()
    assert CPU_CLOCK_NOTE not in result.notes


def test_warm_up_leaves_the_engines_scheduler_alone() -> None:
    engine = LLMEngine(_engine_config(enable_prefix_caching=True))
    scheduler = engine.scheduler
    free_before = scheduler.kv.allocator.num_free_blocks
    assert engine.warm_up() >= 2  # a prefill and at least one decode
    assert engine.scheduler is scheduler
    assert not scheduler.has_unfinished()
    assert scheduler.step_idx == 0
    assert scheduler.kv.allocator.num_free_blocks == free_before
    assert engine._sampling == {}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"clock": "sundial"}, "clock must be one of"),
        ({"clock": "cpu", "device": "cuda"}, "clock 'cpu' needs device 'cpu'"),
        ({"clock": "cpu", "cpu_threads": 2}, "clock 'cpu' needs cpu_threads=1"),
    ],
)
def test_a_clock_that_cannot_measure_the_run_is_refused(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        _engine_config(**changes)


def test_engine_cli_refuses_cpu_clock_with_threads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(_trace(tmp_path / "t.csv")), "--clock", "cpu", "--cpu-threads", "0"]
    assert engine_main([*argv, "--weights", "random", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: clock 'cpu' needs cpu_threads=1")


def test_step_rows_are_made_after_the_run_and_read_as_if_made_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay's loop between steps records nothing (that was the wall-clock engine's own
    time, 27 of its 33 us between steps on the CPU); the rows made from the kept batches after
    the run are those the live batches gave."""
    import engine.replay as replay_module
    from records.schema import StepRecorder
    from records.step_shapes import record_of

    live: list[tuple[object, ...]] = []
    made_during_steps: list[int] = []
    steps_run = 0
    original_step = LLMEngine.step

    def counted_step(self: LLMEngine, now_s: float | None = None) -> object:
        nonlocal steps_run
        output = original_step(self, now_s)
        steps_run += 1
        shape = None if output.record is None else record_of(0, output.batch, 0, 0, 0, 0)
        if shape is not None and not shape.request_ids[0].startswith("__warm_up"):
            rows = StepRecorder()  # as the loop used to make them, at once
            rows.record(output.batch, output.record.start_s, output.record.duration_s)
            row = rows.to_frame().drop(columns="start_s").iloc[0].to_dict()
            live.append((row, shape.request_ids, shape.prefill_chunks, shape.decode_context_tokens))
        return output

    def spying_record_of(*args: object) -> object:
        made_during_steps.append(steps_run)
        return record_of(*args)  # type: ignore[arg-type]

    kept_batches: list[tuple[object, object]] = []
    original_add = replay_module._Collected.add_step

    def keeping_add(self: object, batch: object, record: object) -> None:
        original_add(self, batch, record)  # type: ignore[arg-type]
        kept_batches.append((batch, record))

    monkeypatch.setattr(replay_module._Collected, "add_step", keeping_add)
    monkeypatch.setattr(LLMEngine, "step", counted_step)
    monkeypatch.setattr(replay_module, "record_of", spying_record_of)
    trace = load_trace(_trace(tmp_path / "t.csv"))
    short = replace(trace, requests=trace.requests[:4])
    result = replay(short, ReplayConfig(engine=_engine_config(policy="chunked")))
    assert made_during_steps and set(made_during_steps) == {steps_run}  # all after the last
    # The kept batches hold no block tables (the runner has read them; no row does).
    assert all(batch.block_tables is None for batch, _ in kept_batches)
    frame = result.steps.to_frame().drop(columns=["start_s", "wall_s", "cpu_s"])
    assert len(frame) == len(live) == len(result.step_shapes) > 1
    for (row, ids, chunks, contexts), (_, kept), shape in zip(
        live, frame.iterrows(), result.step_shapes, strict=True
    ):
        assert kept.to_dict() == pytest.approx(row)
        assert (shape.request_ids, shape.prefill_chunks, shape.decode_context_tokens) == (
            ids, chunks, contexts,
        )  # fmt: skip
