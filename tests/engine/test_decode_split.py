"""The engine's decode split setting (``EngineConfig.decode_split``): checked, recorded in a
run's settings (which ``sim validate`` reads back), offered on the command line."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from core.decode_split import DEFAULT_SPLIT
from core.settings import flat_settings
from engine.cli import build_parser
from engine.llm_engine import EngineConfig


def test_the_engine_splits_per_sequence_unless_told() -> None:
    assert EngineConfig().decode_split == DEFAULT_SPLIT == "per_sequence"
    assert flat_settings(EngineConfig(decode_split="fixed"))["decode_split"] == "fixed"
    with pytest.raises(ValueError, match="decode_split must be one of"):
        EngineConfig(decode_split="halves")


def test_the_run_command_takes_the_split() -> None:
    args = build_parser().parse_args(["run", "traces/example.csv", "--decode-split", "fixed"])
    assert args.decode_split == "fixed"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "traces/example.csv", "--decode-split", "halves"])
