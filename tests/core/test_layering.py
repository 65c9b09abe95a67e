"""The layering: each top-level package may import only the packages below it, the core only the
standard library, and no module reaches itself through imports. Every import counts: at the top,
inside functions, under ``TYPE_CHECKING``, and as an ``import_module("...")`` string."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each package and the packages of ours it may import. Bottom to top: the core; the traces and
# the run records; the reports; the kernels; the two executors (the simulator, the engine);
# the code that compares them.
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "traces": frozenset({"core"}),
    "records": frozenset({"core"}),
    "reports": frozenset({"core", "records"}),
    # The kernels read their decode split plan from the core (``core.decode_split``), which the
    # cost model prices too.
    "kernels": frozenset({"core"}),
    "sim": frozenset({"core", "traces", "records", "reports"}),
    "engine": frozenset({"core", "traces", "records", "reports", "kernels"}),
    "fidelity": frozenset({"core", "traces", "records", "reports", "kernels", "sim", "engine"}),
}
# Third-party packages a layer must not load: the core is standard library only (checked apart),
# and below the engine nothing may touch torch or triton.
HEAVY = ("torch", "triton")
NO_HEAVY = ("traces", "records", "reports", "sim")
_IMPORT_MODULE = re.compile(r"""import_module\(\s*["']([\w.]+)["']""")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(path): path for package in ALLOWED for path in (ROOT / package).rglob("*.py")
}


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, anywhere in the file. ``from a import b`` counts as
    ``a.b`` when that is one of our modules, else as ``a``."""
    text = path.read_text()
    names: set[str] = set(_IMPORT_MODULE.findall(text))
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                names.add(name if name in MODULES else node.module)
    return names


def test_every_top_level_package_has_a_rule() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"tests", "benchmarks"} == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downward(package: str) -> None:
    ours = set(ALLOWED)
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in sorted(_imports(path)):
            root = name.split(".")[0]
            if root in ours and root != package and root not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
            if package in NO_HEAVY and root in HEAVY:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "core").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_core_imports_only_the_standard_library(path: Path) -> None:
    outside = {
        name.split(".")[0]
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in {"core", "__future__"}
    }
    assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_no_import_cycle() -> None:
    """No module reaches itself through imports (a package counts as its ``__init__``)."""
    graph = {
        module: {name for name in _imports(path) if name in MODULES and name != module}
        for module, path in MODULES.items()
    }
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


def test_importing_the_simulator_loads_neither_torch_nor_triton() -> None:
    """Every module of the layers below the engine imports without torch; so does building
    ``python -m sim``'s parser with its plugged-in commands."""
    code = (
        "import sys, importlib, pkgutil\n"
        f"for name in {(*NO_HEAVY, 'core')!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, name + '.'):\n"
        "        if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "from sim.cli.parser import build_parser\n"
        "build_parser()\n"
        "print(','.join(sorted(m for m in ('torch', 'triton') if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"loaded: {out.stdout.strip()}"


def test_the_engine_and_the_core_never_reach_fast_forward() -> None:
    """Fast-forward is the simulator's: a reader of the core for the engine never meets it."""
    for module, path in MODULES.items():
        if module.split(".")[0] in ("core", "engine"):
            reached = [n for n in _imports(path) if n.startswith("sim")]
            assert not reached, f"{module} imports {reached}"
