"""A run directory that was damaged after it was written is refused by ``load_run`` with the
file, and where it can, the line and column: a value that is not a number, an unknown status,
a file cut short, a file emptied or missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from records.run_dir import load_run
from sim.cli.main import main


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    trace = tmp_path / "t.csv"
    rows = "".join(f"{i},{0.05 * i},40,4\n" for i in range(12))
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n" + rows)
    out = tmp_path / "run"
    assert main(["run", str(trace), "--out", str(out), "--quiet"]) == 0
    load_run(out)  # as written, it loads
    return out


def _edit_line(path: Path, line: int, old: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path.write_text("".join(lines))


@pytest.mark.parametrize(
    ("line", "old", "new", "said"),
    [
        (3, ",finished,,", ",finished,,abc", "3: arrival_s: not a number: 'abc"),
        (5, ",finished,", ",finished_xx,", "5: status: 'finished_xx' is not a request status"),
    ],
)
def test_a_bad_value_is_named_by_line_and_column(
    run_dir: Path, line: int, old: str, new: str, said: str
) -> None:
    requests = run_dir / "requests.csv"
    _edit_line(requests, line, old, new)
    with pytest.raises(ValueError, match="^" + re.escape(f"{requests}:{said}")):
        load_run(run_dir)


def test_a_requests_file_cut_short_is_refused(run_dir: Path) -> None:
    requests = run_dir / "requests.csv"
    text = requests.read_text()
    requests.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=re.escape("requests, but summary.json counts 12")):
        load_run(run_dir)


@pytest.mark.parametrize("name", ["requests.csv", "steps.csv"])
def test_an_emptied_or_missing_file_is_named(run_dir: Path, name: str) -> None:
    (run_dir / name).write_text("")
    with pytest.raises(ValueError, match="^" + re.escape(f"{run_dir / name}: empty")):
        load_run(run_dir)
    (run_dir / name).unlink()
    with pytest.raises(ValueError, match="^" + re.escape(f"{run_dir}: {name} is missing")):
        load_run(run_dir)


def test_report_says_so_instead_of_failing_deep_inside(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "steps.csv").unlink()
    assert main(["report", str(run_dir), "-o", str(tmp_path / "r.html")]) != 0
    assert f"{run_dir}: steps.csv is missing" in capsys.readouterr().err


def test_a_file_is_not_a_run_directory(run_dir: Path) -> None:
    with pytest.raises(ValueError, match="a file, not a run directory"):
        load_run(run_dir / "summary.json")
