"""Every numeric option of ``run``, ``compare`` and ``trace generate`` either runs sanely or
exits 2 with an ``error:`` line naming the option, for NaN, infinity, -1 and 0; and the
options that used to be accepted wrongly (NaN link, NaN wait, swap without swap space)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from core.settings import build
from sim.cli.main import main
from sim.cli.parser import build_parser
from sim.run import RunConfig
from traces.loaders import load_trace

VALUES = ("nan", "inf", "-1", "0")
TRACE = (
    "request_id,arrival_s,prompt_tokens,output_tokens\n"
    "0,0.0,40,6\n1,0.01,300,3\n2,0.02,17,1\n3,0.5,80,12\n"
)
# Small and fast; disagg with dynamic pools so that the link and wait options matter.
RUN_BASE = ["--model", "Llama-2-7B", "--hardware", "A100-80GB", "--num-blocks", "64", "--quiet"]
DISAGG = ["--policy", "disagg", "--pool-policy", "dynamic", "--max-wait-s", "0.05"]


def _subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _numeric_options(parser: argparse.ArgumentParser) -> list[str]:
    """Options that take a number: their type is not ``str`` and they offer no choices."""
    return [
        action.option_strings[-1]
        for action in parser._actions
        if action.option_strings
        and action.type is not None
        and action.choices is None
        and action.nargs is None
    ]


def _call(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse refuses the value
        return int(stop.code or 0)


def _check_refusal(code: int, option: str, value: str, err: str) -> None:
    assert code == 2, f"{option} {value}: exit {code}"
    assert "Traceback" not in err
    line = next(line for line in err.splitlines() if "error:" in line)
    assert option in line, f"{option} {value}: {line!r} does not name the option"


def _check_sane_run(out: Path) -> None:
    payload = json.loads((out / "summary.json").read_text())
    summary = payload["summary"]
    assert summary["completed"] + summary["rejected"] == summary["num_requests"] == 4
    for key, value in summary.items():
        if isinstance(value, float):
            assert math.isfinite(value) and value >= 0, f"{key} = {value}"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    path.write_text(TRACE)
    return path


def test_the_walk_covers_the_options_the_issue_names() -> None:
    run = _numeric_options(_subparser("run"))
    for option in (
        "--link-gbps",
        "--link-latency-us",
        "--max-wait-s",
        "--swap-space-gib",
        "--gpu-memory-utilization",
        "--slo-ttft",
        "--num-blocks",
        "--tp",
    ):
        assert option in run
    assert "--rate" in _numeric_options(_subparser("trace", "generate"))


@pytest.mark.parametrize("command", ["run", "compare"])
@pytest.mark.parametrize("shape", ["colocated", "disagg"])
def test_every_numeric_option_runs_sanely_or_is_refused_by_name(
    command: str, shape: str, trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = DISAGG if shape == "disagg" else []
    if command == "compare":
        extra = ["--policies", "disagg" if shape == "disagg" else "continuous", *extra[2:]]
    options = _numeric_options(_subparser(command))
    assert len(options) >= 19
    for option in options:
        for value in VALUES:
            out = tmp_path / f"{command}{option}{value}"
            argv = [command, str(trace), *RUN_BASE, *extra, option, value, "--out", str(out)]
            code = _call(argv)
            err = capsys.readouterr().err
            if code == 0:
                assert "error" not in err
                _check_sane_run(next(out.rglob("summary.json")).parent)
            else:
                _check_refusal(code, option, value, err)


def test_every_numeric_option_of_trace_generate_runs_sanely_or_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = _numeric_options(_subparser("trace", "generate"))
    assert len(options) >= 14
    for option in options:
        for value in VALUES:
            out = tmp_path / f"gen{option}{value}.csv"
            argv = ["trace", "generate", "-o", str(out), "--num-requests", "5", option, value]
            code = _call(argv)
            err = capsys.readouterr().err
            if code == 0:
                trace = load_trace(out)
                assert len(trace) >= 1 and all(r.prompt_tokens >= 1 for r in trace.requests)
                assert all(math.isfinite(r.arrival_s) for r in trace.requests)
            else:
                _check_refusal(code, option, value, err)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--link-gbps", "nan"),
        ("--link-latency-us", "nan"),
        ("--max-wait-s", "nan"),
        ("--swap-space-gib", "inf"),
        ("--gpu-memory-utilization", "1.5"),
    ],
)
def test_nan_and_out_of_range_floats_are_refused_by_name(
    option: str, value: str, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _call(["run", str(trace), *RUN_BASE, *DISAGG, option, value])
    err = capsys.readouterr().err
    _check_refusal(code, option, value, err)
    assert "NaN" not in err or value == "nan"


@pytest.mark.parametrize(
    "changes",
    [
        {"link_bandwidth_gbps": math.nan},
        {"link_latency_us": math.nan},
        {"max_wait_s": math.nan},
        {"swap_space_gib": math.inf},
        {"slo_ttft_s": -0.1},
        {"preemption_mode": "swap", "swap_space_gib": 0.0},
    ],
)
def test_run_config_refuses_what_the_cli_refuses(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(changes))):
        build(RunConfig, **changes)  # type: ignore[arg-type]


def test_swap_without_swap_space_is_refused(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(trace), *RUN_BASE, "--preemption", "swap", "--swap-space-gib", "0"]
    assert _call(argv) == 2
    assert "--swap-space-gib" in capsys.readouterr().err
    argv[-1] = "0.000001"  # less than one KV block
    assert _call(argv) == 2
    assert "holds no KV block" in capsys.readouterr().err


def test_no_async_scheduling_adds_host_work_to_every_step(trace: Path, tmp_path: Path) -> None:
    summaries = {}
    for name, extra in (("async", []), ("sync", ["--no-async-scheduling"])):
        out = tmp_path / name
        assert _call(["run", str(trace), *RUN_BASE, "--out", str(out), *extra]) == 0
        summaries[name] = json.loads((out / "summary.json").read_text())
    assert summaries["async"]["config"]["async_scheduling"] is True
    assert summaries["sync"]["config"]["async_scheduling"] is False
    # The 2 ms host overhead hides under decode kernels only when overlapped.
    async_tpot = summaries["async"]["summary"]["median_tpot_ms"]
    sync_tpot = summaries["sync"]["summary"]["median_tpot_ms"]
    assert sync_tpot > async_tpot + 1.0


def test_host_slowdown_stretches_the_hosts_work(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summaries = {}
    for name, extra in (("as set", []), ("slower", ["--host-slowdown", "2"])):
        out = tmp_path / name
        argv = ["run", str(trace), *RUN_BASE, "--no-async-scheduling", "--out", str(out)]
        assert _call([*argv, *extra]) == 0
        summaries[name] = json.loads((out / "summary.json").read_text())
    assert summaries["as set"]["config"]["host_slowdown"] == 1.0
    assert summaries["slower"]["config"]["host_slowdown"] == 2.0
    # vLLM's 2 ms a step, twice over, on every decode step.
    tpot = [summaries[name]["summary"]["median_tpot_ms"] for name in ("as set", "slower")]
    assert tpot[1] > tpot[0] + 1.5
    assert _call(["run", str(trace), *RUN_BASE, "--host-slowdown", "0"]) == 2
    assert "argument --host-slowdown: must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--policy", "chunked", "--batch-size", "4"], ["--batch-size: applies to static"]),
        (["--policy", "static", "--max-wait-s", "0.1"], ["--max-wait-s: applies to dynamic"]),
        (["--swap-space-gib", "1"], ["--swap-space-gib: preemption recomputes"]),
        (
            ["--link-gbps", "100", "--prefill-replicas", "2"],
            ["--prefill-replicas: applies to --policy disagg only", "--link-gbps: applies to"],
        ),
        ([*DISAGG, "--link-gbps", "100", "--prefill-replicas", "2"], []),
        ([*DISAGG, "--replicas", "3"], ["--replicas: counts colocated replicas"]),
        (["--enable-expert-parallel"], ["--enable-expert-parallel: Llama-2-7B has no experts"]),
        (["--router", "least_outstanding"], ["--router: one replica takes every arrival"]),
        (["--router", "least_outstanding", "--replicas", "2"], []),
        (
            ["--router", "prefix_aware", "--data-parallel-size", "2"],
            ["--router: data-parallel ranks take their arrivals from vLLM's balancer"],
        ),
        (
            ["--no-async-scheduling", "--no-scheduling-lag"],
            ["--no-scheduling-lag: the lag is async scheduling's"],
        ),
        (["--no-scheduling-lag"], []),
        (["--policy", "dynamic", "--batch-size", "4", "--max-wait-s", "0.1"], []),
        (["--preemption-mode", "swap", "--swap-space-gib", "1"], []),
    ],
)
def test_an_option_the_run_never_reads_is_named_not_ignored(
    flags: list[str], said: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    assert main(["run", str(trace), *RUN_BASE, *flags]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == len(said), notes
    for note, words in zip(notes, said, strict=True):
        assert words in note and note.endswith("; it has no effect on this run")
