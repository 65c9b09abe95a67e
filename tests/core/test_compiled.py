"""The optional compiled core (engine.core.compiled): the build key, the switch's errors, and,
where mypyc and a C compiler are present, a build whose simulation is byte-identical to the
sources'."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core import compiled

ROOT = Path(__file__).resolve().parents[2]


def _copy_core(tmp_path: Path) -> Path:
    core = tmp_path / "core"
    shutil.copytree(compiled.CORE_DIR, core, ignore=shutil.ignore_patterns("__pycache__"))
    return core


def _python(code: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_build_key_follows_every_source_byte(tmp_path: Path) -> None:
    core = _copy_core(tmp_path)
    key = compiled.build_key(core)
    assert compiled.build_key(core) == key  # deterministic
    (core / "policies" / "chunked.py").write_text(
        (core / "policies" / "chunked.py").read_text() + "\n# an edit\n"
    )
    edited = compiled.build_key(core)
    assert edited != key
    (core / "errors.py").write_text((core / "errors.py").read_text() + "\n")
    assert compiled.build_key(core) not in (key, edited)


def test_compiled_files_leave_the_switch_and_the_exceptions_as_python() -> None:
    names = {p.as_posix() for p in compiled.compiled_files()}
    assert {"scheduler.py", "block_allocator.py", "policies/chunked.py"} <= names
    assert not names & {"__init__.py", "compiled.py", "errors.py"}
    assert "policies/__init__.py" in names  # only the top-level ones stay Python


def test_missing_build_is_an_import_error_that_says_how_to_build(tmp_path: Path) -> None:
    env = {"SERVESIM_CORE": "compiled", "SERVESIM_CORE_CACHE": str(tmp_path)}
    result = _python("import engine.core.scheduler", env)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "python -m sim compile-core" in result.stderr
    assert str(tmp_path) in result.stderr


def test_unknown_mode_is_an_import_error_naming_the_value(tmp_path: Path) -> None:
    result = _python("import engine.core", {"SERVESIM_CORE": "turbo"})
    assert result.returncode != 0
    assert "SERVESIM_CORE='turbo' is not one of python, compiled" in result.stderr


def test_python_mode_imports_the_sources() -> None:
    result = _python(
        "import engine.core.scheduler as s; print(s.__file__)", {"SERVESIM_CORE": "python"}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("engine/core/scheduler.py")


@pytest.mark.skipif(
    compiled.missing_tools() is not None,
    reason=f"a build needs {compiled.missing_tools()}",
)
def test_compiled_core_simulates_byte_identically(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    where, _ = compiled.compile_core(cache)
    assert (where / compiled.BUILT_MARKER).is_file()
    assert not (where / "engine" / "__init__.py").exists()  # the stub parent is gone
    assert compiled.compile_core(cache)[0] == where  # a second call reuses the build
    outputs = {}
    for mode in compiled.MODES:
        out = tmp_path / mode
        env = {"SERVESIM_CORE": mode, "SERVESIM_CORE_CACHE": str(cache)}
        # Issue 18's case: n > 1 with prefix caching on a tight cache, fast-forward on.
        argv = [
            "run",
            "traces/data/parallel_sampling.csv",
            "--policy",
            "chunked",
            "--prefix-caching",
            "--num-blocks",
            "200",
            "--out",
            str(out),
            "--quiet",
        ]
        code = (
            "import sys, engine.core.scheduler as s; print(s.__file__); "
            f"from sim.cli import main; sys.exit(main({argv!r}))"
        )
        result = _python(code, env)
        assert result.returncode == 0, result.stderr
        loaded = result.stdout.splitlines()[0]
        assert loaded.endswith(".so") == (mode == "compiled"), loaded
        outputs[mode] = [(out / name).read_bytes() for name in ("requests.csv", "steps.csv")]
    assert outputs["compiled"] == outputs["python"]
