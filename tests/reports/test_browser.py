"""Reports rendered in headless Chromium: no JavaScript errors, every figure drawn, the
summary table holding the run's numbers, injected strings inert. Skips without Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports import RunRecords, write_report
from reports.browser import dump_dom, find_chromium, read_rendered, screenshot
from reports.html import report_sections
from tests.reports.test_html import INJECTED, hostile


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    return path


def _figure_ids(runs: list[RunRecords]) -> list[str]:
    return [fig_id for s in report_sections(runs) for fig_id, _ in s.figures]


def test_report_renders_every_figure_without_errors(
    chromium: str, example_run: RunRecords, static_run: RunRecords, tmp_path: Path
) -> None:
    runs = [example_run, static_run]
    page = write_report(runs, tmp_path / "report.html")
    dom, _ = dump_dom(page, chromium)
    rendered = read_rendered(dom)
    assert rendered.errors == []
    assert rendered.rendered, "the render script never finished"
    figures = rendered.status["figures"]
    assert sorted(figures) == sorted(_figure_ids(runs))
    for fig_id, status in figures.items():
        assert status["traces"] > 0, fig_id
        assert status["svgs"] > 0, fig_id
        assert status["marks"] > 0, fig_id
    for idx, run in enumerate(runs):
        s = run.summary
        assert rendered.cells[(str(idx), "completed")] == f"{s['completed']:,}"
        assert rendered.cells[(str(idx), "mean_ttft_ms")] == f"{s['mean_ttft_ms']:,.2f}"
        assert rendered.cells[(str(idx), "p99_tpot_ms")] == f"{s['p99_tpot_ms']:,.2f}"
        assert rendered.cells[(str(idx), "request_throughput")] == (
            f"{s['request_throughput']:,.3f}"
        )
    png = tmp_path / "report.png"
    screenshot(page, png, chromium)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {png}")


def test_injected_script_does_not_run(
    chromium: str, example_run: RunRecords, tmp_path: Path
) -> None:
    page = write_report([hostile(example_run)], tmp_path / "hostile.html", title=INJECTED)
    rendered = read_rendered(dump_dom(page, chromium)[0])
    assert rendered.errors == []  # an alert() would be recorded here
    assert rendered.rendered
    executable = [text for kind, text in rendered.scripts if kind != "application/json"]
    assert len(executable) == 3  # the page's own: error capture, plotly.js, rendering
    assert not any("alert(1)" in text for text in executable)
    assert rendered.cells[("0", "completed")] == f"{example_run.summary['completed']:,}"
