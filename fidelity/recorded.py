"""The recorded H200 runs of servesim's engine (``../shared/gpu-runs/h200-2026-11-27``), validated
offline: each run against each recorded profile (``validate`` with ``--replay``), the two
profiles' predictions of the same steps and where the profiles differ, and the engine against
itself. Used by
``benchmarks/validate_recorded.py`` and the ``shared`` test that holds a budget on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fidelity import ttft_floor, validation
from fidelity.host_speed import group_slowdowns
from fidelity.profile_diff import profile_differences
from fidelity.replay_inputs import hardware_of, run_summary, trace_of
from fidelity.validate import cost_models, sim_config, validate
from fidelity.validate_config import ValidateConfig
from records.run_dir import load_run, run_file
from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes
from sim.costmodel.profile import load_profile
from traces.loaders import load_trace

RECORDED = Path("gpu-runs") / "h200-2026-11-27"
PROFILES = ("cal1", "cal2")
ENGINE_PAIRS = (
    ("example-chunked-run1", "example-chunked-run2"),
    ("example-chunked-run2", "example-chunked-run3"),
    ("example-chunked-run3", "example-chunked-run4"),
    ("shared_prefix-chunked-prefixcache-run1", "shared_prefix-chunked-prefixcache-run2"),
)
"""Runs of one configuration on the engine: how far it is from itself."""


def profile_path(root: Path, name: str) -> Path:
    return root / "profiles" / f"llama-3-8b-h200-{name}.json"


def validate_run(
    run_dir: Path,
    profile: Path,
    out: Path,
    floor_dir: Path | None = None,
    first_requests: bool = False,
    host_slowdown: float = 1.0,
) -> dict[str, Any]:
    """``python -m sim validate --replay run_dir [--replay floor_dir] --profile profile
    [--host-slowdown X]``, in process; ``first_requests``: the run replayed only the trace's
    first requests (as many as it served), as ``benchmarks/validate_cpu.py`` runs do."""
    summary = run_summary(run_dir)
    config = summary.get("config") or {}
    settings = ValidateConfig(
        model=str(config.get("model", "llama-3-8b")),
        device=str(config.get("device", "cuda")),
        hardware=hardware_of(str(summary.get("device_name", ""))),
        max_requests=len(load_run(run_dir).requests) if first_requests else None,
        host_slowdown=host_slowdown,
    )
    trace = load_trace(str(trace_of(run_dir, summary)))
    return validate(
        trace, settings, out, profile=str(profile), replay_dir=run_dir, floor_dir=floor_dir
    )


def _row(model: dict[str, Any]) -> dict[str, float]:
    metrics = model["requests"]["metrics"]
    row = {m: float(metrics[m]["median_abs_pct"]) for m in ("ttft", "tpot", "e2e")}
    row["steps"] = float(model["steps"]["all"]["median_abs_pct"])
    row["steps_bias"] = float(model["steps"]["all"]["bias_pct"])
    # The decode-only steps' slow tail (their total over the model's less the median step's),
    # and what is left of it without the steps whose preparation ran slow too.
    tail = model["tail"]
    row["decode_tail"] = float(tail.get("tail_pts", float("nan")))
    row["decode_tail_calm"] = float(tail.get("tail_without_hiccups_pts", float("nan")))
    # Beside the per-request TTFT error: its part after the wait for the step under way, the
    # TTFT distribution's error, and the prefill-heavy steps' error early in the run and later.
    row["ttft_rest"] = float(model["ttft_wait_split"]["rest_pct"])
    for name in ("median", "p90"):
        row[f"ttft_{name}_err"] = float(model["ttft_distribution"][name]["error_pct"])
    for phase in ("early", "rest"):
        stats = model["steps"]["by_phase"][phase]["prefill-heavy"]
        row[f"prefill_{phase}"] = float(stats["median_pct"]) if stats["n"] else float("nan")
    return row


def profiles_agree(root: Path, run_dir: Path, out: Path) -> float:
    """Median |cal1 - cal2| / cal2 (%) of the two profiles' predictions of ``run_dir``'s own
    engine steps."""
    steps = load_step_shapes(run_file(run_dir, STEP_SHAPES_FILE))
    settings = ValidateConfig(model="llama-3-8b", device="cuda", hardware="H200")
    predicted = []
    for name in PROFILES:
        run = sim_config(run_dir, settings, str(profile_path(root, name)))
        model = cost_models(run, "servesim-eager")["calibrated"]
        predicted.append(np.array([model.step_time_s(validation.shape_of(s)) for s in steps]))
    return float(100 * np.median(np.abs(predicted[0] - predicted[1]) / predicted[1]))


def engine_floor(root: Path) -> dict[str, dict[str, float]]:
    """The engine against itself: per-request median |difference| % of each pair's second run
    against its first."""
    out: dict[str, dict[str, float]] = {}
    for first, second in ENGINE_PAIRS:
        a, b = (load_run(root / "engine-runs" / name) for name in (first, second))
        errors = validation.request_errors(a.requests, b.requests)["metrics"]
        pair = {m: float(errors[m]["median_abs_pct"]) for m in ("ttft", "tpot", "e2e")}
        split = ttft_floor.wait_split(
            a.requests, _steps_of(root, first), b.requests, _steps_of(root, second)
        )
        pair["ttft_wait"], pair["ttft_rest"] = split["wait_pct"], split["rest_pct"]
        out[f"{second} vs {first}"] = pair
    return out


def _steps_of(root: Path, run: str) -> ttft_floor.Steps:
    return ttft_floor.engine_steps(
        load_step_shapes(run_file(root / "engine-runs" / run, STEP_SHAPES_FILE))
    )


def recorded_slowdowns(root: Path) -> dict[str, float]:
    """Each recorded run's host against the fastest of the runs of its configuration (the
    folder name up to ``-runN``), from their input preparation (``host_speed.group_slowdowns``;
    a configuration run once is its own reference)."""
    groups: dict[str, dict[str, Any]] = {}
    for run_dir in sorted(p for p in (root / "engine-runs").iterdir() if p.is_dir()):
        steps = load_step_shapes(run_file(run_dir, STEP_SHAPES_FILE))
        groups.setdefault(run_dir.name.rsplit("-run", 1)[0], {})[run_dir.name] = steps
    return {run: s for runs in groups.values() for run, s in group_slowdowns(runs).items()}


def recorded_runs(root: Path, out: Path, wanted: list[str] | None = None) -> dict[str, Any]:
    """Every recorded run (or those ``wanted``) against each profile, with the roofline; and
    again on the run's own host where it was slower than its configuration's fastest
    (``recorded_slowdowns``)."""
    runs = sorted(p.name for p in (root / "engine-runs").iterdir() if p.is_dir())
    if wanted is not None:
        runs = [r for r in runs if r in wanted]
    slowdowns = recorded_slowdowns(root)
    figures: dict[str, Any] = {
        "runs": {},
        "host_slowdown": {run: slowdowns[run] for run in runs},
        "on_own_host": {},
        "profiles_agree": {},
        "engine_floor": {},
        "ttft_phase_floor": {},
    }
    for run in runs:
        run_dir = root / "engine-runs" / run
        rows: dict[str, dict[str, float]] = {}
        adjusted: dict[str, dict[str, float]] = {}
        for name in PROFILES:
            result = validate_run(run_dir, profile_path(root, name), out / run / name)
            rows[name] = _row(result["models"]["calibrated"])
            rows.setdefault("roofline", _row(result["models"]["roofline"]))
            figures["ttft_phase_floor"][run] = result["ttft_phase_floor"]
            if slowdowns[run] != 1.0:
                result = validate_run(
                    run_dir, profile_path(root, name), out / run / f"{name}-own-host",
                    host_slowdown=slowdowns[run],
                )  # fmt: skip
                adjusted[name] = _row(result["models"]["calibrated"])
                adjusted.setdefault("roofline", _row(result["models"]["roofline"]))
        figures["runs"][run] = rows
        figures["on_own_host"][run] = adjusted or rows
        figures["profiles_agree"][run] = profiles_agree(root, run_dir, out)
    figures["engine_floor"] = engine_floor(root)
    first, second = (load_profile(profile_path(root, name)) for name in PROFILES)
    figures["profiles_differ"] = profile_differences(first, second)
    return figures
