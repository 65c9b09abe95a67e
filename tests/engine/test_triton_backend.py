"""The model on the kernels' Triton backend (the interpreter, in its own process) gives the
torch backend's logits for mixed batches of decodes and prefill chunks, and a padded decode
bucket (CUDA graphs' padding, run eagerly) gives its real rows the unpadded step's logits; on the
torch backend it never loads triton."""

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
@pytest.mark.parametrize("case", ["triton_case", "graph_case", "mixed_case", "graph_table_case"])
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


TORCH_ONLY_STEP = """
import json, sys, tempfile
from pathlib import Path
from engine.model.weights import load_model
from tests.engine.paged_steps import PagedSteps
from tests.engine.triton_case import CONFIG
with tempfile.TemporaryDirectory() as directory:
    (Path(directory) / "config.json").write_text(json.dumps(CONFIG))
    model = load_model(directory, weights="random", seed=3)
run = PagedSteps(model, {0: list(range(1, 20)), 1: list(range(3, 10))}, block_size=8)
run.step([], [(0, 11), (1, 6)])
run.step([0, 1], [])
print("triton" in sys.modules)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_backend_steps_never_import_triton() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_ONLY_STEP],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "False"
