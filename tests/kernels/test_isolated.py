"""Crash-prone kernel cases, each in its own Python process: under the interpreter a wild
address is a segfault, which must fail one test rather than end the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_python(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    # The children always use the CPU interpreter, whatever this process runs on.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize("case", ["int64_offsets", "garbage_past_sequence_end"])
def test_isolated_case(case):
    proc = run_python("-m", "tests.kernels.isolated_cases", case)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip().endswith("ok")


def test_only_the_wrapper_modules_import_triton():
    code = (
        "import sys, kernels\n"
        "assert not {'torch', 'triton'} & set(sys.modules)\n"
        "import kernels.reference, kernels.torch_attention, kernels.contracts\n"
        "import kernels.bench, kernels.bench_graph\n"
        "assert 'torch' in sys.modules and 'triton' not in sys.modules\n"
        "import kernels.cache_ops, kernels.rms_norm, kernels.activation, kernels.rotary\n"
        "assert 'triton' in sys.modules\n"
        "print('ok')\n"
    )
    proc = run_python("-c", code, timeout_s=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "ok"
