"""What the command line prints and refuses: the trace's own statistics, runs that admit
nothing, the deployment, compare's items, files that are gzip or binary, and the smaller
points of issue 14 (each test failed before its fix)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

import sim.cli.run
import sim.run
from core.settings import build
from sim.cli.main import main
from sim.run import RunConfig, simulate
from traces.loaders import load_trace

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "traces" / "data"
EXAMPLE = DATA / "example.csv"
SMALL = ["--model", "Llama-2-7B", "--hardware", "A100-80GB"]


def _call(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


def _table_cell(html: str, row: str) -> str:
    match = re.search(rf"<th scope=\"row\">{row}</th><td>([^<]*)</td>", html)
    assert match, f"no {row!r} row in the report"
    return match.group(1)


# -- 11, 12: statistics and runs that admit nothing ----------------------------------------


def test_report_shows_the_traces_output_lengths_not_the_generated_ones(tmp_path: Path) -> None:
    report = tmp_path / "r.html"
    argv = ["run", str(EXAMPLE), *SMALL, "--max-model-len", "1024", "--quiet"]
    assert main([*argv, "--report", str(report)]) == 0
    stats = load_trace(EXAMPLE).length_stats()
    html = report.read_text()
    assert "output tokens</th>" in html
    assert f"mean {stats['output_mean']:,.0f} · median {stats['output_median']:,.0f}" in html


def test_a_run_that_admits_nothing_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.html"
    assert main(["run", str(EXAMPLE), *SMALL, "--num-blocks", "2", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    kv_line = next(line for line in out.splitlines() if line.startswith("KV memory"))
    assert "no request admitted" in kv_line and "%" not in kv_line
    assert "200 of 200 requests (100%) rejected" in out
    assert "no request was admitted, so no step ran and its charts are empty" in report.read_text()


# -- 13: the deployment ---------------------------------------------------------------------


def test_terminal_and_report_show_the_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir, report = tmp_path / "out", tmp_path / "r.html"
    argv = ["run", str(EXAMPLE), *SMALL, "--policy", "disagg", "--prefill-replicas", "2"]
    argv += ["--link-gbps", "100", "--out", str(out_dir), "--report", str(report)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert " TP1," in out and " x1" not in out
    deployment = next(line for line in out.splitlines() if line.startswith("deployment"))
    for part in ("2 prefill + 1 decode", "continuous batching", "round_robin", "100 Gb/s"):
        assert part in deployment
    html = report.read_text()
    assert "2 prefill + 1 decode" in _table_cell(html, "deployment")
    assert _table_cell(html, "run directory") == str(out_dir)
    assert (
        main(["run", str(EXAMPLE), *SMALL, "--replicas", "3", "--quiet", "--report", str(report)])
        == 0
    )
    assert (
        _table_cell(report.read_text(), "deployment") == "3 colocated replicas, round_robin router"
    )
    assert _table_cell(report.read_text(), "run directory") == "(in memory)"


# -- 14: compare ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policies", "chunked,chunked"], "--policies: item 'chunked' appears twice"),
        (["--policies", "chunked", "--policy", "static"], "--policy: compare runs one policy"),
        (["--policies", "chunked:paged:pow2"], "applies to contiguous memory only"),
        (
            ["--policies", "static,chunked", "--max-num-batched-tokens", "64"],
            "max_num_batched_tokens must be >= max_num_seqs (256) under policy 'chunked'",
        ),
    ],
)
def test_compare_refuses_duplicates_and_run_only_options(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    assert _call(["compare", str(EXAMPLE), *SMALL, "--quiet", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists(), "nothing is written before the refusal"


def test_compare_judges_each_items_own_policy(tmp_path: Path) -> None:
    # Static and dynamic batching spend no token budget: a small one is no reason to refuse
    # them (the check is each item's, not the default policy's).
    out = tmp_path / "cmp"
    argv = ["compare", str(EXAMPLE), *SMALL, "--quiet", "--out", str(out)]
    assert _call([*argv, "--policies", "static,dynamic", "--max-num-batched-tokens", "64"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dynamic", "static"]


# -- 15: messages that name the file ---------------------------------------------------------


def test_gzip_traces_are_read_directly(tmp_path: Path) -> None:
    packed = tmp_path / "example.csv.gz"
    packed.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    trace = load_trace(packed)
    assert trace.requests == load_trace(EXAMPLE).requests
    assert trace.name == "example"


@pytest.mark.parametrize("option", ["trace", "--profile", "--model", "--length-table"])
def test_binary_files_are_named_not_decoded(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    if option == "trace":
        argv = ["run", str(binary), "--quiet"]
    elif option == "--length-table":
        argv = ["trace", "generate", "-o", str(tmp_path / "t.csv"), "--lengths", "table"]
        argv += ["--length-table", str(binary)]
    else:
        argv = ["run", str(EXAMPLE), "--quiet", option, str(binary)]
    assert _call(argv) == 2
    err = capsys.readouterr().err
    assert f"{binary}:" in err and "binary" in err
    assert "codec can't decode" not in err


def test_a_broken_gzip_and_invalid_utf8_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "cut.csv.gz"
    broken.write_bytes(gzip.compress(EXAMPLE.read_bytes())[:200])
    assert _call(["run", str(broken), "--quiet"]) == 2
    assert f"{broken}: trace is a broken gzip file" in capsys.readouterr().err
    latin = tmp_path / "latin.csv"
    latin.write_bytes(EXAMPLE.read_bytes()[:2000] + b"\xe9\xe9\xe9\n" + b"x" * 9000)
    assert _call(["run", str(latin), "--quiet"]) == 2
    assert f"{latin}: trace is not UTF-8 text (byte 0xe9" in capsys.readouterr().err


def test_a_folder_that_is_not_a_run_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = ["-o", str(tmp_path / "r.html")]
    assert _call(["report", str(tmp_path), *report]) == 2
    assert f"{tmp_path}: not a run directory (it holds no summary.json" in capsys.readouterr().err
    assert _call(["report", str(tmp_path / "nope"), *report]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in capsys.readouterr().err


def test_a_broken_summary_json_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", str(EXAMPLE), *SMALL, "--quiet", "--out", str(out)]) == 0
    (out / "summary.json").write_text('{"summary": {"completed": 1,\n')
    assert _call(["report", str(out), "-o", str(tmp_path / "r.html")]) == 2
    assert f"{out / 'summary.json'}:2: not valid JSON" in capsys.readouterr().err


def test_out_and_report_paths_are_checked_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("")
    assert _call(["run", str(EXAMPLE), "--quiet", "--out", str(a_file)]) == 2
    assert f"--out {a_file}: exists and is not a directory" in capsys.readouterr().err
    assert _call(["run", str(EXAMPLE), "--quiet", "--report", str(tmp_path)]) == 2
    assert f"--report {tmp_path}: is a directory" in capsys.readouterr().err


# -- 16: smaller points -----------------------------------------------------------------------


def test_arrivals_going_backwards_are_reported_in_the_files_units_and_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n0,5.5,10,5\n1,2.25,10,5\n")
    assert _call(["run", str(trace), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "t.csv:3: arrival_s: timestamp goes backwards: 2.25 is before 5.5 on line 2" in err
    assert "previous row" not in err


def test_a_length_table_points_to_trace_generate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "lengths.csv"
    table.write_text("num_prefill_tokens,num_decode_tokens\n100,20\n300,40\n")
    assert _call(["run", str(table), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"trace generate --lengths table --length-table {table}" in err
    out = tmp_path / "t.csv"
    argv = ["trace", "generate", "--lengths", "table", "--length-table", str(table), "-o", str(out)]
    assert _call(argv) == 0
    assert len(load_trace(out)) == 200


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-model-len", "100000"], "exceeds Llama-2-7B's context of 4096 tokens"),
        (["--slo-ttft", "-5"], "argument --slo-ttft: must be > 0"),
        (["--reservation", "pow2"], "--reservation pow2: applies to contiguous memory only"),
        (["--policy", "continuous", "--reservation", "max"], "applies to contiguous memory"),
    ],
)
def test_settings_that_cannot_apply_are_refused(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _call(["run", str(EXAMPLE), *SMALL, "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err


def test_reservation_with_contiguous_memory_still_runs(tmp_path: Path) -> None:
    argv = ["run", str(EXAMPLE), *SMALL, "--quiet", "--policy", "static", "--reservation", "pow2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["reservation"] == "pow2"


def test_run_and_trace_info_name_bad_row_handling_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n1,0.0,abc,5\n2,0.1,10,5\n")
    for argv in (["run", str(bad), "--quiet"], ["trace", "info", str(bad)]):
        assert _call(argv) == 2
        assert _call([*argv, "--on-error", "skip"]) == 0
    assert _call(["run", str(bad), "--skip-bad-rows"]) == 2
    assert "unrecognized arguments: --skip-bad-rows" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _call(["--version"]) == 0
    assert re.fullmatch(r"servesim \S+\n", capsys.readouterr().out)


def test_ctrl_c_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.cli.run, "simulate", interrupted)
    assert main(["run", str(EXAMPLE), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert err == "interrupted\n"


class _Bar:
    """Stands in for tqdm: records its total and every update."""

    made: ClassVar[list[_Bar]] = []

    def __init__(self, total: int, disable: bool, **kwargs: Any) -> None:
        self.total, self.disable, self.n = total, disable, 0
        _Bar.made.append(self)

    def update(self, count: int) -> None:
        self.n += count

    def close(self) -> None:
        return None


@pytest.mark.parametrize("policy", ["chunked", "static", "disagg"])
def test_progress_counts_requests_done_not_simulated_seconds(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim.run, "tqdm", _Bar)
    monkeypatch.setattr(sim.run.sys.stderr, "isatty", lambda: True)
    _Bar.made.clear()
    trace = load_trace(DATA / "parallel_sampling.csv")
    config = build(RunConfig, policy=policy, model="Llama-2-7B", num_blocks=150, max_model_len=2048)
    result = simulate(trace, config, progress=True)
    (bar,) = _Bar.made
    assert not bar.disable
    assert bar.total == bar.n == len(trace)
    assert 0 < result.summary["rejected"] < len(trace)  # rejections count as done too


def test_rejections_are_summarised_with_the_commonest_reason_and_a_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", str(EXAMPLE), *SMALL, "--max-model-len", "1024"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("rejected"))
    assert re.search(r"\d+ of 200 requests \(\d+%\) rejected; most common reason", line)
    assert "exceeds the model's max length 1024" in line
    assert "--max-model-len" in line and "--model" in line


def test_readme_commands_run_from_a_plain_clone() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python -m sim")]
    assert commands
    for command in commands:
        paths = [word for word in command.split() if "/" in word and not word.startswith("-")]
        for word in paths:
            if word.startswith(("traces/", "../shared")) and "TRACE" not in word:
                assert (ROOT / word).exists() and not word.startswith("../"), command


# -- issue 33 --------------------------------------------------------------------------------


def test_a_run_where_nothing_finishes_at_one_instant_writes_its_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "one.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n0,0,500000,10\n")
    out, report = tmp_path / "out", tmp_path / "r.html"
    assert main(["run", str(trace), "--out", str(out), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "nothing finished" in printed
    assert "throughput   none" in printed
    assert {p.name for p in out.iterdir()} == {"requests.csv", "steps.csv", "summary.json"}
    assert json.loads((out / "summary.json").read_text())["summary"]["completed"] == 0
    assert report.is_file()


def test_rows_skipped_are_named_on_stderr_and_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(
        "request_id,arrival_s,prompt_tokens,output_tokens\n0,0.0,100,10\n1,0.1,-5,10\n2,0.2,abc,10\n"
    )
    argv = ["run", str(trace), "--on-error", "skip", "--out", str(tmp_path / "o"), "--quiet"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"note: skipped 2 row(s) of {trace}" in err
    assert f"{trace}:3: prompt_tokens: must be >= 1, got -5" in err
    assert f"{trace}:4: prompt_tokens: not a number: 'abc'" in err
    notes = json.loads((tmp_path / "o" / "summary.json").read_text())["notes"]
    assert notes[1:] == [
        f"{trace}:3: prompt_tokens: must be >= 1, got -5",
        f"{trace}:4: prompt_tokens: not a number: 'abc'",
    ]


@pytest.mark.parametrize("option", ["--report", "--out"])
def test_an_output_that_cannot_be_written_stops_the_run_before_it_simulates(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / ("r.html" if option == "--report" else "run")
    assert main(["run", str(DATA / "example.csv"), option, str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"error: {option}: cannot create {target.parent if option == '--report' else target}"
    )
    assert "trace        " not in captured.out  # (nothing was simulated)


def test_a_trace_column_no_field_reads_is_named_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,priorty\n0,50,5,1\n0.1,50,5,0\n")
    assert main(["run", str(trace), "--scheduling-policy", "priority", "--quiet"]) == 0
    assert "note: columns not read" in capsys.readouterr().err


def test_priority_scheduling_of_a_trace_without_priorities_is_noted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["run", str(DATA / "example.csv"), "--scheduling-policy", "priority", "--quiet"]) == 0
    )
    assert "every request of example has priority 0" in capsys.readouterr().err
