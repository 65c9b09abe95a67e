"""The simulator against the real engine on CPU: tiny-llama over the bundled traces under every
policy (the first --requests requests of each), with a profile calibrated in the same run (or
--profile), and the analytic roofline beside it. Prints the error table, then the run-to-run
noise of the engine itself (the same configuration replayed twice), per request and per step,
and where the calibrated model's step error sits (by batch shape, by decode skew, per term).
Last, each run once more on its own host: its input preparation measured against the
calibration's (on the clock its steps are on) and the run priced at that slowdown
(``--host-slowdown measured``), beside the error as it is.

By default (``--clock auto``) both the calibration and the engine run on the thread-CPU clock
(docs/cpu_timing.md): on a loaded, shared CPU the wall clock measures the load more than the
model.

    python benchmarks/validate_cpu.py --out runs/validate-cpu > benchmarks/results/validate_cpu.txt

Targets (issue 11): median |error| <= 5% on TPOT and E2E, <= 10% on TTFT; the cost model's
step-time error on the engine's own batches <= 3%.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.policies import POLICIES  # noqa: E402
from core.settings import build  # noqa: E402
from fidelity import validation  # noqa: E402
from fidelity.calibrate import calibrate  # noqa: E402
from fidelity.clocks import CLOCK_CHOICES, resolve_clock  # noqa: E402
from fidelity.validate import ValidateConfig, subset, validate  # noqa: E402
from records.run_dir import load_run  # noqa: E402
from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes, shapes_equal  # noqa: E402
from traces.loaders import load_trace  # noqa: E402

TRACES = ("example", "bursty", "shared_prefix", "parallel_sampling")
METRICS = ("ttft", "tpot", "itl", "e2e")


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{value:6.1f}"


def run_scale(model: dict[str, Any]) -> tuple[float | None, float | None]:
    """The run's median predicted/measured step ratio, and the median |error| % of the steps
    once divided by it: the error a per-run load level cannot explain (the cost model's shape
    error). A diagnostic beside the headline error, not a replacement for it."""
    import numpy as np

    rows = model["steps"]["rows"]
    ratios = np.array([r["predicted_s"] / r["measured_s"] for r in rows if r["measured_s"] > 0])
    if not ratios.size:
        return None, None
    scale = float(np.median(ratios))
    return scale, float(100 * np.median(np.abs(ratios / scale - 1)))


def row(trace: str, policy: str, name: str, result: dict[str, Any]) -> str:
    model = result["models"][name]
    metrics = model["requests"]["metrics"]
    cells = [_pct(metrics.get(m, {}).get("median_abs_pct")) for m in METRICS]
    steps = model["steps"]
    kinds = [_pct(steps["by_kind"][k]["median_abs_pct"]) for k in validation.STEP_KINDS]
    div = model["divergence"]["num_identical_steps"]
    scale, shape = run_scale(model)
    load = _engine_load(result)
    return (
        f"{trace:<18}{policy:<11}{name:<11}" + " ".join(cells) + " |"
        + _pct(steps["all"]["median_abs_pct"]) + _pct(steps["all"]["bias_pct"]) + " |"
        + " ".join(kinds) + f" | {div:>4}/{model['num_engine_steps']:<4}|"
        + (f" {scale:5.2f}" if scale is not None else "   -  ") + _pct(shape)
        + (f" | {load:5.1f}" if load is not None else " |   -")
    )  # fmt: skip


def _engine_load(result: dict[str, Any]) -> float | None:
    summary = json.loads((Path(result["engine_run"]) / "summary.json").read_text())
    value = (summary.get("load_average_1m") or {}).get("start")
    return float(value) if value is not None else None


TABLE_LEGEND = (
    "# median |error| % per request; cost model on the engine's own steps: median |error|\n"
    "# and bias %, median |error| by batch shape; steps whose batches match the engine's;\n"
    "# scale: median predicted/measured step ratio of the run, shape: median |error| % of the\n"
    "# steps after dividing by it (what a per-run load level cannot explain); load: 1-minute\n"
    "# load average when the engine run started"
)
HEADER = (
    f"{'trace':<18}{'policy':<11}{'model':<11}"
    + "  TTFT   TPOT    ITL    E2E | step  bias | prefill decode  mixed | same steps"
    + " | scale shape | load"
)


def noise(trace_path: Path, args: argparse.Namespace, out: Path, clock: str) -> list[str]:
    """The engine twice on one configuration: per-request differences between the runs, and
    per step over the steps both runs ran with the same batch at the same index."""
    from engine.llm_engine import EngineConfig
    from engine.replay import ReplayConfig, replay

    trace = subset(load_trace(trace_path), args.noise_requests, 1.0)
    dirs = []
    for attempt in (1, 2):
        engine = build(
            EngineConfig, model="tiny-llama", weights="random", policy="chunked", clock=clock
        )
        result = replay(trace, ReplayConfig(engine=engine, time_scale=args.time_scale))
        result.write(out / f"noise-{attempt}")
        dirs.append(out / f"noise-{attempt}")
    first, second = (load_run(d) for d in dirs)
    errors = validation.request_errors(first.requests, second.requests)
    lines = [
        f"run-to-run noise: {trace.name} (first {len(trace.requests)} requests), chunked, "
        f"clock {clock}, engine run twice (second vs first)"
    ]
    for metric, stats in errors["metrics"].items():
        lines.append(
            f"  {metric.upper():<5} median |diff| {_pct(stats['median_abs_pct'])}%  "
            f"p90 {_pct(stats['p90_abs_pct'])}%  bias {_pct(stats['bias_pct'])}%"
        )
    a, b = (load_step_shapes(d / STEP_SHAPES_FILE) for d in dirs)
    for run_idx, steps in enumerate((a, b), start=1):
        # Consecutive decode-only steps of the same batch differ by one token of context each:
        # what is left between them is the clock's noise within a run.
        adjacent = [
            (x.busy_s, y.busy_s)
            for x, y in itertools.pairwise(steps)
            if x.kind == y.kind == "decode-only" and x.request_ids == y.request_ids
        ]
        stats = validation.error_stats([y for _, y in adjacent], [x for x, _ in adjacent])
        lines.append(
            f"  run {run_idx}: consecutive same-batch decode steps, median |diff| "
            f"{_pct(stats['median_abs_pct'])}%  p90 {_pct(stats['p90_abs_pct'])}%  "
            f"over {stats['n']} pairs"
        )
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if shapes_equal(x, y)]
    for name, get in (("busy (timeline)", "busy_s"), ("cpu_s", "cpu_s"), ("wall_s", "wall_s")):
        stats = validation.error_stats(
            [getattr(y, get) for _, y in pairs], [getattr(x, get) for x, _ in pairs]
        )
        lines.append(
            f"  step {name:<15} median |diff| {_pct(stats['median_abs_pct'])}%  "
            f"p90 {_pct(stats['p90_abs_pct'])}%  over {stats['n']} same-batch steps"
        )
    return lines


def _calibrated_rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(out.glob("*/*/validation.json")):
        rows += json.loads(path.read_text())["models"]["calibrated"]["steps"]["rows"]
    return rows


def term_table(out: Path) -> list[str]:
    """Over every validation.json under ``out``: per step kind, the calibrated model's mean
    measured and predicted step and its terms (ms), pooled over runs weighted by step count;
    then the error by decode skew, and decode-only steps by batch size and by context."""
    pooled: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    rows = _calibrated_rows(out)
    for row in rows:
        kind = row["kind"]
        sums = pooled.setdefault(kind, {})
        counts[kind] = counts.get(kind, 0) + 1
        for key, value in [("measured", row["measured_s"]), ("predicted", row["predicted_s"])]:
            sums[key] = sums.get(key, 0.0) + value
        for key, value in row["terms"].items():
            sums[key] = sums.get(key, 0.0) + value
    lines = ["calibrated model on the engine's own steps, mean ms per step, all runs pooled:"]
    for kind, sums in pooled.items():
        n = counts[kind]
        parts = [f"{k} {1000 * v / n:.2f}" for k, v in sums.items() if v]
        lines.append(f"  {kind:<14} n={n:<6} " + ", ".join(parts))
    lines.append("calibrated step error by decode skew (steps with >= 2 decodes; skewed: the")
    lines.append(f"  longest context >= {validation.SKEWED_MAX_OVER_MEAN}x the mean), pooled:")
    for skew in validation.DECODE_SKEWS:
        picked = [r for r in rows if r.get("decode_skew") == skew]
        stats = validation.error_stats(
            [r["predicted_s"] for r in picked], [r["measured_s"] for r in picked]
        )
        lines.append(
            f"  {skew:<9} n={stats['n']:<6} median |error| {_pct(stats['median_abs_pct'])}%  "
            f"bias {_pct(stats['bias_pct'])}%"
        )
    lines += decode_breakdown(rows)
    return lines


def own_host_table(args: argparse.Namespace, out: Path, profile: str, command: str) -> list[str]:
    """Each run of ``out`` validated again from its saved engine run on its own host
    (``--host-slowdown measured``: its input preparation against the calibration's, on the
    clock the steps are on, ``fidelity/host_speed.py``): the host's slowdown and the
    calibrated model's TPOT and E2E error as is and on its own host, then their medians. With
    ``--own-host-only`` the saved runs are priced as is again too, by the same sources as on
    their own host (the saved ``validation.json`` may be older)."""
    lines = [
        "on the run's own host (its input preparation against the calibration's; calibrated "
        "model, median |error| %)",
        f"{'trace':<18}{'policy':<11}{'slowdown':>9}   TPOT as is, own    E2E as is, own",
    ]
    pairs: dict[str, list[tuple[float, float]]] = {"tpot": [], "e2e": []}
    for name in args.traces.split(","):
        trace = load_trace(ROOT / "traces" / "data" / f"{name}.csv")
        for policy in args.policies.split(","):
            path = out / name / policy / "validation.json"
            if not path.exists():
                continue
            result = json.loads(path.read_text())
            speed = result.get("host_speed") or {}
            if "slowdown" not in speed:
                lines.append(f"{name:<18}{policy:<11} not measured: {speed.get('error')}")
                continue
            config = build(
                ValidateConfig,
                policy=policy,
                max_requests=args.requests,
                measure_host_slowdown=True,
            )
            own = validate(
                trace,
                config,
                out / name / policy / "own-host",
                profile,
                replay_dir=result["engine_run"],
                command=command,
            )
            as_is = result
            if args.own_host_only:
                as_is = validate(
                    trace,
                    build(ValidateConfig, policy=policy, max_requests=args.requests),
                    out / name / policy / "as-is",
                    profile,
                    replay_dir=result["engine_run"],
                    command=command,
                )
            cells = ""
            for metric in ("tpot", "e2e"):
                before, after = (
                    r["models"]["calibrated"]["requests"]["metrics"][metric]["median_abs_pct"]
                    for r in (as_is, own)
                )
                pairs[metric].append((before, after))
                cells += f"   {before:6.1f} {after:6.1f}  "
            applied = (own.get("host_speed") or {}).get("applied", speed["slowdown"])
            lines.append(f"{name:<18}{policy:<11}{applied:9.3f}{cells}")
    if pairs["tpot"]:
        import numpy as np

        medians = {
            m: tuple(float(np.median([p[i] for p in v])) for i in (0, 1)) for m, v in pairs.items()
        }
        lines.append(
            f"  median over {len(pairs['tpot'])} runs: TPOT {medians['tpot'][0]:.2f} -> "
            f"{medians['tpot'][1]:.2f}, E2E {medians['e2e'][0]:.2f} -> {medians['e2e'][1]:.2f}"
        )
    return lines


SEQ_BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 10**9))
CONTEXT_BUCKETS = ((0, 255), (256, 1023), (1024, 10**9))


def decode_breakdown(rows: list[dict[str, Any]]) -> list[str]:
    """Decode-only steps pooled over runs: error by batch size and by mean context. A bias that
    moves with the context points at decode attention; one that moves with the batch size but
    not the context, at the per-token and per-sequence terms."""
    decode = [r for r in rows if r["kind"] == "decode-only"]
    lines = ["calibrated decode-only steps, pooled: median |error| and bias % by batch size and"]
    lines.append("  by mean context (tokens)")
    for label, key, buckets in (
        ("seqs", lambda r: r["num_seqs"], SEQ_BUCKETS),
        ("context", lambda r: r["sum_context"] / max(1, r["num_seqs"]), CONTEXT_BUCKETS),
    ):
        for low, high in buckets:
            picked = [r for r in decode if low <= key(r) <= high]
            stats = validation.error_stats(
                [r["predicted_s"] for r in picked], [r["measured_s"] for r in picked]
            )
            span = f"{low}+" if high >= 10**9 else f"{low}-{high}"
            lines.append(
                f"  {label:<8}{span:<10} n={stats['n']:<6} median |error| "
                f"{_pct(stats['median_abs_pct'])}%  bias {_pct(stats['bias_pct'])}%"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    if args.terms_only or args.tables_only:
        if args.tables_only:
            _print_saved_rows(args, out)
        print("\n".join(term_table(out)))
        return 0
    if args.own_host_only:
        if args.profile is None:
            print("validate_cpu.py: --own-host-only needs the runs' --profile", file=sys.stderr)
            return 2
        command = shlex.join(["python", "benchmarks/validate_cpu.py", *sys.argv[1:]])
        print(f"# {command}")
        print("\n".join(own_host_table(args, out, args.profile, command)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "benchmarks/validate_cpu.py", *sys.argv[1:]])
    print(f"# {command}")
    clock = resolve_clock(args.clock, "cpu", 1)
    print(f"# tiny-llama, CPU, one torch thread, clock {clock}; a shared, loaded 2-core machine")
    print(f"# load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    started = time.perf_counter()
    profile = args.profile
    if profile is None:
        profile = str(
            calibrate(
                "tiny-llama", "cpu", 16, out / "profile.json", command, progress=False, clock=clock
            )
        )
        print(f"# calibrated {profile} in {time.perf_counter() - started:.0f} s")
    else:
        print(f"# profile {profile}")
    print(f"# first {args.requests} requests of each trace, time scale {args.time_scale}")
    print(TABLE_LEGEND)
    print(HEADER)
    _validate_each(args, out, profile, clock, command)
    if not args.no_noise:
        for line in noise(ROOT / "traces" / "data" / "example.csv", args, out, clock):
            print(line)
    print("\n".join(term_table(out)))
    print("\n".join(own_host_table(args, out, profile, command)))
    wall, cpu = time.perf_counter() - started, time.process_time()
    print(f"# wall time {wall:.0f} s, CPU time {cpu:.0f} s")
    print(f"# load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    (out / "done.json").write_text(json.dumps({"command": command}) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/validate-cpu", help="where runs are written")
    parser.add_argument("--requests", type=int, default=8, help="first N requests per trace")
    parser.add_argument(
        "--noise-requests", type=int, default=40, help="first N requests of the twice-run check"
    )
    parser.add_argument(
        "--clock", default="auto", choices=CLOCK_CHOICES, help="calibration and engine clock"
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="arrival stretch")
    parser.add_argument("--profile", default=None, help="use this profile (default: calibrate)")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--no-noise", action="store_true", help="skip the twice-run check")
    parser.add_argument(
        "--terms-only", action="store_true", help="only print the term table of runs in --out"
    )
    parser.add_argument(
        "--own-host-only",
        action="store_true",
        help="only price the runs already in --out again on their own host (needs --profile)",
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="only print the error table and the term table of the runs already in --out",
    )
    return parser


def _print_saved_rows(args: argparse.Namespace, out: Path) -> None:
    """The error table of the runs already in ``out`` (``--tables-only``)."""
    print(f"# python benchmarks/validate_cpu.py {shlex.join(sys.argv[1:])}")
    print(TABLE_LEGEND + "\n" + HEADER)
    for name in args.traces.split(","):
        for policy in args.policies.split(","):
            path = out / name / policy / "validation.json"
            if path.exists():
                result = json.loads(path.read_text())
                for model_name in ("calibrated", "roofline"):
                    print(row(name, policy, model_name, result))


def _validate_each(
    args: argparse.Namespace, out: Path, profile: str, clock: str, command: str
) -> None:
    """Validate every trace of ``--traces`` under every policy of ``--policies``, printing
    each one's rows as it ends."""
    for name in args.traces.split(","):
        trace_path = ROOT / "traces" / "data" / f"{name}.csv"
        trace = load_trace(trace_path)
        for policy in args.policies.split(","):
            config = build(
                ValidateConfig,
                policy=policy,
                time_scale=args.time_scale,
                max_requests=args.requests,
                clock=clock,
            )
            result = validate(trace, config, out / name / policy, profile, command=command)
            for model_name in ("calibrated", "roofline"):
                print(row(name, policy, model_name, result), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
