"""An optional compiled build of this core: the same sources, compiled to C extensions by mypyc.

The core is plain Python and that is what runs by default, what the tests check and what the
engine drives. A long simulation spends most of its time here, so a user may build the core once
with ``python -m sim compile-core`` (it needs ``mypy``, which ships mypyc, and a C compiler) and
then set ``SERVESIM_CORE=compiled``: importing ``engine.core`` then takes every module it can
from the build instead of the sources. Nothing else changes; a run's outputs are byte-identical.

A build lives in a cache directory keyed by a hash of every source file of the core, the Python
version and the platform, so a build can never run stale code: edit one line and the key no
longer matches, and the import fails with a message saying to rebuild. Three modules stay
Python in every build: ``__init__`` (it is the switch), this one (it finds the build) and
``errors`` (mypyc cannot compile a class derived from a built-in exception).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ENV_VAR = "SERVESIM_CORE"
CACHE_ENV_VAR = "SERVESIM_CORE_CACHE"
MODES = ("python", "compiled")
CORE_DIR = Path(__file__).resolve().parent
NOT_COMPILED = frozenset({"__init__.py", "compiled.py", "errors.py"})
BUILT_MARKER = "BUILT"


def source_files(core_dir: Path = CORE_DIR) -> list[Path]:
    """Every ``.py`` file of the core, in a fixed order (paths relative to ``core_dir``)."""
    return sorted(p.relative_to(core_dir) for p in core_dir.rglob("*.py"))


def compiled_files(core_dir: Path = CORE_DIR) -> list[Path]:
    """The files a build compiles: all but the top-level ones in ``NOT_COMPILED``."""
    files = source_files(core_dir)
    return [p for p in files if not (p.parent == Path() and p.name in NOT_COMPILED)]


def build_key(core_dir: Path = CORE_DIR) -> str:
    """What a build must match: the sources' bytes, the interpreter and the platform."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {sysconfig.get_platform()}\n".encode())
    for rel in source_files(core_dir):
        digest.update(f"{rel.as_posix()}\n".encode())
        digest.update((core_dir / rel).read_bytes())
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    """``$SERVESIM_CORE_CACHE``, else ``~/.cache/servesim/core``."""
    given = os.environ.get(CACHE_ENV_VAR)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "servesim" / "core"


def build_dir(core_dir: Path = CORE_DIR, root: Path | None = None) -> Path:
    """Where the build of these sources lives (whether or not it exists)."""
    return (cache_root() if root is None else root) / build_key(core_dir)


def mode() -> str:
    """The mode ``SERVESIM_CORE`` asks for; an unknown value is an ImportError naming it."""
    value = os.environ.get(ENV_VAR, "python").strip().lower() or "python"
    if value not in MODES:
        raise ImportError(f"{ENV_VAR}={value!r} is not one of {', '.join(MODES)}")
    return value


def activate(package_path: list[str]) -> Path:
    """Put the build of the current sources ahead of them on the core's package path.

    Called by ``engine/core/__init__.py`` before any other module of the core is imported. The
    build's root goes on ``sys.path`` too: mypyc's shared runtime module is top-level there.
    """
    where = build_dir()
    if not (where / BUILT_MARKER).is_file():
        raise ImportError(
            f"{ENV_VAR}=compiled, but no compiled core matches these sources (looked for "
            f"{where}); build it with `python -m sim compile-core`, or unset {ENV_VAR}"
        )
    root = str(where)
    if root not in sys.path:
        sys.path.insert(0, root)
    package_path.insert(0, str(where / "engine" / "core"))
    return where


def missing_tools() -> str | None:
    """What a build needs and this machine lacks (None when nothing): mypyc, a C compiler and
    the Python headers."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc, part of mypy (pip install mypy)"
    compiler = str(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"a C compiler ({compiler!r}, the one this Python was built with, on PATH)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"the Python headers ({headers}; e.g. the python3-dev package)"
    return None


def compile_core(root: Path | None = None, core_dir: Path = CORE_DIR) -> tuple[Path, float]:
    """Build the core with mypyc into its cache directory; returns (directory, seconds).

    An existing build of the same sources is kept as it is. Raises RuntimeError with the
    compiler's last lines when mypyc is missing or the build fails; nothing half-built is left
    where ``activate`` would find it.
    """
    start = time.perf_counter()
    target = build_dir(core_dir, root)
    if (target / BUILT_MARKER).is_file():
        return target, time.perf_counter() - start
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"compiling the core needs {missing}")
    scratch = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    package = scratch / "engine" / "core"
    for rel in source_files(core_dir):
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(core_dir / rel, package / rel)
    # A stub parent package, so that mypyc names the modules engine.core.*; removed after the
    # build, so that the build's root on sys.path can never shadow the real `engine` package.
    (scratch / "engine" / "__init__.py").write_text("")
    files = [str(Path("engine") / "core" / rel) for rel in compiled_files(core_dir)]
    result = subprocess.run(
        [sys.executable, "-m", "mypyc", *files],
        cwd=scratch,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"mypyc failed (exit {result.returncode}):\n{tail}")
    (scratch / "engine" / "__init__.py").unlink()
    shutil.rmtree(scratch / "build", ignore_errors=True)
    (scratch / BUILT_MARKER).write_text(f"{sys.version}\n{len(files)} modules\n")
    if target.exists():  # another process finished the same build meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch.rename(target)
    return target, time.perf_counter() - start
