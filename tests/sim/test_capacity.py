"""Capacity search: bracketing and bisection on a known threshold, and the command end to end
(the capacity passes, the bracket's top fails, both within the stated tolerance)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from core.settings import build
from records.sweep_table import load_sweep_csv
from sim.cli.main import main
from sim.experiments.capacity import (
    ProbeRunner,
    SearchSettings,
    find_capacity,
    passes,
    run_searches,
    search,
)
from sim.experiments.capacity_judgement import (
    concurrency,
    confidence_bounds,
    probe_repeats,
    probe_requests,
)
from sim.experiments.sweep import PointOutput, PointTask, Workers, run_point
from sim.experiments.sweep_spec import TraceSource, repeat_trace
from sim.run import RunConfig
from traces.loaders import load_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
EXAMPLE = DATA / "example.csv"


def threshold_runner(threshold: float, calls: list[list[float]]):  # type: ignore[no-untyped-def]
    """Probes that meet the SLOs exactly below ``threshold`` req/s."""

    def run(rates: list[float]) -> list[PointOutput]:
        calls.append(list(rates))
        return [
            PointOutput(
                i, {"status": "ok", "rate": r, "slo_attainment": 1.0 if r < threshold else 0.5}
            )
            for i, r in enumerate(rates)
        ]

    return run


@pytest.mark.parametrize("start", [0.3, 7.0, 40.0, 1000.0])
@pytest.mark.parametrize("width", [1, 3])
def test_search_brackets_then_bisects_to_the_tolerance(start: float, width: int) -> None:
    calls: list[list[float]] = []
    settings = SearchSettings(goodput=0.9, rel_tol=0.01)
    result = find_capacity(threshold_runner(7.5, calls), start, settings, width)
    assert result.error == ""
    low, high = result.low_rate, result.high_rate
    assert low is not None and high is not None
    assert low < 7.5 <= high
    assert (high - low) / low <= 0.01
    assert all(len(c) <= width for c in calls)
    assert len(result.probes) == sum(len(c) for c in calls)


def test_searches_share_rounds_and_each_finds_its_own_threshold() -> None:
    thresholds = [0.8, 7.5, 300.0]
    settings = SearchSettings(goodput=0.9, rel_tol=0.01)
    alone = []
    for threshold in thresholds:
        calls: list[list[float]] = []
        alone.append((find_capacity(threshold_runner(threshold, calls), 5.0, settings, 1), calls))
    batches: list[list[tuple[int, float]]] = []

    def probe(batch: list[tuple[int, float]]) -> list[dict[str, Any]]:
        batches.append(batch)
        ok = [rate < thresholds[idx] for idx, rate in batch]
        return [{"status": "ok", "slo_attainment": 1.0 if o else 0.5} for o in ok]

    together = run_searches([search(5.0, settings, 1) for _ in thresholds], probe)
    for result, (single, calls) in zip(together, alone, strict=True):
        assert (result.low_rate, result.high_rate) == (single.low_rate, single.high_rate)
        assert len(result.probes) == len(calls)
    # One batch per round: as many rounds as the longest search needs, not their sum.
    assert len(batches) == max(len(calls) for _, calls in alone)
    assert len(batches[0]) == 3


class CountingWorkers(Workers):
    """Workers that record every point they are asked to run and fake its row."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def run(self, tasks: Sequence[PointTask], keep: bool) -> Iterator[PointOutput]:
        for task in tasks:
            self.ran.append(dict(task.options))
            row = {"point": task.index, "status": "ok", **dict(task.options)}
            yield PointOutput(task.index, {**row, "slo_attainment": 1.0})


def test_a_probe_with_the_same_options_runs_once() -> None:
    source = TraceSource(path=str(EXAMPLE))
    configs = [{"max_num_seqs": 8}, {"max_num_seqs": 16}, {"max_num_seqs": 8}]
    workers = CountingWorkers()
    runner = ProbeRunner(source, configs, workers, out=None)
    rows = runner([(0, 2.0), (1, 2.0), (2, 2.0), (0, 2.0)])
    assert [r["config"] for r in rows] == [0, 1, 2, 0]
    assert [r["max_num_seqs"] for r in rows] == [8, 16, 8, 8]
    assert workers.ran == [{"max_num_seqs": 8, "rate": 2.0}, {"max_num_seqs": 16, "rate": 2.0}]
    runner([(2, 2.0), (1, 4.0)])
    assert len(workers.ran) == 3 and (runner.num_run, runner.num_reused) == (3, 3)


def test_no_bracket_is_an_error_not_a_capacity() -> None:
    result = find_capacity(threshold_runner(float("inf"), []), 1.0, SearchSettings(), 1)
    assert result.capacity_rate is None and result.high_rate is None
    assert result.low_rate == 2.0**30
    assert "every rate up to" in result.error


def test_passes_needs_a_run_that_reached_the_goodput() -> None:
    assert passes({"status": "ok", "slo_attainment": 0.9}, 0.9)
    assert not passes({"status": "ok", "slo_attainment": 0.89}, 0.9)
    assert not passes({"status": "error", "slo_attainment": None}, 0.9)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"goodput": 0.0}, "goodput"),
        ({"rel_tol": 1.0}, "rel_tol"),
        ({"start_rate": -1.0}, "start_rate"),
    ],
)
def test_settings_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SearchSettings(**kwargs)  # type: ignore[arg-type]


def test_capacity_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    argv = ["capacity", str(EXAMPLE), "--slo-ttft", "200", "--slo-tpot", "30", "--goodput", "0.9"]
    argv += ["--max-num-seqs", "32", "--rate-tol", "0.05", "--out", str(out)]
    argv += ["--report", str(tmp_path / "cap.html")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("capacity ")
    configs = load_sweep_csv(out / "capacity.csv")
    probes = load_sweep_csv(out / "capacity_probes.csv")
    low, high = configs["bracket_low_rate"].iloc[0], configs["bracket_high_rate"].iloc[0]
    assert (high - low) / low <= 0.05
    assert configs["max_num_seqs"].iloc[0] == 32
    by_rate = probes.set_index("rate")
    assert by_rate.loc[low, "slo_attainment"] >= 0.9
    assert by_rate.loc[high, "slo_attainment"] < 0.9
    assert f"{low:.4g} req/s" in printed
    assert len(probes) == configs["num_probes"].iloc[0]
    assert (out / probes["run_dir"].iloc[0] / "summary.json").is_file()
    html = (tmp_path / "cap.html").read_text()
    assert "fig-attainment" in html and "fig-ttft-rate" in html


def test_capacity_of_every_point_of_a_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[trace]\npath = "{EXAMPLE}"\n[grid]\nmax-num-seqs = [4, 64]\n')
    argv = ["capacity", "--sweep", str(spec), "--slo-ttft", "300", "--slo-tpot", "40"]
    assert main([*argv, "--rate-tol", "0.1", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    configs = load_sweep_csv(tmp_path / "out" / "capacity.csv")
    assert list(configs["max_num_seqs"]) == [4, 64]
    assert configs["capacity_rate"].iloc[0] < configs["capacity_rate"].iloc[1]


def test_bad_capacity_input_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(EXAMPLE), "--slo-ttft", "200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs both --slo-ttft MS and --slo-tpot MS" in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--goodput", "2", "must be in (0, 1], got '2'"),
        ("--rate-tol", "0", "must be in (0, 1), got '0'"),
        ("--rate-tol", "nan", "must be in (0, 1), got 'nan'"),
        ("--start-rate", "inf", "must be a finite number"),
    ],
)
def test_a_bad_search_setting_is_refused_naming_its_flag(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["capacity", str(EXAMPLE), "--slo-ttft", "200", "--slo-tpot", "30", flag, value]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert f"error: argument {flag}: {message}" in capsys.readouterr().err


def test_no_capacity_is_named_on_stderr_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["capacity", str(EXAMPLE), "--slo-ttft", "200", "--slo-tpot", "30", "--quiet"]
    assert main([*argv, "--num-blocks", "1", "--out", str(tmp_path / "cap")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: no capacity: probe at ")
    assert "num_blocks must be >= 2" in captured.err


def test_a_trace_whose_every_request_is_rejected_stops_at_the_first_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "long.csv"
    header = "request_id,arrival_s,prompt_tokens,output_tokens\n"
    trace.write_text(header + "0,0,100000,10\n1,0.5,100000,10\n")
    argv = ["capacity", str(trace), "--slo-ttft", "500", "--slo-tpot", "50"]
    assert main([*argv, "--out", str(tmp_path / "cap")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no capacity: every request is rejected, at any rate")
    assert "exceeds the model's max length 8192" in err and "(1 probes)" in err
    assert len(load_sweep_csv(tmp_path / "cap" / "capacity_probes.csv")) == 1


def test_the_search_stops_when_every_request_is_rejected() -> None:
    def run(rates: list[float]) -> list[PointOutput]:
        row = {"status": "ok", "num_requests": 3, "rejected": 3, "slo_attainment": 0.0}
        return [
            PointOutput(i, {**row, "rate": r, "reject_reason": "too long"})
            for i, r in enumerate(rates)
        ]

    result = find_capacity(run, 1.0, SearchSettings(), 4)
    assert len(result.probes) == 1
    assert result.error == "every request is rejected, at any rate (probe at 1.0 req/s): too long"


def test_a_second_search_in_the_same_out_reuses_every_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cap"
    argv = ["capacity", str(EXAMPLE), "--slo-ttft", "200", "--slo-tpot", "30"]
    argv += ["--min-probe-requests", "200", "--rate-tol", "0.1", "--out", str(out)]
    assert main(argv) == 0
    first = capsys.readouterr().out
    num_probes = len(load_sweep_csv(out / "capacity_probes.csv"))
    assert f"{num_probes} probes run, 0 reused" in first
    saved = (out / "capacity.csv").read_bytes(), (out / "capacity_probes.csv").read_bytes()
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert f"0 probes run, {num_probes} reused" in second
    assert first.splitlines()[0] == second.splitlines()[0]
    assert (
        (out / "capacity.csv").read_bytes(),
        (out / "capacity_probes.csv").read_bytes(),
    ) == saved
    # A tighter tolerance continues from the same probes and only adds the finer ones.
    assert main([*argv[:-4], "--rate-tol", "0.02", "--out", str(out)]) == 0
    third = capsys.readouterr().out
    assert f"{num_probes} reused" in third


def test_capacity_on_ray_matches_local_processes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[trace]\npath = "{EXAMPLE}"\n[grid]\nmax-num-seqs = [4, 64]\n')
    argv = ["capacity", "--sweep", str(spec), "--slo-ttft", "300", "--slo-tpot", "40"]
    argv += ["--rate-tol", "0.1", "-j", "2", "--quiet", "--min-probe-requests", "200"]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    assert main([*argv, "--ray", "--out", str(tmp_path / "ray")]) == 0
    for name in ("capacity.csv", "capacity_probes.csv"):
        local, ray = (tmp_path / "local" / name), (tmp_path / "ray" / name)
        assert ray.read_bytes() == local.read_bytes(), name


# -- issue 33: the steady state, not a short trace's transient -------------------------------


def test_a_repeated_trace_is_fresh_copies_end_to_end() -> None:
    trace = load_trace(DATA / "shared_prefix.csv")
    copies = repeat_trace(trace, 3)
    n = len(trace)
    assert len(copies) == 3 * n
    assert copies.requests[n].request_id == f"{trace.requests[0].request_id}#1"
    # Copy 1 starts one mean gap after copy 0 ends.
    gap = trace.duration_s / (n - 1)
    assert copies.requests[n].arrival_s == pytest.approx(trace.requests[-1].arrival_s + gap)
    # No copy shares a prefix block with another (a copy is not the same requests again).
    blocks = [
        {h for r in copies.requests[k * n : (k + 1) * n] for h in r.prefix_hash_ids or ()}
        for k in range(3)
    ]
    assert blocks[0] and not blocks[0] & blocks[1] and not blocks[1] & blocks[2]
    assert len(blocks[0]) == len(blocks[1]) == len(blocks[2])  # the same sharing within each
    assert [r.prompt_tokens for r in copies.requests[n:]] == [
        r.prompt_tokens for r in trace.requests
    ] * 2
    assert repeat_trace(trace, 1) is trace
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        repeat_trace(trace, 0)


def test_a_probe_is_long_enough_by_the_stated_rule() -> None:
    config = build(RunConfig, max_num_seqs=64, slo_ttft_s=0.5)
    assert concurrency(config) == 64
    assert probe_requests(config, rate=10.0) == 20 * 64
    assert probe_requests(build(RunConfig, max_num_seqs=8), rate=10.0) == 1000  # the floor
    assert concurrency(build(RunConfig, num_replicas=3, max_num_seqs=10)) == 30
    assert concurrency(build(RunConfig, policy="static", batch_size=8)) == 8
    # At 500 req/s a 0.5 s TTFT SLO asks for 20 × 0.5 s × 500 = 5,000 requests.
    assert probe_requests(config, rate=500.0) == 5000
    assert probe_requests(config, rate=10.0, min_requests=300) == 300
    assert probe_repeats(200, config, rate=10.0) == 7  # 1,280 requests of a 200-request trace


def test_an_overloaded_probe_fails_whatever_its_attainment() -> None:
    assert not passes({"status": "ok", "slo_attainment": 1.0, "overloaded": True}, 0.9)
    assert passes({"status": "ok", "slo_attainment": 1.0, "overloaded": False}, 0.9)


def test_confidence_is_the_clear_passes_and_failures_around_the_answer() -> None:
    probes = [
        {"status": "ok", "rate": 10.0, "slo_attainment_low": 0.95, "slo_attainment_high": 1.0},
        {"status": "ok", "rate": 12.0, "slo_attainment_low": 0.85, "slo_attainment_high": 0.97},
        {"status": "ok", "rate": 13.0, "slo_attainment_low": 0.7, "slo_attainment_high": 0.95},
        {"status": "ok", "rate": 14.0, "slo_attainment_low": 0.5, "slo_attainment_high": 0.8},
        {"status": "ok", "rate": 16.0, "overloaded": True},
    ]
    # 12 passed by its estimate but its interval straddles 90%: the answer is 12, the 95%
    # interval runs from 10 (clearly above) to 14 (clearly below); 13 is not clear either.
    assert confidence_bounds(probes, 12.0, 0.9) == (10.0, 14.0)
    assert confidence_bounds(probes[1:3], 12.0, 0.9) == (None, None)


@pytest.mark.slow
def test_the_capacity_of_a_short_trace_is_its_steady_states(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example's 200 requests alone give about 38 req/s at max_num_seqs 64: a burst the batch
    # absorbs. Runs 25 times as long (5,000 requests) put the steady state near 30.4 req/s.
    slos = ["--slo-ttft", "500", "--slo-tpot", "50"]
    argv = ["capacity", str(EXAMPLE), *slos, "--max-num-seqs", "64", "--rate-tol", "0.02"]
    assert main([*argv, "-j", "2", "--out", str(tmp_path / "cap")]) == 0
    printed = capsys.readouterr().out
    row = load_sweep_csv(tmp_path / "cap" / "capacity.csv").iloc[0]
    capacity = float(row["capacity_rate"])
    assert int(row["probe_repeats"]) == 7  # 20 × 64 sequences = 1,280 requests: 7 copies
    assert "replayed the trace 7 time(s) (1,400 requests)" in printed
    assert row["confidence_low_rate"] <= capacity < row["confidence_high_rate"]

    def long_run_passes(rate: float) -> bool:
        options = (("max_num_seqs", 64), ("rate", rate), ("repeats", 25))
        options += (("slo_tpot", 50), ("slo_ttft", 500))
        return passes(run_point(PointTask(0, options, TraceSource(str(EXAMPLE)))).row, 0.9)

    assert long_run_passes(0.95 * capacity)
    assert not long_run_passes(1.05 * capacity)


def test_a_run_option_no_probe_reads_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100000,10\n0.5,100000,10\n")
    argv = ["capacity", str(trace), "--slo-ttft", "500", "--slo-tpot", "50", "--quiet"]
    assert main([*argv, "--policy", "chunked", "--batch-size", "4"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        "note: --batch-size: applies to static and dynamic batching, not chunked "
        "(in 1 of 1 configurations); it has no effect there"
    )
