"""What each part of the GPU check measured, read from its folder as a small dict of figures
for the summary. Each reader raises ``ValueError`` naming the file when its output is missing
or unreadable."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

LOG_FILE = "log.txt"
BENCH_ENGINE_FILE = "bench_engine.json"
# A run's closing line: its counts, then "in 49.46s".
PYTEST_SUMMARY = re.compile(r"^=*\s*\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not readable as JSON ({error})") from error


def environment(folder: Path) -> dict[str, Any]:
    info = _json(folder / "environment.json")
    missing = sorted(name for name, present in info.get("modules", {}).items() if not present)
    keys = ("device", "hardware", "torch", "triton", "cuda", "commit", "cpu_count", "cpu_cores")
    return {**{key: info.get(key) for key in keys}, "missing_modules": missing}


def pytest_counts(folder: Path) -> dict[str, Any]:
    """The counts of pytest's summary lines (``3 failed, 71 passed in 49.46s``), summed over
    the part's pytest runs."""
    path = folder / LOG_FILE
    lines = [line for line in path.read_text().splitlines() if PYTEST_SUMMARY.search(line)]
    if not lines:
        raise ValueError(f"{path}: no pytest summary line")
    counts: dict[str, int] = {}
    for line in lines:
        for num, kind in PYTEST_COUNT.findall(line):
            key = kind.rstrip("s") if kind.startswith("error") else kind
            counts[key] = counts.get(key, 0) + int(num)
    if not counts.get("passed") and not counts.get("failed"):
        # All skipped (no CUDA, or TRITON_INTERPRET=1): the part must not read as passed.
        raise ValueError(f"{path}: no test ran ({lines[-1].strip(' =')})")
    return counts


def bench_engine(folder: Path) -> dict[str, Any]:
    """Per section: each shape's time and its share of the bound (HBM for decode and whole
    steps, tensor cores for prefill), and the trace's tokens/s."""
    data = _json(folder / BENCH_ENGINE_FILE)
    out: dict[str, Any] = {"cuda_graphs": data.get("environment", {}).get("cuda_graphs")}
    for section in ("decode", "steps"):
        rows = data.get(section, [])
        if rows:
            out[f"{section}_ms"] = {f"b{r['batch']}x{r['context']}": _round(r["ms"]) for r in rows}
            out[f"{section}_share_pct"] = {
                f"b{r['batch']}x{r['context']}": _round(r["share_pct"]) for r in rows
            }
    if data.get("prefill"):
        out["prefill_share_pct"] = {
            str(r["tokens"]): _round(r["share_pct"]) for r in data["prefill"]
        }
    if data.get("trace"):
        out["trace_tokens_per_s"] = _round(data["trace"][0]["tokens_per_s"])
    return out


def decode_profiles(folder: Path) -> dict[str, Any]:
    """Per mode (graphs, eager) and batch: kernels and launches per step, the step's time and
    the host's time split into prepare, forward and the rest."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ValueError(f"{folder}: no decode profile written")
    out: dict[str, Any] = {}
    for path in files:
        for batch, entry in _json(path)["batches"].items():
            out[f"{path.stem}_b{batch}"] = {
                "kernels_per_step": _round(entry["cuda_kernels_per_step"]),
                "launches_per_step": _round(entry["launch_calls_per_step"]),
                "step_ms": _round(entry["step_ms_median"]),
                "gpu_kernel_ms": _round(entry["cuda_kernel_ms_per_step"]),
                "host_ms": {k: _round(v) for k, v in entry["host_ms_per_step"].items()},
                "launch_call_us": _round(entry.get("launch_call_us_mean")),
                "forward_host_us_per_launch": _round(entry.get("forward_host_us_per_launch")),
                "host_top_ops_us": {
                    name: _round(us) for name, us in (entry.get("host_top_ops") or {}).items()
                },
            }
    return out


def calibration(folder: Path) -> dict[str, Any]:
    """The profile's timer and steps, how its whole steps scatter around its own model, the
    host clock it fitted, and (``--repeat 2``) how far the second profile's predictions of the
    step grids are from the first's."""
    profile = _json(folder / "profile.json")
    out: dict[str, Any] = {
        "timer": profile.get("timer"),
        "tables_time": profile.get("tables_time"),
        "engine_kind": profile.get("engine", {}).get("kind"),
        "whole_steps": len(profile.get("steps", [])),
        "step_spread_pct": _round(100 * float(profile.get("step_spread") or 0.0)),
        "decode_attention_context": profile.get("decode_attention_context"),
        "device": profile.get("device", {}).get("name"),
    }
    engine = profile.get("engine") or {}
    if "timer_calls" in engine:  # how often a timed call's launches outran the GPU's hold
        out["timer_holds"] = {
            k: int(engine.get(f"timer_{k}", 0)) for k in ("calls", "retimed", "late")
        }
    if isinstance(profile.get("host"), dict):
        # Seconds in microseconds: rounded as seconds, every per-launch term read 0.0.
        out["host"] = {
            (f"{k[:-2]}_us" if k.endswith("_s") else k): (
                v if isinstance(v, bool) else _round(1e6 * v) if k.endswith("_s") else _round(v)
            )
            for k, v in profile["host"].items()
        }
    ops = profile.get("ops") or {}
    if "decode_attention_graph" in ops and "decode_attention" in ops:
        out["decode_graph_over_eager"] = _graph_over_eager(ops)
    repeats = folder / "profile-repeats.json"
    if repeats.exists():
        pairs = _json(repeats)["pairs"]
        out["profiles_differ_median_pct"] = [_round(p["median_pct"]) for p in pairs]
        out["profiles_differ_p90_pct"] = [_round(p["p90_pct"]) for p in pairs]
        # How much slower the later calibration's host ran, from the steps' input preparation.
        prepare = [(p.get("where") or {}).get("steps", {}).get("prepare") for p in pairs]
        if all(prepare):
            out["host_prepare_differ_pct"] = [_round(q["median_pct"]) for q in prepare]
        # The two apart once the later one is priced back on the first's host.
        hosts = [p.get("one_host") or {} for p in pairs]
        if hosts and all("median_pct" in h for h in hosts):
            out["profiles_differ_one_host_median_pct"] = [_round(h["median_pct"]) for h in hosts]
            out["host_slowdown_between"] = [_round(h["host_slowdown"]) for h in hosts]
    return out


def _graph_over_eager(ops: dict[str, Any]) -> dict[str, float]:
    """By batch size, the median over contexts of the decode table timed on the graphs' plan
    over the one timed eagerly (each point's splits sized for its own context)."""
    graph, eager = ops["decode_attention_graph"], ops["decode_attention"]
    eager_rows = dict(zip(eager["num_seqs"], eager["time_s"], strict=True))
    out: dict[str, float] = {}
    for b, row in zip(graph["num_seqs"], graph["time_s"], strict=True):
        if b in eager_rows and graph["context_tokens"] == eager["context_tokens"]:
            ratios = sorted(g / e for g, e in zip(row, eager_rows[b], strict=True) if e > 0)
            if ratios:
                out[str(round(b))] = _round(statistics.median(ratios))
    return out


def validation(folder: Path) -> dict[str, Any]:
    """Per cost model: the median per-request |error| of TTFT, TPOT and E2E, and of the
    engine's own steps, in percent; the engine against itself; and how much slower the run's
    host was than the calibration's (and the rerun's than the run's), from their input
    preparation."""
    result = _json(folder / "validation.json")
    out: dict[str, Any] = {}
    for name, model in result["models"].items():
        metrics = model["requests"]["metrics"]
        out[name] = {
            metric: _round(metrics[metric]["median_abs_pct"])
            for metric in ("ttft", "tpot", "e2e")
            if metric in metrics
        }
        out[name]["steps"] = _round(model["steps"]["all"]["median_abs_pct"])
        tail = model.get("tail") or {}
        if "tail_pts" in tail:  # the decode-only steps' slow tail, and without the host's stalls
            out[name]["tail_pts"] = _round(tail["tail_pts"])
            if "tail_without_hiccups_pts" in tail:
                out[name]["tail_calm_pts"] = _round(tail["tail_without_hiccups_pts"])
        by_batch = model["steps"].get("by_decode_batch") or {}
        if by_batch:  # where the step error sits by decode batch: measured - priced, in us
            out[name]["decode_residual_us_by_batch"] = {
                label: _round(1e6 * group["median_residual_s"])
                for label, group in by_batch.items()
                if group.get("median_residual_s") is not None
            }
        why = model.get("divergence", {}).get("why")
        if why:
            out[name]["first_divergence"] = why.get("reason")
    if result.get("engine_kind"):
        out["engine_kind"] = result["engine_kind"]
    floor = result.get("engine_floor")
    if floor:
        metrics = floor["requests"]["metrics"]
        # The engine against itself: the noise floor the simulator's errors sit beside.
        out["noise_floor"] = {
            m: _round(metrics[m]["median_abs_pct"]) for m in ("ttft", "tpot", "e2e") if m in metrics
        }
        speed = floor.get("host_speed")
        if isinstance(speed, dict):  # the second run's host against the first's
            out["rerun_host_slowdown"] = _round(speed["slowdown"])
    speed = result.get("host_speed") or {}
    if "slowdown" in speed:  # the run's host against the calibration's (fidelity.host_speed)
        out["host_slowdown"] = _round(speed["slowdown"])
        out["host_slowdown_by_fifth"] = [_round(x) for x in speed["by_fifth"]]
        if speed.get("core_share") is not None:
            out["core_share"] = _round(speed["core_share"])
    spread = result.get("profile_spread") or {}
    if "steps_spread_pct" in spread:
        out["profile_step_spread_pct"] = _round(spread["steps_spread_pct"])
    if spread.get("device_scale") is not None:
        out["profile_device_scale"] = _round(spread["device_scale"])
    return out


def engine_against_itself(folder: Path) -> dict[str, Any]:
    """Two runs of the same trace: per request, |first - second| / second of TTFT, TPOT and
    E2E (the second run is the reference, as in the H200 runs' README); the medians in
    percent (issue 29's target: TPOT and E2E within 2%)."""
    import pandas as pd

    frames = []
    for run in ("run1", "run2"):
        path = folder / run / "requests.csv"
        try:
            frames.append(pd.read_csv(path).set_index("request_id"))
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not readable ({error})") from error
    first, second = frames
    out: dict[str, Any] = {}
    for column, label in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2el_ms", "e2el")):
        a, b = first[column].align(second[column], join="inner")
        keep = a.notna() & b.notna() & (b > 0)
        diffs = (100 * (a[keep] - b[keep]).abs() / b[keep]).tolist()
        out[f"median_abs_diff_{label}_pct"] = _round(statistics.median(diffs)) if diffs else None
        out[f"median_{label}_ms"] = [_round(float(a.median())), _round(float(b.median()))]
    out["requests_compared"] = len(first.index.intersection(second.index))
    return out


OWN_KERNEL_FIELDS = (
    "decode_latency_s",
    "fused_row_latency_s",
    "fused_row_bandwidth_efficiency",
    "lm_head_latency_s",
)
"""servesim's own kernels (``sim.costmodel.own_kernel_fit``), reported apart from the GEMMs."""


def model_fits(folder: Path) -> dict[str, Any]:
    """The decode walk's tile time fitted to each engine run's graph replays (in us a layer,
    with the fit's median |error|) beside the preset's, each GEMM efficiency fitted to the
    calibrations' linear tables beside the preset's, and servesim's own kernels fitted to their
    decode, elementwise and LM head tables (fixed costs in us: a layer, a kernel, a step)
    beside the preset's."""
    walk = _json(folder / "decode_walk.json")
    out: dict[str, Any] = {"stated_tile_us": _round(1e6 * float(walk["stated_tile_s"]))}
    for run, fit in walk["runs"].items():
        out[f"{run}_tile_us"] = _round(1e6 * float(fit["tile_s"]))
        out[f"{run}_fit_median_abs_pct"] = _round(fit["fit_median_abs_pct"])
    for gpu, fields in _json(folder / "efficiencies.json").items():
        own = {field: fields.pop(field) for field in OWN_KERNEL_FIELDS if field in fields}
        out[f"{gpu}_efficiencies"] = {
            field: [_round(fit["value"]), fit["preset"]] for field, fit in fields.items()
        }
        for field, fit in own.items():
            if field.endswith("_s"):  # a fixed cost, in us
                fitted, stated = 1e6 * float(fit["value"]), 1e6 * float(fit["preset"])
                out[f"{gpu}_{field[:-2]}_us"] = [_round(fitted), _round(stated)]
            else:
                out[f"{gpu}_{field}"] = [_round(fit["value"]), fit["preset"]]
    return out


SPLIT_BINS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 512))


def split_ab(folder: Path) -> dict[str, Any]:
    """The engine with the fixed decode split (this part's ``run1``) beside engine-self's two
    runs of the per-sequence split (the second against the first is the noise): each run's
    median decode-only step (ms) by decode batch size (``SPLIT_BINS``), and its median TPOT."""
    import pandas as pd

    from records.run_dir import run_file
    from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes

    runs = {
        "fixed": folder / "run1",
        "per_sequence_run1": folder.parent / "engine-self" / "run1",
        "per_sequence_run2": folder.parent / "engine-self" / "run2",
    }
    out: dict[str, Any] = {"batch_bins": [f"{lo}-{hi}" for lo, hi in SPLIT_BINS]}
    for name, run in runs.items():
        shapes = load_step_shapes(run_file(run, STEP_SHAPES_FILE))
        decode = [s for s in shapes if not s.prefill_chunks and s.decode_context_tokens]
        by_bin = []
        for lo, hi in SPLIT_BINS:
            times = [s.duration_s for s in decode if lo <= len(s.decode_context_tokens) <= hi]
            by_bin.append(_round(1e3 * statistics.median(times)) if times else None)
        tpot = pd.read_csv(run_file(run, "requests.csv"))["tpot_ms"].dropna()
        out[name] = {
            "decode_only_steps": len(decode),
            "decode_only_median_ms": by_bin,
            "median_tpot_ms": _round(float(tpot.median())) if len(tpot) else None,
        }
    return out


def host_modes_ab(folder: Path) -> dict[str, Any]:
    """The eager engine pinned to its cores (this part's ``run1``) beside engine-self-eager's
    two runs unpinned: each run's decode-only steps (median and p90 in ms, and p90 over the
    median, which the host's slow stretches raise), their input preparation (median ms) and
    the median TPOT. Steady runs have p90 close to the median."""
    import pandas as pd

    from records.run_dir import run_file
    from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes

    runs = {
        "pinned": folder / "run1",
        "unpinned_run1": folder.parent / "engine-self-eager" / "run1",
        "unpinned_run2": folder.parent / "engine-self-eager" / "run2",
    }
    out: dict[str, Any] = {}
    for name, run in runs.items():
        shapes = load_step_shapes(run_file(run, STEP_SHAPES_FILE))
        decode = [s for s in shapes if not s.prefill_chunks and s.decode_context_tokens]
        times = sorted(1e3 * s.duration_s for s in decode)
        prepare = [1e3 * s.prepare_s for s in decode]
        tpot = pd.read_csv(run_file(run, "requests.csv"))["tpot_ms"].dropna()
        median = statistics.median(times) if times else None
        p90 = times[int(0.9 * (len(times) - 1))] if times else None
        out[name] = {
            "decode_only_steps": len(decode),
            "decode_only_median_ms": _round(median) if median is not None else None,
            "decode_only_p90_ms": _round(p90) if p90 is not None else None,
            "p90_over_median": _round(p90 / median) if median and p90 else None,
            "prepare_median_ms": _round(statistics.median(prepare)) if prepare else None,
            "median_tpot_ms": _round(float(tpot.median())) if len(tpot) else None,
        }
    return out


MIXED_BINS = ((1, 64), (65, 256), (257, 512), (513, 1 << 30))


def piecewise_ab(folder: Path) -> dict[str, Any]:
    """The engine with piecewise graphs for its other steps (this part's ``run1``) beside
    engine-self's two eager-mixed runs (the second against the first is the noise): each run's
    median step with a prompt chunk (ms) by its tokens (``MIXED_BINS``; past 512 both run
    eager), its median decode-only step, and its median TTFT and TPOT."""
    import pandas as pd

    from records.run_dir import run_file
    from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes

    runs = {
        "piecewise": folder / "run1",
        "eager_mixed_run1": folder.parent / "engine-self" / "run1",
        "eager_mixed_run2": folder.parent / "engine-self" / "run2",
    }
    out: dict[str, Any] = {"token_bins": [f"{lo}-{hi}" for lo, hi in MIXED_BINS[:-1]] + [">512"]}
    for name, run in runs.items():
        shapes = load_step_shapes(run_file(run, STEP_SHAPES_FILE))
        mixed = [s for s in shapes if s.prefill_chunks]
        decode = [s.duration_s for s in shapes if not s.prefill_chunks and s.decode_context_tokens]
        by_bin = []
        for lo, hi in MIXED_BINS:
            times = [
                s.duration_s
                for s in mixed
                if lo <= sum(n for n, _ in s.prefill_chunks) + len(s.decode_context_tokens) <= hi
            ]
            by_bin.append(_round(1e3 * statistics.median(times)) if times else None)
        requests = pd.read_csv(run_file(run, "requests.csv"))
        medians = {
            f"median_{metric}": _round(float(requests[metric].dropna().median()))
            for metric in ("ttft_ms", "tpot_ms")
        }
        out[name] = {
            "steps_with_prefill": len(mixed),
            "with_prefill_median_ms": by_bin,
            "decode_only_median_ms": _round(1e3 * statistics.median(decode)) if decode else None,
            **medians,
        }
    return out


def kernels_bench(folder: Path) -> dict[str, Any]:
    """Rows timed and the target verdicts that failed (kernel and shape)."""
    data = _json(folder / "kernels_bench.json")
    rows = data.get("rows", [])
    failed = [
        f"{row['kernel']} {json.dumps(row['shape'])}: {name}"
        for row in rows
        for name, ok in row.get("verdicts", {}).items()
        if not ok
    ]
    verdicts = sum(len(row.get("verdicts", {})) for row in rows)
    out = {
        "rows": len(rows),
        "verdicts": verdicts,
        "verdicts_failed": len(failed),
        "failed": failed[:8],
        "copy_bandwidth_gbs": _round(data.get("copy_bandwidth_gbs")),
    }
    # The decode split's A/B (``kernels.bench_graph.bench_split``): us per call in a graph.
    splits = [
        {
            "batch": row["shape"]["batch"],
            "long": row["shape"]["long"],
            "per_sequence_us": _round(row.get("graph_us")),
            "fixed_us": _round(row.get("baseline_graph_us")),
        }
        for row in rows
        if row.get("kernel") == "decode_split"
    ]
    if splits:
        out["decode_split"] = splits
    return out


def _round(value: Any) -> Any:
    return round(float(value), 2) if isinstance(value, (int, float)) else value
