"""The optional compiled build (sim.compiled): the build key, the switch's errors, and, where
mypyc, a C compiler and the Python headers are present, a build whose simulation is
byte-identical to the sources'."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sim.compiled import build as compiled

ROOT = Path(__file__).resolve().parents[2]


def _copy_tree(tmp_path: Path) -> Path:
    """The files a build key reads, copied under tmp_path (the project's layout)."""
    root = tmp_path / "tree"
    for rel in compiled.compiled_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    for rel in compiled.NOT_COMPILED:
        shutil.copyfile(ROOT / rel, root / rel)
    return root


def _python(code: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_build_key_follows_every_compiled_byte(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    key = compiled.build_key(root)
    assert key == compiled.build_key(ROOT)  # the same bytes, the same key
    keys = {key}
    for rel in ("core/policies/chunked.py", "sim/executor.py", "records/schema.py"):
        (root / rel).write_text((root / rel).read_text() + "\n# an edit\n")
        keys.add(compiled.build_key(root))
    assert len(keys) == 4  # every edit gave a new key
    # The files that always run from the sources are not part of it.
    (root / "core" / "errors.py").write_text("# edited\n")
    assert compiled.build_key(root) in keys


def test_compiled_files_leave_the_switch_and_the_exceptions_as_python() -> None:
    names = {p.as_posix() for p in compiled.compiled_files()}
    core = {"core/scheduler.py", "core/block_allocator.py", "sim/fastforward/plan.py"}
    assert core | {"core/policies/chunked.py", "sim/simulator.py"} <= names
    assert not names & compiled.NOT_COMPILED
    assert "core/policies/__init__.py" in names  # only the top-level ones stay Python
    assert not any(name.startswith("core/model/") for name in names)
    assert not names & {"sim/__init__.py", "records/__init__.py", "sim/errors.py"}


def test_missing_build_is_an_error_that_says_how_to_build(tmp_path: Path) -> None:
    env = {"SERVESIM_CORE": "compiled", "SERVESIM_CORE_CACHE": str(tmp_path)}
    code = "import sys; from sim.cli.main import main; sys.exit(main(['--version']))"
    result = _python(code, env)
    assert result.returncode == 2
    assert "python -m sim compile-core" in result.stderr
    assert str(tmp_path) in result.stderr


def test_unknown_mode_is_an_error_naming_the_value() -> None:
    result = _python(
        "import sys; from sim.cli.main import main; sys.exit(main(['--version']))",
        {"SERVESIM_CORE": "turbo"},
    )
    assert result.returncode == 2
    assert "SERVESIM_CORE='turbo' is not one of python, compiled" in result.stderr


def test_importing_reads_no_environment() -> None:
    """The switch is the command line's: importing the core or the simulator with the variable
    set takes the sources, and finds no build to complain about."""
    env = {"SERVESIM_CORE": "compiled", "SERVESIM_CORE_CACHE": "/nonexistent"}
    result = _python("import core.scheduler as s, sim.simulator as m; print(s.__file__)", env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("core/scheduler.py")


@pytest.mark.skipif(
    compiled.missing_tools() is not None,
    reason=f"a build needs {compiled.missing_tools()}",
)
def test_compiled_core_simulates_byte_identically(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    where, _ = compiled.compile_core(cache)
    assert (where / compiled.BUILT_MARKER).is_file()
    left = {p.suffix for p in where.rglob("*") if p.is_file()} - {".so", ""}
    assert not left, f"a build holds only extensions, found {left}"
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
            "import sys; from sim.cli.main import main; rc = main("
            f"{argv!r}); import core.scheduler as s, sim.simulator as m, sim.errors as e; "
            "print(s.__file__, m.__file__, e.__file__); sys.exit(rc)"
        )
        result = _python(code, env)
        assert result.returncode == 0, result.stderr
        scheduler, simulator, errors = result.stdout.splitlines()[-1].split()
        assert scheduler.endswith(".so") == (mode == "compiled"), scheduler
        assert simulator.endswith(".so") == (mode == "compiled"), simulator
        assert errors == str(ROOT / "sim" / "errors.py")  # never in a build
        outputs[mode] = [(out / name).read_bytes() for name in ("requests.csv", "steps.csv")]
    assert outputs["compiled"] == outputs["python"]


def test_selecting_again_keeps_the_build_already_selected(tmp_path: Path) -> None:
    """A second ``main()`` in one process (a benchmark's runs) finds the build in front of the
    sources already: it neither hashes the sources again nor refuses the modules it loaded."""
    where = compiled.build_dir(cache=tmp_path)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (where / "core").mkdir(parents=True)
    (where / "core" / f"scheduler{suffix}").write_bytes(b"")  # never loaded here
    (where / compiled.BUILT_MARKER).write_text("test\n")
    code = (
        "import os, sys; from sim.compiled import switch, build\n"
        "first = switch.select(os.environ)\n"
        "sys.modules['core.scheduler'] = sys  # as if the build's module had been imported\n"
        "build.build_key = None  # a second select must not compute the key again\n"
        "print(first == switch.select(os.environ), first)\n"
    )
    result = _python(code, {"SERVESIM_CORE": "compiled", "SERVESIM_CORE_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(where)]
