"""The layering rule: engine/core is standard library only, and importing the simulator or the
core never loads torch or triton."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "engine" / "core"


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: p.name)
def test_core_imports_only_the_standard_library(path: Path) -> None:
    outside = {
        root
        for root in _imported_roots(path)
        if root not in sys.stdlib_module_names and root not in {"engine", "__future__"}
    }
    assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_importing_sim_and_core_loads_neither_torch_nor_triton() -> None:
    code = (
        "import sys, importlib, pkgutil\n"
        "import sim, engine.core, traces\n"
        "for pkg in (sim, engine.core):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "heavy = sorted(m for m in ('torch', 'triton') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"loaded: {out.stdout.strip()}"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # The run-record schema sits below its writers and readers.
        ("records", ("sim", "reports", "kernels", "traces", "torch")),
        # Reports read through records; of the engine they may see only the stdlib core.
        ("reports", ("sim", "kernels", "torch")),
        # The engine may not import the simulator (its CLI may render a report, as sim's does).
        ("engine", ("sim",)),
    ],
)
def test_packages_import_only_downward(package: str, forbidden: tuple[str, ...]) -> None:
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imported_modules(path):
            root = name.split(".")[0]
            engine_outside_core = root == "engine" and not name.startswith("engine.core")
            bad = root in forbidden or (package != "engine" and engine_outside_core)
            assert not bad, f"{path.relative_to(ROOT)} imports {name}"


def _core_module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_import_graph() -> dict[str, set[str]]:
    """engine.core module -> the engine.core modules it imports, anywhere in the file
    (``TYPE_CHECKING`` blocks and function bodies included)."""
    modules = {_core_module(path): path for path in CORE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # ``from engine.core import x`` names a module x when there is one.
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                names = [n if n in modules else node.module for n in names]
            edges.update(n for n in names if n in modules and n != module)
        graph[module] = edges
    return graph


def test_no_import_cycle_inside_the_core() -> None:
    """No module of engine/core reaches itself through imports, counting ``TYPE_CHECKING``."""
    graph = _core_import_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_fast_forward_is_reached_only_by_the_simulator() -> None:
    """A reader of the core for the engine can skip engine/core/fastforward whole: nothing
    outside it in the core, and nothing in the engine, imports it."""
    graph = _core_import_graph()
    package = "engine.core.fastforward"
    for module, targets in graph.items():
        if not module.startswith(package):
            assert not any(t.startswith(package) for t in targets), module
    inside = ROOT / "engine" / "core" / "fastforward"
    for path in sorted((ROOT / "engine").rglob("*.py")):
        if inside not in path.parents:
            assert not any(n.startswith(package) for n in _imported_modules(path)), path
