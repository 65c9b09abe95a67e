"""Figure functions: one figure per question, titled, with unit-bearing axes, drawing the
run's data (stacks add up, the paged/contiguous contrast shows)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from reports import RunRecords, disagg, latency, load, memory
from reports.html import report_sections


def _axis_titles(fig: object) -> tuple[str, str]:
    layout = fig.layout  # type: ignore[attr-defined]
    return layout.xaxis.title.text, layout.yaxis.title.text


def test_every_figure_has_a_title_axis_titles_and_data(
    example_run: RunRecords, static_run: RunRecords
) -> None:
    runs = [example_run, static_run]
    figures = [f for s in report_sections(runs) for f in s.figures]
    assert len(figures) == 4 + 1 + 2 * 2 + 1 + 1 + 2
    for fig_id, fig in figures:
        x_title, y_title = _axis_titles(fig)
        assert fig.layout.title.text, fig_id
        assert x_title, fig_id
        assert y_title or fig_id == "fig-kv-breakdown"
        assert fig.data and all(len(trace.x) > 0 for trace in fig.data), fig_id


@pytest.mark.parametrize("column", list(latency.LATENCY_NAMES))
def test_latency_cdf_ends_at_the_largest_finished_value(
    example_run: RunRecords, static_run: RunRecords, column: str
) -> None:
    fig = latency.latency_cdf([example_run, static_run], column)
    assert [t.name for t in fig.data] == ["chunked / paged", "static / contiguous (max)"]
    assert "(ms)" in fig.layout.xaxis.title.text
    for trace, run in zip(fig.data, [example_run, static_run], strict=True):
        finished = run.requests[run.requests["status"] == "finished"][column].dropna()
        assert trace.x[-1] == pytest.approx(finished.max())
        assert trace.y[-1] == pytest.approx(1.0)


def test_kv_memory_stack_adds_up_to_all_slots(
    example_run: RunRecords, static_run: RunRecords
) -> None:
    fig = memory.kv_memory_over_time(example_run)
    # Paged memory, prefix caching off: no reservation waste, no cached-free band.
    assert [t.name for t in fig.data] == ["real tokens", "internal fragmentation", "free"]
    total = np.sum([np.asarray(t.y) for t in fig.data], axis=0)
    np.testing.assert_allclose(total, 1.0)
    names = [t.name for t in memory.kv_memory_over_time(static_run).data]
    assert "reservation waste" in names and "cached-free (prefix cache)" not in names


def test_a_kind_no_step_holds_draws_no_band(fabricated: Callable[..., RunRecords]) -> None:
    run = fabricated(10, 6)
    names = [t.name for t in memory.kv_memory_over_time(run).data]
    assert "cached-free (prefix cache)" not in names and "reservation waste" not in names
    run.steps["cached_free_slots"] = [0, 0, 16, 0, 0, 0]
    names = [t.name for t in memory.kv_memory_over_time(run).data]
    assert "cached-free (prefix cache)" in names


def test_queue_lines_run_through_idle_gaps(fabricated: Callable[..., RunRecords]) -> None:
    run = fabricated(10, 3)
    run.steps["start_s"] = [0.0, 5.0, 5.5]  # idle from 0.01 s to 5 s
    run.steps["duration_s"] = [0.01, 0.5, 0.5]
    run.steps["num_running"] = [3, 2, 1]
    run.steps["num_waiting"] = [4, 1, 0]
    lines = {t.name: (list(t.x), list(t.y)) for t in load.load_over_time(run).data}
    x, running = lines["running"]
    assert x == [0.0, 0.01, 5.0, 5.5, 6.0]
    assert running == [3, 0, 2, 1, 1]  # nothing runs while the replica idles
    assert lines["waiting"][1] == [4, 4, 1, 0, 0]  # the last count holds
    assert lines["swapped"][1] == [0, 0, 0, 0, 0]


def test_breakdown_shows_contiguous_reservations_wasting_memory(
    example_run: RunRecords, static_run: RunRecords
) -> None:
    fig = memory.kv_breakdown([example_run, static_run])
    real = {t.name: list(t.x) for t in fig.data}["real tokens"]
    waste = {t.name: list(t.x) for t in fig.data}["reservation waste"]
    assert real[0] > 0.9 and real[1] < 0.5
    assert waste[0] == 0.0 and waste[1] > 0.3
    shares = np.sum([np.asarray(t.x) for t in fig.data], axis=0)
    np.testing.assert_allclose(shares, 1.0)


def test_kv_utilisation_is_time_weighted(fabricated: Callable[..., RunRecords]) -> None:
    run = fabricated(10, 4)
    steps = run.steps
    steps["duration_s"] = [1.0, 0.0, 0.0, 3.0]
    steps["real_token_slots"] = [100_000, 0, 0, 0]
    steps["internal_fragmentation_slots"] = 0
    steps["free_slots"] = 100_000 - steps["real_token_slots"]
    assert memory.kv_utilisation(run) == (pytest.approx(0.25), pytest.approx(1.0))


def test_long_runs_are_decimated(fabricated: Callable[..., RunRecords]) -> None:
    run = fabricated(50_000, 200_000)
    for fig in (load.load_over_time(run), memory.kv_memory_over_time(run)):
        assert all(len(t.x) <= 2 * 2000 * 6 + 2 for t in fig.data)
        assert max(len(t.x) for t in fig.data) < 200_000
    scatter = latency.latency_vs_arrival([run], "ttft_ms").data[0]
    assert len(scatter.x) <= 4002 and max(scatter.y) == run.requests["ttft_ms"].max()


def test_disaggregation_section_only_when_columns_exist(
    fabricated: Callable[..., RunRecords],
) -> None:
    plain, split = fabricated(500, 1000), fabricated(500, 1000, label="disagg", disagg=True)
    assert "disagg" not in [s.section_id for s in report_sections([plain])]
    section = {s.section_id: s for s in report_sections([plain, split])}["disagg"]
    ids = [fig_id for fig_id, _ in section.figures]
    assert ids == ["fig-kv-transfer-volume", "fig-kv-link-queueing", "fig-pool-utilisation-1"]
    volume = disagg.kv_transfer_volume([plain, split])
    assert len(volume.data) == 1
    seconds = np.diff(volume.data[0].x)[0]
    transferred = np.sum(volume.data[0].y) * seconds * 1e9
    assert transferred == pytest.approx(split.requests["kv_transfer_bytes"].sum())
    pools = disagg.pool_utilisation(split)
    assert sorted(t.name for t in pools.data) == ["decode", "prefill"]


def test_priority_section_only_for_runs_with_classes(example_run: RunRecords) -> None:
    assert "priority" not in [s.section_id for s in report_sections([example_run])]
    requests = example_run.requests.copy()
    requests["priority"] = [i % 3 for i in range(len(requests))]
    ranked = dataclasses.replace(example_run, requests=requests, label="ranked")
    sections = {s.section_id: s for s in report_sections([example_run, ranked])}
    figures = dict(sections["priority"].figures)
    assert list(figures) == ["fig-priority-ttft", "fig-priority-e2el"]
    ttft = figures["fig-priority-ttft"]
    # One line per class of the run that has them; each ends at its class's largest TTFT.
    assert [t.name.rsplit(", ", 1)[1] for t in ttft.data] == [f"priority {p}" for p in (0, 1, 2)]
    for trace, priority in zip(ttft.data, (0, 1, 2), strict=True):
        finished = requests[(requests["status"] == "finished") & (requests["priority"] == priority)]
        assert max(trace.x) == finished["ttft_ms"].max()
