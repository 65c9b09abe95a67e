"""The serving options shared by ``python -m sim run`` and ``python -m engine run``: both
command lines take them from traces/serving_options.py, and a help override for a flag that
was never added is refused."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from traces.serving_options import (
    add_report_and_quiet_arguments,
    add_scheduling_arguments,
    add_trace_arguments,
    slo_s,
)

SHARED = [
    "on_error",
    "policy",
    "block_size",
    "num_blocks",
    "gpu_memory_utilization",
    "swap_space_gib",
    "max_num_seqs",
    "max_batch_tokens",
    "batch_size",
    "max_wait_s",
    "preemption",
    "prefix_caching",
    "max_model_len",
    "slo_ttft",
    "slo_tpot",
    "out",
    "report",
    "quiet",
]


@dataclass(frozen=True)
class _Defaults:
    block_size: int = 32
    gpu_memory_utilization: float = 0.5
    swap_space_gib: float = 2.0
    max_num_seqs: int = 7
    max_num_batched_tokens: int = 99
    batch_size: int = 3
    max_wait_s: float = 0.25
    preemption_mode: str = "swap"


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions}


def _run_parser(build: argparse.ArgumentParser) -> argparse.ArgumentParser:
    commands = next(a for a in build._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices["run"]
    return parser


def test_sim_and_engine_run_take_the_shared_options_alike() -> None:
    pytest.importorskip("torch")
    from engine.cli import build_parser as engine_parser
    from sim.cli.parser import build_parser as sim_parser

    sim_run = _actions(_run_parser(sim_parser()))
    engine_run = _actions(_run_parser(engine_parser()))
    for dest in SHARED:
        mine, theirs = sim_run[dest], engine_run[dest]
        assert mine.option_strings == theirs.option_strings, dest
        assert mine.type is theirs.type, dest
        assert type(mine) is type(theirs), dest


def test_defaults_come_from_the_config_given() -> None:
    parser = argparse.ArgumentParser()
    add_scheduling_arguments(parser, _Defaults(), ("recompute", "swap"))
    args = parser.parse_args([])
    assert (args.block_size, args.gpu_memory_utilization, args.swap_space_gib) == (32, 0.5, 2.0)
    assert (args.max_num_seqs, args.max_batch_tokens, args.batch_size) == (7, 99, 3)
    assert (args.max_wait_s, args.preemption, args.prefix_caching) == (0.25, "swap", False)
    assert args.num_blocks is None and args.max_model_len is None


def test_a_help_override_replaces_the_shared_text() -> None:
    parser = argparse.ArgumentParser()
    add_report_and_quiet_arguments(parser, {"--report": "where the HTML goes"})
    actions = {a.dest: a for a in parser._actions}
    assert actions["report"].help == "where the HTML goes"
    assert actions["quiet"].help == "no progress bar, no table"


def test_a_help_override_for_an_unknown_flag_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--num-block'\]"):
        add_scheduling_arguments(
            argparse.ArgumentParser(), _Defaults(), ("recompute",), {"--num-block": "typo"}
        )


def test_check_format_off_leaves_the_name_to_the_loader() -> None:
    checked, unchecked = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_trace_arguments(checked)
    add_trace_arguments(unchecked, check_format=False)
    assert unchecked.parse_args(["t.csv", "--format", "nope"]).format == "nope"
    with pytest.raises(SystemExit):
        checked.parse_args(["t.csv", "--format", "nope"])


def test_slo_ms_to_seconds() -> None:
    assert slo_s(250.0) == 0.25
    assert slo_s(None) is None
