"""Putting a compiled build in front of the sources, for the rest of the process.

``python -m sim``'s ``main()`` calls `select` before it imports any module of the hot path; a
finder placed first on ``sys.meta_path`` then loads each module the build holds from its
extension and leaves every other module to the sources.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from sim.compiled.build import BUILT_MARKER, CACHE_ENV_VAR, ENV_VAR, MODES, build_dir


class _BuildFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of one build by their dotted names."""

    def __init__(self, where: Path, modules: dict[str, Path]) -> None:
        self.where = where
        self.modules = modules

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        where = self.modules.get(fullname)
        return None if where is None else importlib.util.spec_from_file_location(fullname, where)


def _extensions(where: Path) -> dict[str, Path]:
    """Dotted module name -> extension file, for every module the build at ``where`` holds."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    modules: dict[str, Path] = {}
    for path in where.rglob("*"):
        suffix = next((s for s in suffixes if path.name.endswith(s)), None)
        if suffix is None:
            continue
        parts = [*path.relative_to(where).parent.parts, path.name[: -len(suffix)]]
        modules[".".join(parts)] = path
    return modules


def mode(environ: Mapping[str, str]) -> str:
    """The mode ``SERVESIM_CORE`` asks for (python when unset); an unknown value is a
    ValueError naming it."""
    value = environ.get(ENV_VAR, "python").strip().lower() or "python"
    if value not in MODES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(MODES)}")
    return value


def use_build(cache: Path | None = None) -> Path:
    """Load the hot path from the build of these sources from now on; returns its directory.

    Must run before any module it holds is imported: one already imported stays the source's.
    A missing build is an ImportError that says how to make one.
    """
    for finder in sys.meta_path:
        if isinstance(finder, _BuildFinder):
            return finder.where  # selected already (a second ``main()`` in one process)
    where = build_dir(cache=cache)
    if not (where / BUILT_MARKER).is_file():
        raise ImportError(
            f"{ENV_VAR}=compiled, but no compiled build matches these sources (looked for "
            f"{where}); build it with `python -m sim compile-core`, or unset {ENV_VAR}"
        )
    modules = _extensions(where)
    loaded = sorted(name for name in modules if name in sys.modules and "." in name)
    if loaded:
        raise ImportError(f"{ENV_VAR}=compiled: already imported from the sources: {loaded}")
    sys.meta_path.insert(0, _BuildFinder(where, modules))
    return where


def select(environ: Mapping[str, str]) -> Path | None:
    """What ``main()`` calls first: the build's directory when ``SERVESIM_CORE=compiled`` (with
    ``SERVESIM_CORE_CACHE`` naming the cache, if set), else None and the sources run."""
    if mode(environ) != "compiled":
        return None
    cache = environ.get(CACHE_ENV_VAR)
    return use_build(Path(cache).expanduser() if cache else None)
