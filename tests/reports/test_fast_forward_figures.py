"""The report draws a fast-forwarded run (one ``steps.csv`` row per run of identical steps) as
it draws the same run stepped one by one: per-step values over each row's whole span, lines
that reach the end of the run, and the same figure data wherever either is defined."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
import pytest

from core.settings import build
from records.run_dir import RunRecords, records_from_result
from reports import load, memory
from reports.step_series import value_at
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
CONFIGS = {
    "chunked": build(RunConfig, policy="chunked", model="Llama-2-7B", hardware="A100-80GB"),
    "static-disagg": build(
        RunConfig, policy="disagg", pool_policy="static", model="Llama-2-7B", hardware="A100-80GB"
    ),
}


def _runs(name: str) -> tuple[RunRecords, RunRecords]:
    trace = load_trace(DATA / "bursty.csv")
    fast = simulate(trace, CONFIGS[name])
    slow = simulate(
        trace, CONFIGS[name].__class__(**{**_fields(CONFIGS[name]), "fast_forward": False})
    )
    assert len(fast.steps.to_frame()) < len(slow.steps.to_frame()), "nothing was skipped"
    return records_from_result(fast), records_from_result(slow)


def _fields(config: RunConfig) -> dict[str, object]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


def _series(fig: go.Figure) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {t.name: (np.asarray(t.x, dtype=float), np.asarray(t.y, dtype=float)) for t in fig.data}


def _compare(fast: go.Figure, slow: go.Figure, rtol: float, atol: float) -> None:
    a, b = _series(fast), _series(slow)
    assert a.keys() == b.keys()
    for name, (xa, ya) in a.items():
        xb, yb = b[name]
        assert len(xa) > 1
        assert xa[-1] == pytest.approx(xb[-1]), f"{name}: the lines end at different times"
        times = np.linspace(0.0, xa[-1], 4001)[1:-1]
        va, vb = value_at(xa, ya, times), value_at(xb, yb, times)
        both = ~np.isnan(va) & ~np.isnan(vb)
        assert np.array_equal(np.isnan(va), np.isnan(vb)), f"{name}: idle gaps differ"
        np.testing.assert_allclose(va[both], vb[both], rtol=rtol, atol=atol, err_msg=name)


# (figure, rtol, atol). Counts and tokens per step are exact; a row of identical steps shows
# their mean duration (attention grows with the context) and mean memory (one more token per
# sequence each step), so those agree to within that growth.
FIGURES: dict[str, tuple[Callable[[RunRecords], go.Figure], float, float]] = {
    "load": (load.load_over_time, 0.0, 0.0),
    "batch": (load.batch_composition, 0.0, 0.0),
    "memory": (memory.kv_memory_over_time, 0.0, 0.01),
    "duration": (lambda run: load.step_duration([run]), 0.05, 0.0),
}


def _keep_every_row(x: npt.ArrayLike, series: object) -> npt.NDArray[np.int64]:
    return np.arange(np.asarray(x).size, dtype=np.int64)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("figure", sorted(FIGURES))
def test_fast_forward_and_stepped_runs_draw_the_same_figures(
    config: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Equal up to display downsampling: compare with every row drawn.
    monkeypatch.setattr(load, "decimate_rows", _keep_every_row)
    monkeypatch.setattr(memory, "decimate_rows", _keep_every_row)
    fast, slow = _runs(config)
    make, rtol, atol = FIGURES[figure]
    _compare(make(fast), make(slow), rtol, atol)


def test_a_multi_step_row_is_drawn_per_step_over_its_whole_span() -> None:
    fast, _ = _runs("chunked")
    steps = fast.steps
    row = steps[steps["num_steps"] > 10].iloc[0]
    end_s = row["start_s"] + row["duration_s"]
    fig = load.step_duration([fast])
    ((x, y),) = _series(fig).values()
    inside = np.array([row["start_s"] + 1e-9, end_s - 1e-9])
    expected = row["duration_s"] / row["num_steps"] * 1000.0
    np.testing.assert_allclose(value_at(x, y, inside), expected)
    last_end = float((steps["start_s"] + steps["duration_s"]).max())
    for make in (load.load_over_time, load.batch_composition):
        for trace in make(fast).data:
            assert trace.x[-1] == pytest.approx(last_end), "the line stops before the run ends"
            assert trace.line.shape == "hv"
