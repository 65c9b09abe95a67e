"""The page itself: self-contained (plotly.js once, nothing fetched), the summary numbers,
definitions from the code's docstrings, escaped strings, and the CLI that writes it."""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
from pathlib import Path

import plotly.offline
import pytest

from core.memory import MemorySnapshot
from records import metrics
from reports import RunRecords, render_report, write_report
from reports.cli import main
from reports.html import _source_doc, embed_json

INJECTED = "<script>alert(1)</script>.csv"


def hostile(run: RunRecords) -> RunRecords:
    """The run with a script-bearing trace name and quote-bearing config strings."""
    config = run.config | {"model": "Llama \"8B\" 'q' </title>", "profile": "a&b<c>.json"}
    return dataclasses.replace(
        run,
        trace_name=INJECTED,
        label=f"{INJECTED} run",
        config=config,
        command=f"python -m sim run '{INJECTED}' --report \"x.html\"",
        notes=(f"note about {INJECTED}",),
    )


def test_page_is_self_contained(example_run: RunRecords) -> None:
    page = render_report([example_run, example_run])
    assert page.count(plotly.offline.get_plotlyjs()[:500]) == 1
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert "https://" not in page.split("<script>")[0]


def test_summary_numbers_and_definitions_are_on_the_page(example_run: RunRecords) -> None:
    page = render_report([example_run])
    s = example_run.summary
    assert f'data-key="completed">{s["completed"]:,}</td>' in page
    assert f'data-key="mean_ttft_ms">{s["mean_ttft_ms"]:,.2f}</td>' in page
    assert f'data-key="p99_e2el_ms">{s["p99_e2el_ms"]:,.2f}</td>' in page
    assert html.escape(inspect.cleandoc(metrics.__doc__ or "")) in page
    assert "internal fragmentation" in page and "reservation waste" in page
    assert "unknown" in page  # no command or version in this run's summary.json
    first_line = (MemorySnapshot.__doc__ or _source_doc(MemorySnapshot) or "").splitlines()[0]
    assert html.escape(first_line) in page


def test_class_docstrings_are_read_from_the_source_too() -> None:
    # What a class of the compiled build (which keeps no __doc__) shows in the definitions.
    doc = _source_doc(MemorySnapshot)
    assert doc is not None and doc.startswith("A partition of the KV cache's token slots")
    if MemorySnapshot.__doc__:  # the sources (a class of the compiled build keeps none)
        assert doc == MemorySnapshot.__doc__
    assert _source_doc(len) is None  # not a class of a package's source file


def test_strings_from_traces_and_configs_are_escaped(example_run: RunRecords) -> None:
    page = render_report([hostile(example_run)], title=f"report on {INJECTED}")
    assert "<script>alert(1)" not in page
    assert "</title>'" not in page and 'Llama "8B"' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.csv" in page
    assert page.count("<script") == page.count("</script>")


def test_embedded_json_cannot_close_its_script() -> None:
    text = embed_json('{"name": "</script><script>alert(1)</script> & <!--"}')
    assert "<" not in text and ">" not in text and "&" not in text
    assert text.startswith('{"name": "\\u003c/script\\u003e')


def test_write_report_refuses_no_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one run"):
        write_report([], tmp_path / "r.html")


def test_cli_renders_saved_runs(example_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "nested" / "report.html"
    argv = [str(example_dir), str(example_dir), "-o", str(out), "--label", "a", "--label", "b"]
    assert main(argv) == 0
    page = out.read_text()
    assert ">a</th>" in page and ">b</th>" in page and 'id="fig-kv-memory-1"' in page


def test_cli_reports_bad_input(
    example_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "r.html")
    assert main([str(example_dir), "-o", out, "--label", "a", "--label", "b"]) == 2
    assert main([str(tmp_path / "missing"), "-o", out]) == 2
    assert "error:" in capsys.readouterr().err


def test_definitions_cite_files_that_exist(example_run: RunRecords) -> None:
    page = render_report([example_run])
    definitions = page.split('id="definitions"')[1]
    cited = re.findall(r"\b([a-z_]+(?:/[a-z_]+)+\.py)\b", definitions)
    assert "records/metrics.py" in cited and "core/memory.py" in cited
    root = Path(__file__).resolve().parents[2]
    for path in cited:
        assert (root / path).is_file(), path


def test_an_imported_measured_run_is_not_labelled_as_priced(
    example_dir: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    from records.run_dir import load_run

    run_dir = tmp_path / "measured"
    shutil.copytree(example_dir, run_dir)
    payload = json.loads((run_dir / "summary.json").read_text())
    payload["measured"] = {"format": "llmservingsim", "source": "x"}
    (run_dir / "summary.json").write_text(json.dumps(payload))
    page = render_report([load_run(run_dir)])
    assert "<td>measured: a llmservingsim run, imported</td>" in page
    assert "<td>simulated: cost model roofline</td>" in render_report([load_run(example_dir)])
