"""The build tool of the compiled hot path: which files it compiles, the key a build must
match, where builds live, and ``compile_core`` (``python -m sim compile-core``), which runs
mypyc over them.

The core is plain Python and that is what runs by default, what the tests check and what the
engine drives. A long simulation spends most of its time in the core and in the few simulator
modules that step it (``HOT_MODULES``: fast-forward, the replica's step loop, the cost-model
executor, the roofline, the step records). A user may build those once (it needs ``mypy``, which
ships mypyc, a C compiler and the Python headers) and then run ``python -m sim`` with
``SERVESIM_CORE=compiled``: its ``main()`` then takes each module the build holds from the build
instead of the sources (``sim.compiled.switch``). A run's outputs are byte-identical.

A build lives in a cache directory keyed by a hash of the files it compiles, the Python version
and the platform, so it can never run stale code. Files that stay Python: the packages'
``__init__`` files, ``core/errors.py`` and ``sim/errors.py`` (mypyc cannot compile a class
derived from a built-in exception), and the core's cold modules (file reading, the model
description).
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
ROOT = Path(__file__).resolve().parents[2]
# The core's packages whose modules are compiled (all but NOT_COMPILED in each).
CORE_PACKAGES = ("core", "core/policies")
NOT_COMPILED = frozenset({"core/__init__.py", "core/errors.py", "core/text_files.py"})
# Beyond the core: the modules a simulated step runs through (profiled on the Vidur workload;
# docs/compiled_core.md).
HOT_MODULES = (
    "records/schema.py",
    "records/step_shapes.py",
    # The roofline's settings: a step reads them (`price_padding`), so they stay native.
    "sim/costmodel/config.py",
    "sim/costmodel/roofline.py",
    "sim/deployment.py",
    "sim/executor.py",
    "sim/fastforward/__init__.py",
    "sim/fastforward/growth.py",
    "sim/fastforward/memory.py",
    "sim/fastforward/plan.py",
    "sim/simulator.py",
)
# What mypyc must see to type-check the files it compiles (copied into the scratch tree).
CHECKED_PACKAGES = ("core", "records", "reports", "sim", "traces")
BUILT_MARKER = "BUILT"


def compiled_files(root: Path = ROOT) -> list[Path]:
    """The files a build compiles, relative to the project's root, in a fixed order."""
    files = [
        p.relative_to(root)
        for package in CORE_PACKAGES
        for p in (root / package).glob("*.py")
        if p.relative_to(root).as_posix() not in NOT_COMPILED
    ]
    return sorted(files + [Path(m) for m in HOT_MODULES])


def build_key(root: Path = ROOT) -> str:
    """What a build must match: the compiled files' bytes, the interpreter and the platform."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {sysconfig.get_platform()}\n".encode())
    for rel in compiled_files(root):
        digest.update(f"{rel.as_posix()}\n".encode())
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    """``$SERVESIM_CORE_CACHE``, else ``~/.cache/servesim/core``."""
    given = os.environ.get(CACHE_ENV_VAR)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "servesim" / "core"


def build_dir(root: Path = ROOT, cache: Path | None = None) -> Path:
    """Where the build of these sources lives (whether or not it exists)."""
    return (cache_root() if cache is None else cache) / build_key(root)


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


def compile_core(cache: Path | None = None, root: Path = ROOT) -> tuple[Path, float]:
    """Build the hot path with mypyc into its cache directory; returns (directory, seconds).

    An existing build of the same sources is kept as it is. Raises RuntimeError naming what is
    missing, or with the compiler's last lines when the build fails; nothing half-built is left
    where ``switch.use_build`` would find it.
    """
    start = time.perf_counter()
    target = build_dir(root, cache)
    if (target / BUILT_MARKER).is_file():
        return target, time.perf_counter() - start
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"compiling needs {missing}")
    scratch = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "data", "templates")
    for package in CHECKED_PACKAGES:
        shutil.copytree(root / package, scratch / package, ignore=ignore)
    # mypyc type-checks what it compiles; pandas, simpy and the like ship no stubs (the
    # project's own `mypy` run is where types are checked strictly).
    (scratch / "mypyc.ini").write_text("[mypy]\nignore_missing_imports = True\n")
    files = [str(rel) for rel in compiled_files(root)]
    result = subprocess.run(
        [sys.executable, "-m", "mypyc", "--config-file", "mypyc.ini", *files],
        cwd=scratch,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"mypyc failed (exit {result.returncode}):\n{tail}")
    # Keep only the extensions: every other module always comes from the sources.
    shutil.rmtree(scratch / "build", ignore_errors=True)
    for path in sorted(scratch.rglob("*"), reverse=True):
        if path.is_file() and not path.name.endswith(".so"):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    (scratch / BUILT_MARKER).write_text(f"{sys.version}\n{len(files)} modules\n")
    if target.exists():  # another process finished the same build meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch.rename(target)
    return target, time.perf_counter() - start
