"""``python -m sim calibrate``: time the real engine's parts (``engine.profiling``, imported
only here, inside the command, so ``python -m sim`` runs without torch) and write them as a
cost-model profile (docs/profile_format.md, version 4)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from sim.profile import DECODE_CONTEXT_RULES, FORMAT_VERSION, load_profile


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
    for name, (xs, times) in measured.tables_1d.items():
        ops[name] = {axes_1d[name]: xs, "time_s": times}
    axes_2d = {
        "decode_attention": ("num_seqs", "context_tokens"),
        "prefill_attention": ("num_query_tokens", "num_context_tokens"),
    }
    for name, (xs, ys, rows) in measured.tables_2d.items():
        first, second = axes_2d[name]
        ops[name] = {first: xs, second: ys, "time_s": rows}
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
) -> Path:
    """Time ``model``'s engine on ``device`` and write the profile to ``out``. ``clock`` is
    the CPU's timer (``resolve_clock``); a GPU is timed with CUDA events."""
    from tqdm import tqdm

    # Through importlib: the simulator's type checks stop at the engine's torch side.
    try:
        llm_engine = importlib.import_module("engine.llm_engine")
        profiling = importlib.import_module("engine.profiling")
    except ImportError as error:
        raise ValueError(f"calibrate needs the engine (torch): {error}") from error
    grid = profiling.SMALL_GRID if small else profiling.CalibrationGrid()
    config = llm_engine.EngineConfig(
        model=model,
        device=device,
        block_size=block_size,
        weights="random",
        cpu_threads=cpu_threads,
        clock=resolve_clock(clock, device, cpu_threads),
        # A host cache, so that swaps each way can be timed (a quarter GiB is enough).
        preemption_mode="swap",
        swap_space_gib=0.25,
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
    load_profile(path)  # what we wrote must read back
    return path


def choose_decode_rule(checks: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The decode-attention context rule whose predictions come closest to the measured skewed
    batches (least summed |log(predicted / measured)|), each rule predicting from the uniform
    batches timed beside the check: ``mean`` the batch at its mean context, ``max`` at its
    longest, ``per_sequence`` the mean over its sequences of the batch at each one's context.
    Returns the rule and the checks as the profile stores them (with each prediction)."""
    import math

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


CLOCK_CHOICES = ("auto", "wall", "cpu")
CLOCK_HELP = (
    "how CPU time is measured: cpu = the engine thread's CPU time (time.thread_time), which a "
    "loaded machine's waits for a core do not inflate; wall = the wall clock; auto = cpu on a "
    "CPU device with one torch thread, wall otherwise (a GPU always times with CUDA events "
    "and runs on the wall clock)"
)


def resolve_clock(clock: str, device: str, cpu_threads: int) -> str:
    """``auto`` is ``cpu`` on a CPU device with one torch thread, else ``wall``."""
    if clock not in CLOCK_CHOICES:
        raise ValueError(f"clock must be one of {CLOCK_CHOICES}, got {clock!r}")
    if clock != "auto":
        return clock
    return "cpu" if device == "cpu" and cpu_threads == 1 else "wall"


def _model_name(model: str) -> str:
    """The ``ModelSpec.name`` the simulator will know this model by."""
    from sim.run import load_model

    return load_model(model).name


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="tiny-llama",
        help="engine model preset or Hugging Face directory (default: %(default)s)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--block-size", type=int, default=16, help="KV block size in tokens (default: %(default)s)"
    )
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument(
        "--small-grid", action="store_true", help="a tiny grid (for tests; seconds on CPU)"
    )
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=1,
        help="torch threads on CPU, as the engine runs (default: %(default)s)",
    )
    parser.add_argument("--clock", default="auto", choices=CLOCK_CHOICES, help=CLOCK_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run_calibrate(args: argparse.Namespace) -> int:
    import shlex

    if args.block_size <= 0:
        raise ValueError(f"--block-size must be positive, got {args.block_size}")
    command = shlex.join(["python", "-m", "sim", *getattr(args, "argv", sys.argv[1:])])
    path = calibrate(
        args.model,
        args.device,
        args.block_size,
        args.out,
        command,
        small=args.small_grid,
        progress=not args.quiet,
        cpu_threads=args.cpu_threads,
        clock=args.clock,
    )
    if not args.quiet:
        print(f"wrote profile {path}")
    return 0
