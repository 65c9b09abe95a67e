"""The simulator runs n > 1 as vLLM v1 does by default (children computing the prompt each, or
sharing it through the prefix cache) and forks copy-on-write when asked (--parallel-sampling)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sim.cli.main import main

TRACE = "traces/data/parallel_sampling.csv"


def _run(tmp_path: Path, name: str, *flags: str) -> tuple[pd.DataFrame, dict[str, object]]:
    out = tmp_path / name
    argv = ["run", TRACE, "--policy", "chunked", "--num-blocks", "4000", *flags]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    return pd.read_csv(out / "requests.csv"), summary


def test_fan_out_by_default_fork_when_asked(tmp_path: Path) -> None:
    fanned, summary = _run(tmp_path, "fan_out")
    forked, fork_summary = _run(tmp_path, "fork", "--parallel-sampling", "fork")
    assert summary["config"]["parallel_sampling"] == "fan_out"  # type: ignore[index]
    assert fork_summary["config"]["parallel_sampling"] == "fork"  # type: ignore[index]
    wide = fanned["num_samples"] > 1
    assert wide.any() and len(fanned) == len(forked)
    # Forked samples share the prompt's blocks and copy a partial tail on write; fanned-out
    # children never share a block they write.
    assert forked.loc[wide, "num_cow_copies"].sum() > 0
    assert fanned["num_cow_copies"].sum() == 0
    # Without prefix caching each child computes the prompt: more prefill work, later outputs.
    assert fanned.loc[wide, "e2el_ms"].median() > forked.loc[wide, "e2el_ms"].median()
    # One row per request either way, with its per-sample output length.
    assert (fanned["output_tokens"] == forked["output_tokens"]).all()


def test_fanned_out_children_share_through_the_prefix_cache(tmp_path: Path) -> None:
    fanned, _ = _run(tmp_path, "cached", "--prefix-caching")
    wide = fanned["num_samples"] > 1
    assert (fanned.loc[wide, "num_prefix_hit_tokens"] > 0).all()
