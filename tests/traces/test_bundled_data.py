"""The example traces in traces/data/: small, loadable, what their README says they are, and
reproduced byte for byte by the commands listed in that README."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from traces import load_trace
from traces.cli import main

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
COMMAND_PREFIX = "python -m traces.cli "


def _readme_commands() -> list[list[str]]:
    lines = (DATA / "README.md").read_text().splitlines()
    return [shlex.split(line)[3:] for line in lines if line.startswith(COMMAND_PREFIX)]


def test_readme_lists_a_command_per_file() -> None:
    outputs = {Path(argv[argv.index("-o") + 1]).name for argv in _readme_commands()}
    assert outputs == {path.name for path in DATA.glob("*.csv")}
    assert {"example.csv", "shared_prefix.csv", "parallel_sampling.csv"} <= outputs


@pytest.mark.parametrize("argv", _readme_commands(), ids=lambda argv: argv[argv.index("-o") + 1])
def test_readme_command_reproduces_the_file(argv: list[str], tmp_path: Path) -> None:
    committed = DATA / Path(argv[argv.index("-o") + 1]).name
    fresh = tmp_path / committed.name
    argv = [str(fresh) if arg == argv[argv.index("-o") + 1] else arg for arg in argv]
    assert main(argv) == 0
    assert fresh.read_bytes() == committed.read_bytes(), (
        f"{committed} differs from its README command's output; if numpy changed its random"
        " streams, rerun the commands in traces/data/README.md and commit the files"
    )


def test_examples_are_small_and_what_they_claim() -> None:
    for path in DATA.glob("*.csv"):
        assert path.stat().st_size < 100_000, path
    example = load_trace(DATA / "example.csv")
    assert len(example) == 200 and 3.0 < example.mean_rate_per_s < 5.0
    shared = load_trace(DATA / "shared_prefix.csv")
    assert all(r.prefix_hash_ids for r in shared.requests)
    assert shared.length_stats()["hash_block_reuse"] > 0.5
    parallel = load_trace(DATA / "parallel_sampling.csv")
    assert {r.num_samples for r in parallel.requests} == {1, 2, 4}
