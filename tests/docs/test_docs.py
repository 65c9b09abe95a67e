"""The README and docs/ agree with the tool: the files they name exist, their commands write
only to a scratch folder, and the figures that a command can reproduce here are that command's
output (issue 33)."""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHARED_RUNS = ROOT.parent / "shared" / "vllm-runs" / "llmservingsim"
# Folders a repository path starts with (anything else in backticks is not a path of ours).
TOP = ("core", "sim", "engine", "kernels", "traces", "records", "reports", "fidelity", "tests")
TOP += ("benchmarks", "docs", "profiles")
OUTPUT_FLAGS = ("--out", "-o", "--output", "--report", "--json")


def _code_paths(text: str) -> set[str]:
    """Repository paths in backticks: `sim/run.py`, `core/`, `benchmarks/results/x.txt`."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in span.split():
            word = word.strip("(),;:")
            if "/" in word and word.split("/")[0] in TOP and not any(c in word for c in "*<>{$"):
                found.add(word.split(":")[0])
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = sorted(p for p in _code_paths(doc.read_text()) if not (ROOT / p).exists())
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def _shell_commands(text: str) -> list[list[str]]:
    """Every command of the ```bash blocks (continuation lines joined) and every inline
    `python -m ...`, split as a shell would."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`(python -m [^`]+)`", text.replace("\n", " "))
    commands = []
    for line in lines:
        line = line.split(" # ")[0].strip()
        if line and not line.startswith("#"):
            for part in re.split(r"&&|;| \| ", line):
                if part.strip():
                    commands.append(shlex.split(part, posix=True))
    return commands


def _is_scratch(value: str) -> bool:
    """$OUT/..., or a placeholder of a synopsis (RUN_DIR, FILE.html) that the reader fills."""
    return value.startswith("$OUT") or re.fullmatch(r"[A-Z][A-Z_]*(\.[a-z]+)?", value) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_commands_write_only_to_a_scratch_folder(doc: Path) -> None:
    commands = _shell_commands(doc.read_text())
    for words in commands:
        for flag, value in itertools.pairwise(words):
            if flag in OUTPUT_FLAGS:
                assert _is_scratch(value), f"{doc.name}: {shlex.join(words)}"
    if doc.name == "README.md":
        assert any("$OUT" in word for words in commands for word in words)


def _validate_row(run_dir: Path, tmp_path: Path) -> str:
    """The doc's table row for one measured run, from what ``measured validate`` prints."""
    out = tmp_path / run_dir.name
    sim = [sys.executable, "-m", "sim", "measured"]
    source = ["import", str(run_dir), "--format", "llmservingsim", "--out", str(out)]
    subprocess.run([*sim, *source], check=True, capture_output=True, cwd=ROOT)
    printed = subprocess.run(
        [*sim, "validate", str(out)], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    cells = [run_dir.name]
    for metric in ("TTFT", "TPOT", "E2E"):
        words = next(x for x in printed.splitlines() if x.startswith(f"{metric} ")).split()
        cells.append(f"{words[2]} / {words[4]}")  # median |err| / bias
    makespan = next(x for x in printed.splitlines() if x.startswith("makespan")).split()
    cells.append(f"{makespan[2]} → {makespan[5]} s")
    return "| " + " | ".join(cells) + " |"


@pytest.mark.shared
@pytest.mark.slow
def test_the_measured_runs_table_is_what_measured_validate_prints(tmp_path: Path) -> None:
    if not SHARED_RUNS.is_dir():
        pytest.skip(f"measured runs not found at {SHARED_RUNS}")
    text = (ROOT / "docs" / "measured_runs.md").read_text()
    table = text.split("<!-- measured-validate-table")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("| RTXPRO6000")]
    assert len(rows) == 2
    for row in rows:
        run = row.split("|")[1].strip()
        assert row.replace("−", "-") == _validate_row(SHARED_RUNS / run, tmp_path), run


@pytest.mark.slow
def test_the_fast_forward_boundary_table_is_the_benchmarks_output() -> None:
    text = (ROOT / "docs" / "simulator_speed.md").read_text()
    table = text.split("<!-- fast-forward-boundaries-table -->\n")[1].split("\n\n")[0]
    documented = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    printed = subprocess.run(
        [sys.executable, "benchmarks/fast_forward_boundaries.py", "--requests", "10000"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    ).stdout
    assert documented == [line.split(" | ") for line in printed.splitlines()[1:]]
