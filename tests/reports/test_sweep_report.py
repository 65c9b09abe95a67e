"""The sweep report: Pareto fronts computed right, one figure per swept option, a sortable
table holding every point, and (with Chromium) every figure drawn without script errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from records.sweep_table import write_sweep_csv
from reports.browser import dump_dom, find_chromium, read_rendered
from reports.sweep import (
    metric_vs_option,
    pareto_front,
    sweep_sections,
    swept_options,
    write_sweep_report,
)


def test_pareto_front_keeps_only_unbeaten_points() -> None:
    frame = pd.DataFrame(
        {
            "latency": [10.0, 20.0, 15.0, 30.0, 25.0, None],
            "throughput": [1.0, 3.0, 1.5, 2.0, 3.0, 9.0],
        }
    )
    front = pareto_front(frame, "latency", "throughput", x_high=False, y_high=True)
    # (30, 2) and (25, 3) lose to (20, 3); the row missing latency is left out.
    assert list(front.index) == [0, 2, 1]
    # More of both is better: (25, 3) and (30, 2) beat everything else, not each other.
    most = pareto_front(frame, "latency", "throughput", x_high=True, y_high=True)
    assert list(most.index) == [4, 3]


def fabricated_sweep(tmp_path: Path) -> Path:
    rows = []
    for idx, (policy, seqs) in enumerate(
        [(p, s) for p in ("continuous", "chunked") for s in (16, 64)]
    ):
        rows.append(
            {
                "point": idx,
                "run_dir": f"points/{idx}",
                "status": "ok",
                "error": "",
                "num_gpus": 1 + idx % 2,
                "policy": policy,
                "max_num_seqs": seqs,
                "tp": 1,
                "request_throughput": 1.0 + idx,
                "request_goodput": 0.5 + idx,
                "p99_ttft_ms": 100.0 * (idx + 1),
                "p99_tpot_ms": 10.0 + idx,
                "mean_e2el_ms": 500.0,
            }
        )
    rows.append({"point": 4, "run_dir": "points/4", "status": "error", "error": "ValueError: <b>"})
    rows[-1].update(policy="static", max_num_seqs=8, tp=1)
    return write_sweep_csv(tmp_path / "sweep.csv", ["max_num_seqs", "policy", "tp"], rows)


def test_sweep_report_sections(tmp_path: Path) -> None:
    from records.sweep_table import load_sweep_csv

    path = fabricated_sweep(tmp_path)
    frame = load_sweep_csv(path)
    options = ["max_num_seqs", "policy", "tp"]
    assert swept_options(frame, options) == ["max_num_seqs", "policy"]
    table, fronts, by_option = sweep_sections(frame, options)
    assert table.body_html.count("<tr>") == 6  # header and five points
    assert "ValueError: &lt;b&gt;" in table.body_html
    assert [fig_id for fig_id, _ in fronts.figures] == [
        "fig-pareto-ttft",
        "fig-pareto-tpot",
        "fig-pareto-cost",
    ]
    for _, fig in fronts.figures:
        assert len(fig.data[0].x) == 4  # the failed point has no metrics
    assert len(by_option.figures) == 2
    fig = metric_vs_option(frame, "policy")
    assert len(fig.data) == 5 and sorted(set(fig.data[0].x)) == ["chunked", "continuous"]
    html = write_sweep_report(path, tmp_path / "report.html").read_text()
    assert 'class="sortable"' in html and "fig-option-1" in html


def test_sweep_report_renders_in_chromium(tmp_path: Path) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    page = write_sweep_report(fabricated_sweep(tmp_path), tmp_path / "report.html")
    rendered = read_rendered(dump_dom(page, chromium)[0])
    assert rendered.errors == [] and rendered.rendered
    assert len(rendered.status["figures"]) == 5
    for fig_id, status in rendered.status["figures"].items():
        assert status["marks"] > 0, fig_id


def test_option_axes_read_as_typed_and_name_the_default(tmp_path: Path) -> None:
    rows = [
        {"point": 0, "run_dir": "p/0", "status": "ok", "error": "", "policy": "chunked"},
        {"point": 1, "run_dir": "p/1", "status": "ok", "error": "", "policy": "disagg"},
    ]
    metrics = {"num_gpus": 1, "request_goodput": 1.0, "p99_ttft_ms": 9.0, "p99_tpot_ms": 3.0}
    rows[0].update(max_num_seqs=64, request_throughput=1.0, **metrics)
    rows[1].update(request_throughput=2.0, **metrics)
    path = write_sweep_csv(tmp_path / "sweep.csv", ["max_num_seqs", "policy"], rows)
    frame = pd.read_csv(path)  # max_num_seqs reads back as 64.0 and NaN
    figure = metric_vs_option(frame, "max_num_seqs")
    assert sorted(figure.data[0].x) == ["64", "default"]
    html = write_sweep_report(path, tmp_path / "r.html").read_text()
    assert "max_num_seqs=64.0" not in html and "max_num_seqs=64" in html
