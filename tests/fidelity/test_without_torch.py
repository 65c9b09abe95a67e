"""Without torch, ``python -m sim`` still simulates, and the commands that drive the real engine
say how to install it instead of ending in a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A finder that makes torch and triton look uninstalled in the child process.
BLOCK_TORCH = (
    "import sys, importlib.abc\n"
    "class Block(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'triton'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "from sim.cli.main import main\n"
)


def _sim(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = BLOCK_TORCH + f"rc = main({argv!r})\nprint(sorted({{'torch'}} & set(sys.modules)))\n"
    code += "sys.exit(rc)\n"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_sim_runs_without_torch(tmp_path: Path) -> None:
    trace = str(ROOT / "traces" / "data" / "example.csv")
    result = _sim(["run", trace, "--out", str(tmp_path / "run"), "--quiet"], ROOT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "requests.csv").is_file()


@pytest.mark.parametrize(
    "argv",
    [
        ["calibrate", "--small-grid", "--out", "p.json", "--quiet"],
        ["validate", str(ROOT / "traces" / "data" / "example.csv"), "--out", "v", "--quiet"],
    ],
    ids=["calibrate", "validate"],
)
def test_engine_commands_say_how_to_install_torch(argv: list[str], tmp_path: Path) -> None:
    result = _sim(argv, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"error: {argv[0]} runs the real engine, which needs torch" in result.stderr
    assert 'pip install torch==2.13.0 -e ".[engine]"' in result.stderr
