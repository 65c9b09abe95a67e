"""Our error against real vLLM runs: each run in ../shared/vllm-runs/llmservingsim (vLLM 0.19.0,
300 ShareGPT requests at ~10 req/s; skipped when absent) is imported and replayed with its own
settings (chunked prefill, its token budget and max_num_seqs, prefix caching on the real token
ids, the GPU its config.json describes, vLLM's KV capacity rule as those runs record no block
count). Prints the per-request median and p90 absolute error and the bias of TTFT, TPOT and E2E,
makespan and output tokens/s, for the analytic roofline and for any profile given, plus the
roofline's term breakdown of a typical decode step and a typical mixed step, to show which term
carries the error.

``--what-if FIELD=VALUE[,FIELD=VALUE]`` adds a replay with those CostModelConfig or HardwareSpec
fields changed (the kernel efficiencies are HardwareSpec fields): a diagnosis of which term
carries the error, not a calibrated result. Reverting one change at a time this way shows its
effect: ``async_scheduling=0`` (the host's work added to every step, as before vLLM 0.14), or
the preset's PCIe link in place of the one the run's config.json states.

Run from the repository root:
PYTHONPATH=. python benchmarks/measured_vllm.py [--runs DIR] [--profile RUN=PROFILE.json ...]
    [--what-if attention_bandwidth_efficiency=0.9 ...]
(results committed in benchmarks/results/measured_vllm.txt)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from core.model.presets import load_model_spec
from fidelity.cli.measured import replay_config, validate_run
from fidelity.measured import write_measured_run
from fidelity.measured_importers import import_llmservingsim
from records.compare import Comparison
from records.run_dir import load_run
from sim.costmodel.base import TERMS, CostModelConfig, StepShape
from sim.costmodel.roofline import RooflineCostModel
from sim.run import RunConfig, RunResult
from sim.specs.hardware import HardwareSpec
from sim.specs.hardware_file import load_hardware

RUNS = Path(__file__).resolve().parents[1].parent / "shared" / "vllm-runs" / "llmservingsim"
METRICS = ("TTFT", "TPOT", "E2E")
# The targets for the analytic model: median per-request error.
TARGET_PCT = {"TTFT": 20.0, "TPOT": 10.0, "E2E": 10.0}


def _row(
    label: str,
    comparison: Comparison,
    measured: dict[str, float],
    result: RunResult,
    judge: bool = True,
) -> str:
    """One replay's errors; ``judge`` marks each median against the issue's target."""
    errors = comparison.by_metric()
    cells = []
    for metric in METRICS:
        e = errors[metric]
        hit = ("ok" if e.median_abs_pct <= TARGET_PCT[metric] else "MISS") if judge else ""
        cells.append(
            f"{metric} {e.median_abs_pct:5.1f}% / {e.p90_abs_pct:5.1f}% / {e.bias_pct:+6.1f}% {hit}"
        )
    sim = result.summary
    return (
        f"  {label:<10} " + " | ".join(cells) + f" | makespan {measured['duration_s']:.1f} -> "
        f"{sim['duration_s']:.1f} s | out tok/s {measured['output_throughput']:.0f} -> "
        f"{sim['output_throughput']:.0f}"
    )


def _breakdown(config: RunConfig, result: RunResult) -> list[str]:
    """Roofline terms (ms) of a decode step at the run's mean decode batch and context, and of
    a full-budget mixed step (one prefill chunk beside that many decodes)."""
    model = load_model_spec(config.model)
    hardware = load_hardware(config.hardware)
    cost = RooflineCostModel(model, hardware, config.tp, block_size=config.cache.block_size)
    steps = result.steps.to_frame()
    decode = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_tokens"] > 0)]
    per_step = decode["num_decode_tokens"] / decode["num_steps"]
    batch = max(1, round(float(np.average(per_step, weights=decode["num_steps"]))))
    frame = result.requests_frame()
    context = int(frame["prompt_tokens"].mean() + frame["output_tokens"].mean() / 2)
    budget = config.scheduler.max_num_batched_tokens
    shapes = {
        f"decode x{batch} (ctx {context})": StepShape(
            prefill_chunks=(), decode_context_tokens=(context,) * batch
        ),
        f"mixed {budget - batch}+{batch}": StepShape(
            prefill_chunks=((budget - batch, context // 2),),
            decode_context_tokens=(context,) * batch,
        ),
    }
    lines = []
    for name, shape in shapes.items():
        terms = cost.step_breakdown(shape)
        total = sum(terms.values())
        parts = ", ".join(f"{t} {terms[t] * 1e3:.2f}" for t in TERMS if terms[t] > 0)
        lines.append(f"    {name}: {total * 1e3:.2f} ms = {parts}")
    return lines


def _phases(run_dir: Path, measured: pd.DataFrame, result: RunResult) -> list[str]:
    """Two views apart from queueing: the first request, alone on the GPU (its TTFT is one
    prefill, chunked by the budget), and the saturated phase (>= max_num_seqs - 1 running, all
    decoding in every step), whose measured step is the running count over the generated
    tokens per second of the run's timeseries.csv."""
    sim = result.requests_frame().set_index("request_id")
    first = measured.sort_values("arrival_s").iloc[0]
    lines = [
        f"    first request alone ({int(first['prompt_tokens'])} prompt tokens): TTFT "
        f"{first['ttft_ms']:.1f} ms measured, {sim.loc[first['request_id'], 'ttft_ms']:.1f} "
        "simulated"
    ]
    series_path = run_dir / "timeseries.csv"
    if series_path.exists():
        series = pd.read_csv(series_path)
        cap = series["running"].max()
        full = series[series["running"] >= cap - 1]
        steps = result.steps.to_frame()
        busy = steps[steps["num_running"] >= cap - 1]
        if len(full) and busy["num_steps"].sum():
            measured_ms = 1e3 * full["running"].mean() / full["gen_throughput"].mean()
            sim_ms = 1e3 * busy["duration_s"].sum() / busy["num_steps"].sum()
            error = sim_ms / measured_ms - 1
            lines.append(
                f"    saturated ({len(full)} s at >= {cap - 1:.0f} running): mean step "
                f"{measured_ms:.1f} ms measured, {sim_ms:.1f} simulated ({error:+.1%})"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RUNS, help="LLMServingSim runs folder")
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="RUN=PROFILE",
        help="also replay run RUN (its folder name) with this calibrated profile",
    )
    parser.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="FIELD=VALUE[,FIELD=VALUE]",
        help="also replay with these CostModelConfig/HardwareSpec fields changed (diagnosis only)",
    )
    args = parser.parse_args()
    what_ifs = {item: _cost_config(item) for item in args.what_if}
    if not args.runs.is_dir():
        print(f"skipped: {args.runs} is absent (the measured runs live in ../shared)")
        return 0
    profiles = dict(item.split("=", 1) for item in args.profile)
    print(f"python {platform.python_version()} on {platform.machine()}; runs from {args.runs}")
    print("per metric: median |err| / p90 |err| / bias (median signed, + = simulated slower);")
    print(f"targets (median, analytic): {TARGET_PCT}; what-if rows are diagnosis (values chosen")
    print("after seeing these runs), not judged against the targets")
    for run_dir in sorted(p for p in args.runs.iterdir() if (p / "meta.json").exists()):
        with tempfile.TemporaryDirectory() as tmp:
            out = write_measured_run(import_llmservingsim(run_dir), Path(tmp) / run_dir.name)
            measured = load_run(out).summary
            config = replay_config(out, RunConfig())
            start = time.perf_counter()
            comparison, result = validate_run(out, config)
            wall_s = time.perf_counter() - start
            print(
                f"\n{run_dir.name}: {config.model} on {load_hardware(config.hardware).name} "
                f"x{config.tp}, {result.num_blocks} KV blocks/rank, budget "
                f"{config.scheduler.max_num_batched_tokens}, max_num_seqs "
                f"{config.scheduler.max_num_seqs}, prefix "
                f"hit rate {result.summary['prefix_hit_rate']:.1%} (replay {wall_s:.1f} s wall)"
            )
            print(_row("analytic", comparison, measured, result))
            if run_dir.name in profiles:
                profiled = dataclasses.replace(config, profile=profiles[run_dir.name])
                comparison, presult = validate_run(out, profiled)
                print(_row("profile", comparison, measured, presult))
            for label, (cost_config, hardware_changes) in what_ifs.items():
                wconfig = _with_hardware(config, hardware_changes, Path(tmp) / "hardware.json")
                comparison, wresult = validate_run(out, wconfig, cost_config)
                print(_row("what-if", comparison, measured, wresult, judge=False) + f" | {label}")
            print("  per step, apart from queueing (analytic):")
            print("\n".join(_phases(run_dir, load_run(out).requests, result)))
            print("  roofline terms (ms):")
            print("\n".join(_breakdown(config, result)))
    return 0


def _cost_config(text: str) -> tuple[CostModelConfig, dict[str, float]]:
    """The CostModelConfig and the HardwareSpec changes one --what-if names."""
    changes, hardware = {}, {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not value:
            raise SystemExit(f"error: --what-if {item!r}: expected field=value")
        if name == "async_scheduling":
            changes[name] = value.lower() in ("1", "true", "yes")
        elif name in CostModelConfig.__dataclass_fields__:
            changes[name] = float(value)
        elif name in HardwareSpec.__dataclass_fields__ and name != "name":
            hardware[name] = float(value)
        else:
            raise SystemExit(
                f"error: --what-if {item!r}: expected a CostModelConfig or HardwareSpec field"
            )
    return CostModelConfig(**changes), hardware


def _with_hardware(config: RunConfig, changes: dict[str, float], path: Path) -> RunConfig:
    """`config` on its hardware with `changes`, written as a hardware file at `path`."""
    if not changes:
        return config
    spec = dataclasses.replace(load_hardware(config.hardware), **changes)  # type: ignore[arg-type]
    path.write_text(json.dumps(dataclasses.asdict(spec)))
    return dataclasses.replace(config, hardware=str(path))


if __name__ == "__main__":
    sys.exit(main())
