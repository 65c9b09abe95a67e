"""Calibration: time the real engine's parts (``engine.profiling``) and write them as a
cost-model profile (docs/profile_format.md, version 4) that the simulator loads."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.model.presets import load_model_spec
from core.settings import build
from engine import profiling
from engine.llm_engine import EngineConfig
from fidelity.clocks import resolve_clock
from fidelity.decode_rule import apply_rule_by_steps
from sim.costmodel.profile import DECODE_CONTEXT_RULES, FORMAT_VERSION, load_profile


def profile_payload(measured: Any, model: str, block_size: int, command: str) -> dict[str, Any]:
    """The profile file's content from ``engine.profiling.Measurements``."""
    ops: dict[str, Any] = {}
    axes_1d = {
        "linear": "num_tokens",
        "elementwise": "num_tokens",
        "store_kv": "num_bytes",
        "lm_head": "num_seqs",
        "copy_blocks": "num_bytes",
        "swap_out": "num_bytes",
        "swap_in": "num_bytes",
        "prepare": "num_seqs",
    }
    spreads = getattr(measured, "spreads", {})
    for name, (xs, times) in measured.tables_1d.items():
        ops[name] = {axes_1d[name]: xs, "time_s": times}
        if name in spreads:
            ops[name]["spread_s"] = spreads[name]
    axes_2d = {
        "decode_attention": ("num_seqs", "context_tokens"),
        "decode_attention_graph": ("num_seqs", "context_tokens"),
        "prefill_attention": ("num_query_tokens", "num_context_tokens"),
    }
    for name, (xs, ys, rows) in measured.tables_2d.items():
        first, second = axes_2d[name]
        ops[name] = {first: xs, second: ys, "time_s": rows}
        if name in spreads:
            ops[name]["spread_s"] = spreads[name]
    rule, checks = measured.decode_attention_context, list(measured.decode_checks)
    if checks:
        rule, checks = choose_decode_rule(checks)
    return {
        "format_version": FORMAT_VERSION,
        "device": measured.device,
        "software": measured.software,
        "command": command,
        "model": model,
        "tp": 1,
        "block_size": block_size,
        "decode_attention_context": rule,
        "decode_attention_checks": checks,
        "timer": measured.timer,
        "tables_time": getattr(measured, "tables_time", "span"),
        "commit": source_commit(),
        "engine": measured.engine,
        "grid": measured.grid,
        "ops": ops,
        "steps": measured.steps,
        # The engine's whole steps over the calibration grid: every term is fitted to them.
        "step_fit": "joint" if measured.steps else "overhead",
    }


def calibrate(
    model: str,
    device: str,
    block_size: int,
    out: str | Path,
    command: str,
    small: bool = False,
    progress: bool = True,
    cpu_threads: int = 1,
    clock: str = "auto",
    enforce_eager: bool = False,
    mixed_graphs: str = "off",
) -> Path:
    """Time ``model``'s engine on ``device`` and write the profile to ``out``. ``clock`` is
    the CPU's timer (``resolve_clock``); a GPU is timed with CUDA events. ``enforce_eager``
    turns the engine's CUDA graphs off (where it has them); ``mixed_graphs`` "piecewise" runs
    its steps with a prompt chunk on piecewise graphs (``EngineConfig.mixed_graphs``)."""
    grid = profiling.SMALL_GRID if small else profiling.CalibrationGrid()
    config = build(
        EngineConfig,
        {
            "model": model,
            "device": device,
            "block_size": block_size,
            "weights": "random",
            "cpu_threads": cpu_threads,
            "clock": resolve_clock(clock, device, cpu_threads),
            # A host cache, so that swaps each way can be timed (a quarter GiB is enough).
            "preemption_mode": "swap",
            "swap_space_gib": 0.25,
            "enforce_eager": enforce_eager,
            "mixed_graphs": mixed_graphs,
        },
    )
    bar = tqdm(
        total=profiling.point_count(grid), unit="op", disable=not (progress and sys.stderr.isatty())
    )

    def tick(label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update(1)

    measured = profiling.measure(config, grid, on_point=tick)
    bar.close()
    path = Path(out)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    name = _model_name(model)
    payload = profile_payload(measured, name, block_size, command)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    if device.split(":")[0] == "cpu" and apply_rule_by_steps(path) is not None:
        payload = json.loads(path.read_text())  # the decode rule its whole steps chose
    payload.update(step_fit_report(path, device))
    path.write_text(json.dumps(payload, indent=1) + "\n")
    load_profile(path)  # what we wrote must read back
    return path


def source_commit() -> str | None:
    """The git commit of the sources calibrated (None outside a git checkout)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def step_fit_report(path: Path, device: str) -> dict[str, Any]:
    """What the profile's whole steps say of it, to store in it: on a GPU the host clock
    fitted to them (``host``, then used as stored); on any device each step's residual
    ((measured - predicted) / predicted) under the profile's own model, and their median."""
    from fidelity.profile_check import fitted_model

    model, host = fitted_model(path, device)
    report: dict[str, Any] = {}
    if host is not None:
        report["host"] = host
    residuals = model.residuals()
    report["step_residuals"] = [round(r, 6) for r in residuals]
    finite = sorted(abs(r) for r in residuals)
    report["step_spread"] = finite[len(finite) // 2] if finite else None
    return report


def choose_decode_rule(checks: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The decode-attention context rule whose predictions come closest to the measured skewed
    batches (least summed |log(predicted / measured)|), each rule predicting from the uniform
    batches timed beside the check: ``mean`` the batch at its mean context, ``max`` at its
    longest, ``per_sequence`` the mean over its sequences of the batch at each one's context.
    Returns the rule and the checks as the profile stores them (with each prediction)."""
    scored = []
    for check in checks:
        contexts, uniform = check["context_tokens"], check["uniform_time_s"]
        at = check["uniform_context_tokens"]
        num_short = sum(1 for c in contexts if c == at["short"])
        per_sequence = (
            num_short * uniform["short"] + (len(contexts) - num_short) * uniform["long"]
        ) / len(contexts)
        scored.append(
            {
                "context_tokens": contexts,
                "time_s": check["time_s"],
                "predicted_mean_s": uniform["mean"],
                "predicted_max_s": uniform["long"],
                "predicted_per_sequence_s": per_sequence,
            }
        )

    def misfit(rule: str) -> float:
        return sum(
            abs(math.log(c[f"predicted_{rule}_s"] / c["time_s"]))
            for c in scored
            if c["time_s"] > 0 and c[f"predicted_{rule}_s"] > 0
        )

    return min(DECODE_CONTEXT_RULES, key=misfit), scored


def _model_name(model: str) -> str:
    """The ``ModelSpec.name`` the simulator will know this model by."""
    return load_model_spec(model).name
