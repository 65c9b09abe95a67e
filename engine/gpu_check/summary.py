"""The GPU check's summary, beside the part folders: ``summary.json`` (every result, as data)
and ``summary.md`` (a table of the parts, then each part's figures, commands and log)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.gpu_check.run import STATUSES, PartResult

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


def write_summary(out: Path, header: dict[str, Any], results: Sequence[PartResult]) -> None:
    """Write both files under ``out`` (rewritten whole each time: a check stopped midway
    still leaves the summary of the parts done)."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {status: sum(1 for r in results if r.status == status) for status in STATUSES}
    payload = {**header, "counts": counts, "parts": [asdict(r) for r in results]}
    (out / SUMMARY_JSON).write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (out / SUMMARY_MD).write_text(markdown(header, results, counts))


def markdown(header: dict[str, Any], results: Sequence[PartResult], counts: dict[str, int]) -> str:
    lines = ["# servesim GPU check", ""]
    lines += [f"- {key}: {_cell(value)}" for key, value in header.items()]
    lines.append("- parts: " + ", ".join(f"{n} {status}" for status, n in counts.items() if n))
    lines += ["", "| part | status | time | figures / reason |", "|---|---|---|---|"]
    for r in results:
        brief = r.reason if r.status != "passed" else _brief(r.figures)
        lines.append(f"| {r.name} | {r.status} | {r.wall_s:.0f} s | {_cell(brief)} |")
    for r in results:
        lines += ["", f"## {r.name}: {r.status}", "", r.about, ""]
        if r.reason:
            lines += [f"Reason: {r.reason}", ""]
        lines += [f"    {command}" for command in r.commands]
        if r.log:
            lines += ["", f"Log: `{r.log}`"]
        if r.figures:
            lines += ["", "```json", json.dumps(r.figures, indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def _brief(figures: dict[str, Any], limit: int = 200) -> str:
    """The figures on one line, the scalars first."""
    scalars = [f"{k} {v}" for k, v in figures.items() if not isinstance(v, (dict, list))]
    nested = [
        f"{k} {json.dumps(v, default=str, separators=(',', ':'))}"
        for k, v in figures.items()
        if isinstance(v, (dict, list))
    ]
    text = "; ".join(scalars + nested)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cell(value: Any) -> str:
    return str(value).replace("|", "/").replace("\n", " ")
