"""The model on the kernels' Triton backend (the interpreter, in its own process) gives the
torch backend's logits for mixed batches of decodes and prefill chunks, and a padded decode
bucket (CUDA graphs' padding, run eagerly) gives its real rows the unpadded step's logits."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="needs torch and triton",
)
@pytest.mark.parametrize("case", ["triton_case", "graph_case"])
def test_triton_backend_matches_torch_backend_on_mixed_batches(case: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", f"tests.engine.{case}"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip().endswith("ok")
