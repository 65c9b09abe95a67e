"""The report's tables as HTML: runs and their configuration, the trace, and the summary
numbers (one row per run). Every string is escaped; each number cell names its summary key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

import numpy as np
import pandas as pd

from records.overload import frame_overload
from records.run_dir import UNKNOWN, RunRecords
from reports.memory import kv_utilisation

Formatter = Callable[[float], str]


def _ms(v: float) -> str:
    return f"{v:,.2f}"


def _count(v: float) -> str:
    return f"{round(v):,}"


def _share(v: float) -> str:
    return f"{v:.1%}"


def _rate(v: float) -> str:
    return f"{v:,.3f}"


def _tokens_rate(v: float) -> str:
    return f"{v:,.1f}"


LATENCY_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
LATENCY_STATS = (("mean", "mean"), ("median", "median"), ("p90", "p90"), ("p99", "p99"))
# (summary key, column header, formatter); "kv_util_*" are computed from steps.csv.
THROUGHPUT_COLUMNS: tuple[tuple[str, str, Formatter], ...] = (
    ("completed", "finished", _count),
    ("rejected", "rejected", _count),
    ("request_throughput", "requests/s", _rate),
    ("output_throughput", "output tokens/s", _tokens_rate),
    ("total_token_throughput", "total tokens/s", _tokens_rate),
    ("request_goodput", "goodput (requests/s)", _rate),
    ("num_preemptions", "preemptions", _count),
    ("num_blocks_swapped_out", "swapped-out blocks", _count),
    ("num_recomputed_tokens", "recomputed tokens", _count),
    ("prefix_hit_rate", "prefix-cache hit rate", _share),
    ("kv_util_mean", "KV in use (time mean)", _share),
    ("kv_util_peak", "KV in use (peak)", _share),
    ("mean_real_token_share", "real-token share of allocated KV", _share),
)


def format_value(value: Any, formatter: Formatter) -> str:
    """The page's text for a number; an en dash when it is missing."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    return formatter(float(value))


def table_values(run: RunRecords) -> dict[str, Any]:
    """Summary numbers plus the ones a report derives (KV utilisation)."""
    values = dict(run.summary)
    values["kv_util_mean"], values["kv_util_peak"] = kv_utilisation(run)
    values["mean_real_token_share"] = run.mean_real_token_share
    return values


def _cell(key: str, text: str) -> str:
    return f'<td class="num" data-key="{escape(key)}">{escape(text)}</td>'


def _slo_text(config: dict[str, Any]) -> str:
    parts = []
    for key, name in (("slo_ttft_s", "TTFT"), ("slo_tpot_s", "TPOT")):
        value = config.get(key)
        if value is not None:
            parts.append(f"{name} ≤ {float(value) * 1000:g} ms")
    return ", ".join(parts) if parts else "no SLO (goodput = throughput)"


def throughput_table(runs: Sequence[RunRecords]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for _, h, _ in THROUGHPUT_COLUMNS)
    rows = []
    for idx, run in enumerate(runs):
        values = table_values(run)
        cells = "".join(_cell(k, format_value(values.get(k), f)) for k, _, f in THROUGHPUT_COLUMNS)
        rows.append(
            f'<tr data-run="{idx}"><th scope="row">{escape(run.label)}</th>{cells}'
            f"<td>{escape(_slo_text(run.config))}</td></tr>"
        )
    return (
        '<table class="summary" id="summary-throughput"><thead><tr><th>run</th>'
        f"{head}<th>goodput SLO</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def latency_table(runs: Sequence[RunRecords]) -> str:
    top = "".join(f'<th colspan="{len(LATENCY_STATS)}">{n} (ms)</th>' for _, n in LATENCY_METRICS)
    sub = "".join(f"<th>{s}</th>" for _ in LATENCY_METRICS for _, s in LATENCY_STATS)
    rows = []
    for idx, run in enumerate(runs):
        cells = "".join(
            _cell(f"{stat}_{metric}_ms", format_value(run.summary.get(f"{stat}_{metric}_ms"), _ms))
            for metric, _ in LATENCY_METRICS
            for stat, _ in LATENCY_STATS
        )
        rows.append(f'<tr data-run="{idx}"><th scope="row">{escape(run.label)}</th>{cells}</tr>')
    return (
        '<table class="summary" id="summary-latency"><thead>'
        f'<tr><th rowspan="2">run</th>{top}</tr><tr>{sub}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def deployment_text(config: dict[str, Any]) -> str:
    """Replicas and router, or (disagg) pool sizes, pool policy and the KV link."""
    if config.get("policy") == "disagg":
        parallel = config.get("link_parallel_transfers", UNKNOWN)
        return (
            f"disaggregated: {config.get('num_prefill', UNKNOWN)} prefill + "
            f"{config.get('num_decode', UNKNOWN)} decode replicas, "
            f"{config.get('pool_policy', UNKNOWN)} batching in each pool, "
            f"{config.get('router', UNKNOWN)} router; KV link "
            f"{config.get('link_bandwidth_gbps', UNKNOWN):g} Gb/s, "
            f"{config.get('link_latency_us', UNKNOWN):g} us latency, "
            f"{parallel} transfer(s) at a time"
        )
    if "router" not in config:  # the engine, or a measured run: one replica, nothing routes
        return "1 replica"
    replicas = config.get("num_replicas", 1)
    return (
        f"{replicas} colocated replica{'s' if replicas != 1 else ''}, "
        f"{config.get('router', UNKNOWN)} router"
    )


def rejection_note(requests: pd.DataFrame) -> str | None:
    """How many requests were rejected and the most common reason; None if none were."""
    if requests.empty or "status" not in requests.columns:
        return None
    rejected = requests[requests["status"] == "rejected"]
    if rejected.empty:
        return None
    if "reject_reason" in rejected.columns:
        reasons = rejected["reject_reason"].fillna("").astype(str)
    else:
        reasons = pd.Series([""] * len(rejected), index=rejected.index)
    # Reasons name their request's lengths: count them by their wording without numbers.
    kinds = reasons.map(_reason_kind)
    counts = kinds.value_counts()
    kind = str(counts.index[0])
    example = reasons[kinds == kind].iloc[0] or "no reason recorded"
    text = (
        f"{len(rejected)} of {len(requests)} requests ({len(rejected) / len(requests):.0%}) "
        f"rejected; most common reason ({counts.iloc[0] / len(rejected):.0%} of them): {example}"
    )
    if "max length" in kind:
        text += " (raise --max-model-len, or pick a --model with a longer context)"
    elif "KV blocks" in kind:
        text += " (give the cache more room: --num-blocks, --gpu-memory-utilization, --tp)"
    return text


def _reason_kind(reason: str) -> str:
    """A rejection reason without its numbers (``prompt 9000 + max output ... exceeds the
    model's max length 8192`` and the same for other lengths are one kind)."""
    return " ".join(word for word in reason.split() if not any(ch.isdigit() for ch in word))


def admission_note(run: RunRecords) -> str | None:
    """A note when the run never admitted a request (its charts are then empty)."""
    if len(run.steps):
        return None
    return (
        f"{run.label}: no request was admitted, so no step ran and its charts are empty "
        f"({rejection_note(run.requests) or 'no requests'})"
    )


def overload_note(run: RunRecords) -> str | None:
    """The run's overload warning (``records.overload``), from its requests, so that a run of
    any executor, or one written before the check existed, shows it too."""
    end_s = run.summary.get("duration_s")
    overload = frame_overload(run.requests, float(end_s)) if end_s is not None else None
    return overload.warning if overload is not None else None


def _config_rows(run: RunRecords) -> list[tuple[str, str]]:
    c = run.config
    memory = run.memory_model
    if memory == "contiguous":
        memory += f" ({c.get('reservation', UNKNOWN)} reservation)"
    return [
        ("trace", run.trace_name),
        ("model", f"{c.get('model', UNKNOWN)}" + (f" (TP{c['tp']})" if "tp" in c else "")),
        ("hardware", run.hardware or str(c.get("hardware", UNKNOWN))),
        ("policy", str(c.get("policy", UNKNOWN))),
        ("deployment", deployment_text(c)),
        ("KV memory", memory),
        ("KV blocks", f"{run.num_blocks or UNKNOWN} × {c.get('block_size', UNKNOWN)} tokens"),
        ("prefix caching", "on" if c.get("enable_prefix_caching") else "off"),
        ("preemption", str(c.get("preemption_mode", UNKNOWN))),
        (
            "step budget",
            f"{c.get('max_num_seqs', UNKNOWN)} sequences, "
            f"{c.get('max_num_batched_tokens', UNKNOWN)} tokens",
        ),
        ("times", run.timing or f"simulated: cost model {c.get('profile') or 'roofline'}"),
        ("servesim version", run.version or UNKNOWN),
        ("command", run.command or UNKNOWN),
        ("run directory", run.source or "(in memory)"),
    ]


def runs_table(runs: Sequence[RunRecords]) -> str:
    """One column per run: its trace, model, hardware, policy and memory configuration."""
    head = "".join(f"<th>{escape(run.label)}</th>" for run in runs)
    rows_by_run = [_config_rows(run) for run in runs]
    body = []
    for line, (name, _) in enumerate(rows_by_run[0]):
        cells = "".join(f"<td>{escape(rows[line][1])}</td>" for rows in rows_by_run)
        body.append(f'<tr><th scope="row">{escape(name)}</th>{cells}</tr>')
    return (
        f'<table class="config" id="runs"><thead><tr><th></th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def trace_stats(run: RunRecords) -> dict[str, float]:
    """Counts, span, rate and length statistics: summary.json's ``trace_stats`` when present,
    else computed from the run's requests (what the run actually replayed)."""
    if run.trace_stats:
        return dict(run.trace_stats)
    frame = run.requests
    if frame.empty:
        return {"num_requests": 0.0}
    arrival = frame["arrival_s"].to_numpy(float)
    span = float(arrival.max() - arrival.min())
    stats = {
        "num_requests": float(len(frame)),
        "duration_s": span,
        "mean_rate_per_s": len(frame) / span if span > 0 else 0.0,
    }
    for column, prefix in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        values = frame[column].to_numpy(float)
        stats[f"{prefix}_mean"] = float(values.mean())
        stats[f"{prefix}_median"] = float(np.median(values))
        stats[f"{prefix}_p99"] = float(np.percentile(values, 99))
        stats[f"{prefix}_max"] = float(values.max())
    return stats


def trace_table(runs: Sequence[RunRecords]) -> str:
    """One row per distinct trace among the runs."""
    seen: dict[str, RunRecords] = {}
    for run in runs:
        seen.setdefault(run.trace_name, run)
    rows = []
    for name, run in seen.items():
        s = trace_stats(run)

        def lengths(prefix: str, s: dict[str, float] = s) -> str:
            if f"{prefix}_mean" not in s:
                return UNKNOWN
            return (
                f"mean {s[f'{prefix}_mean']:,.0f} · median {s[f'{prefix}_median']:,.0f} · "
                f"p99 {s[f'{prefix}_p99']:,.0f} · max {s[f'{prefix}_max']:,.0f}"
            )

        cells = [
            name,
            f"{s.get('num_requests', 0):,.0f}",
            f"{s.get('duration_s', float('nan')):,.1f} s",
            f"{s.get('mean_rate_per_s', float('nan')):,.2f} requests/s",
            lengths("prompt"),
            lengths("output"),
        ]
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("trace", "requests", "span", "rate", "prompt tokens", "output tokens")
    )
    return (
        f'<table class="config" id="trace"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
