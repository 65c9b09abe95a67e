"""Importing `traces` stays light: no torch/triton/simpy/plotly ever, and numpy/pandas only
once the generators are imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in result.stdout.split()}


def test_package_import_is_stdlib_only() -> None:
    loaded = _loaded_after("import traces, traces.writer, traces.loaders")
    assert not loaded & {"numpy", "pandas", "torch", "triton", "simpy", "plotly"}


def test_generators_and_cli_never_load_heavy_packages() -> None:
    loaded = _loaded_after("import traces.generators, traces.cli")
    assert "numpy" in loaded
    assert not loaded & {"torch", "triton", "simpy", "plotly"}
