"""One serving configuration across the command lines: ``python -m sim run`` (and the commands
that share its options), ``python -m engine run`` and ``python -m sim validate`` generate each
KV cache and scheduler flag once from the core's table, with the config's default; the old
spellings parse to the same config; a bad value is refused in the same words by each; and each
takes its policies from the one list."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from core.config import LAYOUT_SETTINGS, SETTINGS, CacheConfig, SchedulerConfig, Setting
from core.policies import POLICIES
from core.settings import flat_settings, setting_names
from fidelity.cli.validate import config_from_args as validate_config
from fidelity.validate_config import ValidateConfig
from sim.cli.main import main as sim_main
from sim.cli.options import config_from_args as sim_config
from sim.cli.parser import build_parser
from sim.run import RunConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "traces" / "data" / "example.csv"
CORE = setting_names(CacheConfig) + setting_names(SchedulerConfig)
OLD_AND_NEW = [
    (["--max-batch-tokens", "512"], ["--max-num-batched-tokens", "512"]),
    (["--prefix-caching"], ["--enable-prefix-caching"]),
    (["--preemption", "swap"], ["--preemption-mode", "swap"]),
]


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _sim(*path: str) -> argparse.ArgumentParser:
    return _subparser(build_parser(), *path)


def _engine() -> argparse.ArgumentParser:
    pytest.importorskip("torch")
    from engine.cli import build_parser as engine_parser

    return _subparser(engine_parser(), "run")


def _settings_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in CORE:
            assert action.dest not in actions, f"{action.dest} added twice"
            actions[action.dest] = action
    return actions


@pytest.mark.parametrize(
    "command", [("run",), ("compare",), ("capacity",), ("measured", "validate"), ("validate",)]
)
def test_each_sim_command_takes_each_setting_once_as_the_table_says(command: tuple[str]) -> None:
    actions = _settings_actions(_sim(*command))
    expected = set(CORE) - (set(LAYOUT_SETTINGS) if command == ("validate",) else set())
    assert set(actions) == expected
    for row in SETTINGS:
        if row.field in actions:
            assert actions[row.field].option_strings == _spellings(row)


def _spellings(row: Setting) -> list[str]:
    """A setting's flag and its old spellings; an on/off one's each followed by its ``--no-``
    form, as argparse's ``BooleanOptionalAction`` makes them."""
    names = [row.flag, *row.old_flags]
    if row.type is not bool:
        return names
    return [spelled for name in names for spelled in (name, "--no-" + name[2:])]


def test_engine_run_takes_the_same_flags_but_the_layout_ones() -> None:
    engine = _settings_actions(_engine())
    sim = _settings_actions(_sim("run"))
    assert set(engine) == set(CORE) - set(LAYOUT_SETTINGS)
    for name, action in engine.items():
        assert action.option_strings == sim[name].option_strings
        assert type(action) is type(sim[name])
        if name != "policy":  # the simulator's also offers disagg, and says so
            assert action.help == sim[name].help


def test_the_policies_are_the_one_list() -> None:
    assert _settings_actions(_sim("run"))["policy"].choices == (*POLICIES, "disagg")
    assert _settings_actions(_sim("validate"))["policy"].choices == tuple(POLICIES)
    assert _settings_actions(_engine())["policy"].choices == tuple(POLICIES)


def test_each_command_lines_defaults_are_its_configs() -> None:
    pytest.importorskip("torch")
    from engine.cli import build_parser as engine_parser
    from engine.cli import config_from_args as engine_config
    from engine.llm_engine import EngineConfig

    assert sim_config(build_parser().parse_args(["run", "t.csv"])) == RunConfig()
    args = build_parser().parse_args(["validate", "t.csv", "--out", "o"])
    assert validate_config(args) == ValidateConfig()
    assert engine_config(engine_parser().parse_args(["run", "t.csv"])) == EngineConfig()
    # The three hold the same core defaults.
    core = {n: flat_settings(RunConfig())[n] for n in CORE}
    assert {n: flat_settings(EngineConfig())[n] for n in CORE} == core
    assert {n: flat_settings(ValidateConfig())[n] for n in CORE} == core


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW)
def test_old_spellings_parse_to_the_same_config(old: list[str], new: list[str]) -> None:
    pytest.importorskip("torch")
    from engine.cli import build_parser as engine_parser
    from engine.cli import config_from_args as engine_config

    def parse_sim(argv: list[str]) -> object:
        return sim_config(build_parser().parse_args(["run", "t.csv", *argv]))

    def parse_validate(argv: list[str]) -> object:
        return validate_config(
            build_parser().parse_args(["validate", "t.csv", "--out", "o", *argv])
        )

    def parse_engine(argv: list[str]) -> object:
        return engine_config(engine_parser().parse_args(["run", "t.csv", *argv]))

    for parse, default in ((parse_sim, RunConfig()), (parse_validate, ValidateConfig())):
        assert parse(old) == parse(new) != default
    assert parse_engine(old) == parse_engine(new) != parse_engine([])
    memory = ["--memory", "contiguous"], ["--memory-model", "contiguous"]
    assert parse_sim(memory[0]) == parse_sim(memory[1]) != RunConfig()


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(line for line in err.splitlines() if "error:" in line)
    return line.split("error: ", 1)[1]


@pytest.mark.parametrize("flag", ["--max-num-batched-tokens", "--max-batch-tokens"])
def test_a_bad_budget_gets_the_same_message_from_sim_run_engine_run_and_validate(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from engine.cli import main as engine_main

    messages = []
    for main, argv in (
        (sim_main, ["run", str(EXAMPLE)]),
        (engine_main, ["run", str(EXAMPLE)]),
        (sim_main, ["validate", str(EXAMPLE), "--out", str(tmp_path)]),
    ):
        with pytest.raises(SystemExit) as stop:
            main([*argv, flag, "0"])
        assert stop.value.code == 2
        messages.append(_error_line(capsys))
    expected = "argument --max-num-batched-tokens/--max-batch-tokens: must be >= 1, got 0"
    assert messages == [expected] * 3
    with pytest.raises(ValueError, match=r"^max_num_batched_tokens must be >= 1, got 0$"):
        SchedulerConfig(max_num_batched_tokens=0)


def test_a_budget_below_max_num_seqs_is_refused_by_sim_run_engine_run_and_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from engine.cli import main as engine_main

    messages = []
    for main, argv in (
        (sim_main, ["run", str(EXAMPLE)]),
        (sim_main, ["run", str(EXAMPLE), "--policy", "disagg", "--pool-policy", "chunked"]),
        (engine_main, ["run", str(EXAMPLE)]),
        (sim_main, ["validate", str(EXAMPLE), "--out", str(tmp_path)]),
    ):
        assert main([*argv, "--max-num-seqs", "32", "--max-num-batched-tokens", "16"]) == 2
        messages.append(_error_line(capsys))
    expected = "max_num_batched_tokens must be >= max_num_seqs (32) under policy 'chunked'"
    assert all(message.startswith(expected) for message in messages), messages
    assert "under policy 'chunked' (the pools of 'disagg'), got 16" in messages[1]
    assert not (tmp_path / "requests.csv").exists()
    # Static batching spends no token budget: the same numbers run.
    argv = ["run", str(EXAMPLE), "--policy", "static", "--quiet"]
    assert sim_main([*argv, "--max-num-seqs", "32", "--max-num-batched-tokens", "16"]) == 0


RECORDED_AT_8D1F2CA = (
    "async_scheduling",
    "batch_size",
    "block_size",
    "enable_prefix_caching",
    "fast_forward",
    "gpu_memory_utilization",
    "hardware",
    "link_bandwidth_gbps",
    "link_latency_us",
    "link_parallel_transfers",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_wait_s",
    "memory_model",
    "model",
    "num_blocks",
    "num_decode",
    "num_prefill",
    "num_replicas",
    "policy",
    "pool_policy",
    "preemption_mode",
    "profile",
    "reservation",
    "router",
    "seed",
    "slo_tpot_s",
    "slo_ttft_s",
    "swap_space_gib",
    "tp",
)


def test_run_records_the_same_flat_settings_as_before() -> None:
    """summary.json's ``config`` keeps the names it had when RunConfig was flat (8d1f2ca), and
    adds only the settings issue 31 added since (vLLM's data parallelism, its n > 1, and
    when an arrival joins a batch under async scheduling), issue 30's host speed and vLLM's
    --scheduling-policy."""
    added = (
        "data_parallel_size",
        "enable_expert_parallel",
        "parallel_sampling",
        "scheduling_lag",
        "host_slowdown",
        "scheduling_policy",
    )
    assert sorted(flat_settings(RunConfig())) == sorted((*RECORDED_AT_8D1F2CA, *added))
