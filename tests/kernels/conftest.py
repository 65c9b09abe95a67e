"""Kernel tests run the Triton kernels under the interpreter on CPU unless told otherwise
(TRITON_INTERPRET=0 with a CUDA device runs them compiled, and enables the gpu tests)."""

from __future__ import annotations

import importlib.util
import os

import pytest

# Must precede the first triton import: triton.jit reads it when a kernel is decorated.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Without torch or triton (a `sim`-only install) the whole directory is skipped.
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py"]


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def device():  # -> torch.device; torch is not imported at module level on purpose
    """Where the Triton kernels run: CUDA when compiled kernels are possible, else CPU."""
    import torch

    if not interpreted() and torch.cuda.is_available():
        return torch.device("cuda")
    if not interpreted():
        pytest.skip("needs TRITON_INTERPRET=1 or a CUDA device")
    return torch.device("cpu")
