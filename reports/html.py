"""The report page: its sections and figures (`report_sections`) and `write_report`, which
writes one self-contained HTML file with plotly.js embedded once (opens offline)."""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline

from core.memory import MemorySnapshot
from records import metrics
from records.run_dir import RunRecords
from reports import disagg, downsample, latency, load, memory
from reports.assets import ERROR_CAPTURE_JS, RENDER_JS, STYLE
from reports.tables import (
    admission_note,
    latency_table,
    overload_note,
    rejection_note,
    runs_table,
    throughput_table,
    trace_table,
)


@dataclass(frozen=True)
class Section:
    """One titled part of the page: a lead sentence, optional HTML, figures by element id."""

    section_id: str
    title: str
    lead: str
    figures: tuple[tuple[str, go.Figure], ...] = ()
    body_html: str = ""
    grid: bool = False


def _figure_sections(runs: Sequence[RunRecords]) -> list[Section]:
    latency_figs = [
        (f"fig-cdf-{column.removesuffix('_ms')}", latency.latency_cdf(runs, column))
        for column in latency.LATENCY_NAMES
    ]
    load_figs = [
        (f"fig-{kind}-{idx}", make(run))
        for idx, run in enumerate(runs)
        for kind, make in (("load", load.load_over_time), ("batch", load.batch_composition))
    ]
    load_figs.append(("fig-step-duration", load.step_duration(runs)))
    memory_figs = [("fig-kv-breakdown", memory.kv_breakdown(runs))]
    memory_figs.extend(
        (f"fig-kv-memory-{idx}", memory.kv_memory_over_time(run)) for idx, run in enumerate(runs)
    )
    sections = [
        Section(
            "latency",
            "Latency",
            "Distributions of per-request latency, run against run.",
            tuple(latency_figs),
            grid=True,
        ),
        Section(
            "queue-build-up",
            "Does a queue build up?",
            "TTFT by arrival time: a rising envelope means requests arrive faster than served.",
            (("fig-ttft-vs-arrival", latency.latency_vs_arrival(runs, "ttft_ms")),),
        ),
        Section(
            "load",
            "Load and batching over time",
            "Requests per scheduler state, the token mix of each step, and step duration.",
            tuple(load_figs),
        ),
        Section(
            "memory",
            "KV memory",
            "Where the KV cache's token slots went: real tokens, each kind of waste, the prefix "
            'cache and free memory. Click "free" in a legend to zoom into the memory in use.',
            tuple(memory_figs),
        ),
    ]
    if any(latency.priority_classes(run) for run in runs):
        sections.insert(
            1,
            Section(
                "priority",
                "Latency by priority class",
                "Each class of the trace's priorities on its own: under --scheduling-policy "
                "priority the lower classes should wait less, the higher ones more.",
                tuple(
                    (
                        f"fig-priority-{col.removesuffix('_ms')}",
                        latency.latency_cdf_by_priority(runs, col),
                    )
                    for col in ("ttft_ms", "e2el_ms")
                ),
                grid=True,
            ),
        )
    if any(disagg.has_disaggregation(run) for run in runs):
        sections.append(_disagg_section(runs))
    return sections


def _disagg_section(runs: Sequence[RunRecords]) -> Section:
    figs: list[tuple[str, go.Figure]] = []
    if any(disagg.has_transfers(run) for run in runs):
        figs.append(("fig-kv-transfer-volume", disagg.kv_transfer_volume(runs)))
        figs.append(("fig-kv-link-queueing", disagg.kv_link_queueing(runs)))
    figs.extend(
        (f"fig-pool-utilisation-{idx}", disagg.pool_utilisation(run))
        for idx, run in enumerate(runs)
        if disagg.has_pools(run)
    )
    return Section(
        "disagg",
        "Disaggregation",
        "KV transfers between the prefill and decode pools, and each pool's KV use.",
        tuple(figs),
    )


def _doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__ or _source_doc(obj) or "")


def _source_doc(obj: object) -> str | None:
    """The docstring of a top-level class as its source file writes it: a class of the
    compiled build (docs/compiled_core.md) keeps none at run time."""
    package, _, leaf = str(getattr(obj, "__module__", "")).rpartition(".")
    for folder in getattr(sys.modules.get(package), "__path__", ()):
        path = Path(folder) / f"{leaf}.py"
        if path.is_file():
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                name = getattr(obj, "__qualname__", None)
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return ast.get_docstring(node, clean=False)
    return None


def _file(obj: object) -> str:
    """The source file that defines ``obj`` (a module, or a class of one), from the
    repository's root: named from the object itself, so that a move cannot leave it stale."""
    module = obj if inspect.ismodule(obj) else sys.modules[str(getattr(obj, "__module__", ""))]
    return module.__name__.replace(".", "/") + ".py"


def definitions_html() -> str:
    """How every number is computed, from the docstrings of the code that computes it."""
    parts = [
        (f"Latency, throughput and goodput ({_file(metrics)})", _doc(metrics)),
        (f"KV memory slots ({_file(MemorySnapshot)}, MemorySnapshot)", _doc(MemorySnapshot)),
        (f"KV in use ({_file(memory)})", _doc(memory.kv_utilisation)),
        (f"Time-averaged breakdown ({_file(memory)})", _doc(memory.kv_breakdown)),
        (
            "Real-token share of allocated KV (sim/run.py; engine/replay.py for engine runs)",
            "Real token slots summed over all steps / (real + internal fragmentation + "
            "reservation waste slots) summed over all steps, as stored in summary.json "
            "(mean_real_token_share).",
        ),
        (f"Downsampling for display ({_file(downsample)})", downsample.DESCRIPTION),
    ]
    return "".join(
        f'<h3>{escape(title)}</h3><pre class="definitions">{escape(text)}</pre>'
        for title, text in parts
    )


def report_sections(runs: Sequence[RunRecords]) -> list[Section]:
    notes = sorted({note for run in runs for note in run.notes})
    for run in runs:
        derived = admission_note(run) or rejection_note(run.requests)
        if derived and derived not in notes:
            notes.append(derived if derived.startswith(run.label) else f"{run.label}: {derived}")
        warning = overload_note(run)
        if warning:
            notes.append(f"{run.label}: warning: {warning}")
    notes_html = "".join(f"<li>{escape(n)}</li>" for n in notes)
    header = Section(
        "runs",
        "Runs",
        "What was simulated: the trace, and each run's model, hardware, policy and memory.",
        body_html=f'<div class="table-wrap">{trace_table(runs)}{runs_table(runs)}</div>'
        + (f'<ul class="notes">{notes_html}</ul>' if notes else ""),
    )
    summary = Section(
        "summary",
        "Summary",
        "One row per run; all numbers from the full data (latencies over finished requests).",
        body_html=f'<div class="table-wrap">{throughput_table(runs)}{latency_table(runs)}</div>',
    )
    definitions = Section(
        "definitions", "Definitions", "How each metric is computed.", body_html=definitions_html()
    )
    return [header, summary, *_figure_sections(runs), definitions]


def embed_json(text: str) -> str:
    """JSON safe inside <script>: no ``<``, ``>`` or ``&`` survive (they only occur inside JSON
    strings, where the \\u escapes mean the same), so nothing can close the element."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _section_html(section: Section) -> str:
    figures = "".join(
        f'<div class="figure" id="{escape(fig_id)}"></div>'
        f'<script type="application/json" id="{escape(fig_id)}-data">'
        f"{embed_json(fig.to_json())}</script>"
        for fig_id, fig in section.figures
    )
    if figures:
        figures = f'<div class="{"grid" if section.grid else "stack"}">{figures}</div>'
    return (
        f'<section id="{escape(section.section_id)}"><h2>{escape(section.title)}</h2>'
        f'<p class="lead">{escape(section.lead)}</p>{section.body_html}{figures}</section>'
    )


def render_report(runs: Sequence[RunRecords], title: str | None = None) -> str:
    """The whole page as a string (see `write_report`)."""
    if not runs:
        raise ValueError("runs must hold at least one run, got none")
    title = title or "servesim report: " + ", ".join(run.label for run in runs)
    lead = "Which policy and memory layout serves this trace best, and why."
    return render_page(title, lead, report_sections(runs))


def render_page(title: str, lead: str, sections: Sequence[Section], script: str = "") -> str:
    """A self-contained page of ``sections`` (plotly.js embedded once); ``script`` runs after
    the figures are drawn."""
    plotly_js = plotly.offline.get_plotlyjs().replace("</script", "<\\/script")
    body = "".join(_section_html(s) for s in sections)
    extra = f"<script>{script}</script>" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style>"
        f"<script>{ERROR_CAPTURE_JS}</script><script>{plotly_js}</script></head>"
        f'<body><h1>{escape(title)}</h1><p class="lead">{escape(lead)}</p>'
        f'{body}<pre id="js-errors" class="hidden">[]</pre>'
        f'<pre id="render-status" class="hidden"></pre><script>{RENDER_JS}</script>{extra}'
        "</body></html>\n"
    )


def write_report(runs: Sequence[RunRecords], path: str | Path, title: str | None = None) -> Path:
    """Write one self-contained HTML report comparing ``runs``; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(runs, title), encoding="utf-8")
    return out
