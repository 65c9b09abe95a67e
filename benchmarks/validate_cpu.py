"""The simulator against the real engine on CPU: tiny-llama over the bundled traces under every
policy (the first --requests requests of each), with a profile calibrated in the same run (or
--profile), and the analytic roofline beside it. Prints the error table, then the run-to-run
noise of the engine itself (the same configuration replayed twice).

    python benchmarks/validate_cpu.py --out runs/validate-cpu > benchmarks/results/validate_cpu.txt

Targets (issue 11): median |error| <= 5% on TPOT and E2E, <= 10% on TTFT; the cost model's
step-time error on the engine's own batches <= 3%.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from records.run_dir import load_run  # noqa: E402
from sim import validation  # noqa: E402
from sim.calibrate import calibrate  # noqa: E402
from sim.validate import ValidateConfig, subset, validate  # noqa: E402
from traces.loaders import load_trace  # noqa: E402

TRACES = ("example", "bursty", "shared_prefix", "parallel_sampling")
POLICIES = ("static", "dynamic", "continuous", "chunked")
METRICS = ("ttft", "tpot", "itl", "e2e")


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{value:6.1f}"


def row(trace: str, policy: str, name: str, model: dict[str, Any]) -> str:
    metrics = model["requests"]["metrics"]
    cells = [_pct(metrics.get(m, {}).get("median_abs_pct")) for m in METRICS]
    steps = model["steps"]
    kinds = [_pct(steps["by_kind"][k]["median_abs_pct"]) for k in validation.STEP_KINDS]
    div = model["divergence"]["num_identical_steps"]
    return (
        f"{trace:<18}{policy:<11}{name:<11}" + " ".join(cells) + " |"
        + _pct(steps["all"]["median_abs_pct"]) + _pct(steps["all"]["bias_pct"]) + " |"
        + " ".join(kinds) + f" | {div:>4}/{model['num_engine_steps']}"
    )  # fmt: skip


HEADER = (
    f"{'trace':<18}{'policy':<11}{'model':<11}"
    + "  TTFT   TPOT    ITL    E2E | step  bias | prefill decode  mixed | same steps"
)


def noise(trace_path: Path, args: argparse.Namespace, out: Path) -> list[str]:
    """The engine twice on one configuration: per-request differences between the runs."""
    from engine.llm_engine import EngineConfig
    from engine.replay import ReplayConfig, replay

    trace = subset(load_trace(trace_path), args.requests, 1.0)
    dirs = []
    for attempt in (1, 2):
        engine = EngineConfig(model="tiny-llama", weights="random", policy="chunked")
        result = replay(trace, ReplayConfig(engine=engine, time_scale=args.time_scale))
        result.write(out / f"noise-{attempt}")
        dirs.append(out / f"noise-{attempt}")
    first, second = (load_run(d) for d in dirs)
    errors = validation.request_errors(first.requests, second.requests)
    lines = [f"run-to-run noise: {trace.name}, chunked, engine run twice (second vs first)"]
    for metric, stats in errors["metrics"].items():
        lines.append(
            f"  {metric.upper():<5} median |diff| {_pct(stats['median_abs_pct'])}%  "
            f"p90 {_pct(stats['p90_abs_pct'])}%  bias {_pct(stats['bias_pct'])}%"
        )
    return lines


def term_table(out: Path) -> list[str]:
    """Over every validation.json under ``out``: per step kind, the calibrated model's mean
    measured and predicted step and its terms (ms), pooled over runs weighted by step count."""
    pooled: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for path in sorted(out.glob("*/*/validation.json")):
        model = json.loads(path.read_text())["models"]["calibrated"]
        for row in model["steps"]["rows"]:
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
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/validate-cpu", help="where runs are written")
    parser.add_argument("--requests", type=int, default=8, help="first N requests per trace")
    parser.add_argument("--time-scale", type=float, default=1.0, help="arrival stretch")
    parser.add_argument("--profile", default=None, help="use this profile (default: calibrate)")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--no-noise", action="store_true", help="skip the twice-run check")
    parser.add_argument(
        "--terms-only", action="store_true", help="only print the term table of runs in --out"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.terms_only:
        print("\n".join(term_table(out)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "benchmarks/validate_cpu.py", *sys.argv[1:]])
    print(f"# {command}")
    print("# tiny-llama, CPU, one torch thread; a shared, loaded 2-core machine")
    started = time.perf_counter()
    profile = args.profile
    if profile is None:
        profile = str(
            calibrate("tiny-llama", "cpu", 16, out / "profile.json", command, progress=False)
        )
        print(f"# calibrated {profile} in {time.perf_counter() - started:.0f} s")
    else:
        print(f"# profile {profile}")
    print(f"# first {args.requests} requests of each trace, time scale {args.time_scale}")
    print("# median |error| % per request; cost model on the engine's own steps: median |error|")
    print("# and bias %, median |error| by batch shape; steps whose batches match the engine's")
    print(HEADER)
    for name in args.traces.split(","):
        trace_path = ROOT / "traces" / "data" / f"{name}.csv"
        trace = load_trace(trace_path)
        for policy in args.policies.split(","):
            config = ValidateConfig(
                policy=policy,
                time_scale=args.time_scale,
                max_requests=args.requests,
            )
            result = validate(trace, config, out / name / policy, profile, command=command)
            for model_name in ("calibrated", "roofline"):
                print(row(name, policy, model_name, result["models"][model_name]), flush=True)
    if not args.no_noise:
        for line in noise(ROOT / "traces" / "data" / "example.csv", args, out):
            print(line)
    print("\n".join(term_table(out)))
    print(f"# wall time {time.perf_counter() - started:.0f} s")
    (out / "done.json").write_text(json.dumps({"command": command}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
