"""A saved run directory and the in-memory result it came from give the same records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.settings import build
from records.run_dir import load_run, records_from_result
from sim.run import RunConfig, servesim_version, simulate
from tests.reports.conftest import EXAMPLE
from traces.loaders import load_trace


def test_load_run_matches_records_from_result(tmp_path: Path) -> None:
    result = simulate(load_trace(str(EXAMPLE)), build(RunConfig, policy="continuous"))
    result.write(tmp_path)
    saved, live = load_run(tmp_path), records_from_result(result)
    assert saved.label == live.label == "continuous / paged"
    assert saved.summary == live.summary
    assert saved.config == live.config
    assert saved.trace_name == live.trace_name == "example"
    assert saved.num_blocks == live.num_blocks
    assert saved.mean_real_token_share == pytest.approx(live.mean_real_token_share)
    assert list(saved.steps.columns) == list(live.steps.columns)
    assert len(saved.requests) == len(live.requests) == 200
    np.testing.assert_allclose(saved.steps["start_s"], live.steps["start_s"])
    np.testing.assert_allclose(saved.requests["ttft_ms"], live.requests["ttft_ms"])
    # simulate() leaves the command to the CLI; the version comes from the installed package.
    assert saved.command is None and saved.source == str(tmp_path)
    assert saved.version == servesim_version()


def test_optional_summary_keys_are_read(example_dir: Path, tmp_path: Path) -> None:
    payload = json.loads((example_dir / "summary.json").read_text())
    payload |= {"command": "python -m sim run x.csv", "servesim_version": "9.9"}
    payload["trace_stats"] = {"num_requests": 3.0}
    for name in ("requests.csv", "steps.csv"):
        (tmp_path / name).write_bytes((example_dir / name).read_bytes())
    (tmp_path / "summary.json").write_text(json.dumps(payload))
    run = load_run(tmp_path, label="mine")
    assert (run.label, run.command, run.version) == ("mine", "python -m sim run x.csv", "9.9")
    assert run.trace_stats == {"num_requests": 3.0}


def test_a_directory_without_a_run_summary_is_refused(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a servesim run summary"):
        load_run(tmp_path)


def test_compressed_csv_files_are_read_as_they_are(example_dir: Path, tmp_path: Path) -> None:
    """A recorded run kept as ``requests.csv.gz`` / ``steps.csv.gz`` loads like the plain one."""
    import gzip

    (tmp_path / "summary.json").write_bytes((example_dir / "summary.json").read_bytes())
    for name in ("requests.csv", "steps.csv"):
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress((example_dir / name).read_bytes()))
    packed, plain = load_run(tmp_path), load_run(example_dir)
    assert packed.requests.equals(plain.requests)
    assert packed.steps.equals(plain.steps)
