"""The engine's own bad input, as a new user meets it (issue 29): ``python -m engine`` without
torch, and ``generate`` given text. Each ends in a sentence that says what to do, not in a
bare traceback. (Too big a model for the machine: ``test_memory``.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine import LLM

ROOT = Path(__file__).resolve().parents[2]

# Imported first by the interpreter (from PYTHONPATH): a finder that makes torch look absent.
NO_TORCH = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
"""


def _without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_engine_without_torch_says_how_to_install_it(tmp_path: Path) -> None:
    trace = str(ROOT / "traces" / "data" / "example.csv")
    done = _without_torch(tmp_path, "-m", "engine", "run", trace)
    assert done.returncode == 2
    assert done.stderr.startswith("error: the engine needs torch, which is not installed")
    assert 'pip install torch==2.13.0 -e ".[engine]"' in done.stderr
    assert "Traceback" not in done.stderr
    # The library's names say the same when used.
    done = _without_torch(tmp_path, "-c", "from engine import LLM")
    assert "EngineExtraMissingError: the engine needs torch" in done.stderr
    # The blocker is what made torch absent: without it the same command parses and runs on.
    done = _without_torch(tmp_path, "-c", "import sys; sys.meta_path.pop(0); import engine.cli")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(weights="random", cpu_kv_cache_gib=0.01)


@pytest.mark.parametrize(
    ("prompts", "said"),
    [
        (["hello world"], "prompt 0 is str 'hello world'"),
        ("hello world", "got str 'hello world'"),
        ([1, 2, 3], "prompt 0 is int 1"),
        (5, "got int 5"),
        ([[5, 6], [7, "8"]], "prompt 1 holds str '8' at position 1"),
        ([[5, 6.0]], "prompt 0 holds float 6.0 at position 1"),
    ],
)
def test_generate_takes_token_ids_and_says_so(llm: LLM, prompts: object, said: str) -> None:
    with pytest.raises(TypeError, match="this engine has no tokenizer") as raised:
        llm.generate(prompts)  # type: ignore[arg-type]
    assert said in str(raised.value)


def test_generate_takes_any_sequence_of_integers(llm: LLM) -> None:
    import numpy as np
    import torch

    from engine import SamplingParams

    params = SamplingParams(max_tokens=2)
    outputs = llm.generate([[1, 2, 3], np.array([1, 2, 3]), torch.tensor([1, 2, 3])], params)
    assert {tuple(o.outputs[0].token_ids) for o in outputs} == {
        tuple(outputs[0].outputs[0].token_ids)
    }
    assert all(o.prompt_token_ids == [1, 2, 3] for o in outputs)
