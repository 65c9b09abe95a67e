"""``python -m sim validate``'s options, handler and error table; the validation itself is
``fidelity.validate`` (it needs the engine, so torch), imported when the command runs. Also
issue 16's spelling, ``validate --measured RUN_DIR``, which ``fidelity.cli`` rewrites to
``measured validate`` before parsing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.config import LAYOUT_SETTINGS, CacheConfig, SchedulerConfig
from core.flags import add_setting_flags, given_settings
from core.settings import build
from fidelity.cli.engine_import import needs_engine
from fidelity.cli.replay_checks import check_replay_options, check_rerun
from fidelity.clocks import CLOCK_CHOICES, CLOCK_HELP
from fidelity.replay_inputs import hardware_of, run_summary, trace_of
from fidelity.validate_config import VALIDATION_FILE, ValidateConfig
from sim.specs.hardware_file import load_hardware


def _metric_cells(metrics: dict[str, Any]) -> list[str]:
    parts = []
    for metric, stats in metrics.items():
        if stats["median_abs_pct"] is None:
            continue
        parts.append(
            f"{metric.upper()} {stats['median_abs_pct']:.1f}% (p90 {stats['p90_abs_pct']:.1f}%,"
            f" bias {stats['bias_pct']:+.1f}%)"
        )
    return parts


def print_context(result: dict[str, Any], file: Any = sys.stdout) -> None:
    """What was compared: the engine kind and its decode split, the profile's own spread, the
    engine's floor."""
    print(
        f"validation of {result['trace']} ({result['num_requests']} requests); engine "
        f"{result.get('engine_kind', 'servesim-eager')}, clock {result.get('engine_clock', 'wall')}"
        f", decode split {result.get('decode_split', 'fixed')}"
        f", profile timer {result.get('profile_timer')}",
        file=file,
    )
    spread = result.get("profile_spread") or {}
    if "steps_spread_pct" in spread:
        print(
            f"  profile: GPU time from the {spread['gpu_clock']}"
            + (
                f" x{spread['device_scale']:.3f} (as its steps the GPU set the pace of ran)"
                if spread.get("device_scale", 1.0) != 1.0
                else ""
            )
            + f"; its whole steps scatter "
            f"{spread['steps_spread_pct']:.1f}% (median) around its host fit over "
            f"{spread['num_steps']} steps, {spread['num_episode_steps']} left out as slow "
            f"episodes (outside load), {spread['num_stalls']} lone slow steps counted as stalls",
            file=file,
        )
        share = spread["num_episode_steps"] / max(1, spread["num_steps"])
        if share > LOADED_SHARE:
            print(
                f"  profile: WARNING: {100 * share:.0f}% of its whole steps ran slow for a while "
                "together: the machine was loaded during the calibration, and its fit rests on "
                "the rest; calibrate again (sim calibrate --repeat 2 says how far two agree)",
                file=file,
            )
    if "table_spread_pct" in spread:
        print(
            f"  profile: table points spread {spread['table_spread_pct']:.1f}% (median)", file=file
        )
    speed = result.get("host_speed") or {}
    if "slowdown" in speed:
        print(
            f"  the run's host against the calibration's {_speed_text(speed)}; priced at "
            f"{speed['applied']:.3f}x (--host-slowdown)",
            file=file,
        )
        share = speed.get("core_share")
        if share is not None and share < 0.9:
            print(
                f"  the engine thread was on a core {100 * share:.0f}% of each step's wall time "
                "(median): the machine was shared, which the preparation does not measure",
                file=file,
            )
    elif speed.get("applied", 1.0) != 1.0:
        print(f"  the run's host priced at {speed['applied']:.3f}x (--host-slowdown)", file=file)
    floor = result.get("engine_floor")
    if floor:
        parts = _metric_cells(floor["requests"]["metrics"])
        print(
            "  engine against itself (the noise floor), per request, median |difference|: "
            + "; ".join(parts)
            + f"; median step {100 * (floor['median_step_ratio'] - 1):+.1f}%",
            file=file,
        )
        if "ttft_wait_split" in floor:
            print(
                f"  engine against itself, {_split_text(floor['ttft_wait_split'], 'difference')}",
                file=file,
            )
        speed = floor.get("host_speed")
        if isinstance(speed, dict):
            print(
                f"  the second run's host against the first's {_speed_text(speed)} "
                "(--host-slowdown prices a run on its own host)",
                file=file,
            )
        elif speed:
            print(f"  host speed not measured: {speed}", file=file)
    gap = result.get("engine_loop_gap") or {}
    if gap.get("gap_s") is not None:
        print(
            f"  the engine's loop between steps, which no step holds and the simulator does not "
            f"price: median {1e6 * gap['gap_s']:.0f} us a step, {gap['share_pct']:.2f}% of its "
            f"median step ({gap['back_to_back']} of {gap['num_steps']} steps back to back)",
            file=file,
        )
    phase = result.get("ttft_phase_floor") or {}
    if phase.get("median_pct") is not None:
        print(
            f"  TTFT step-phase floor (from the engine run alone): a request waits for the step "
            f"under way (median {phase['median_step_ms']:.1f} ms; median TTFT "
            f"{phase['median_ttft_ms']:.1f} ms), a wait that independent step boundaries draw "
            f"apart: median per-request |difference| {phase['median_pct']:.1f}% (median of "
            f"E|difference|/TTFT {phase['expected_pct']:.1f}%)",
            file=file,
        )


def _split_text(split: dict[str, Any], word: str = "error") -> str:
    """The per-request TTFT error cut into the wait for the step under way and the rest."""
    if split.get("ttft_pct") is None:
        return "TTFT split: no requests"
    return (
        f"TTFT per request, median |{word}| {split['ttft_pct']:.1f}%: the wait for the step "
        f"under way at arrival {split['wait_pct']:.1f}%, the rest {split['rest_pct']:.1f}%"
    )


def _distribution_text(dist: dict[str, Any]) -> str:
    """The TTFT distribution's error (not per request)."""
    cells = [
        f"{name} {dist[name]['predicted']:.1f} vs {dist[name]['measured']:.1f} ms "
        f"({dist[name]['error_pct']:+.1f}%)"
        for name in ("median", "p90")
        if dist.get(name) and dist[name]["error_pct"] is not None
    ]
    return "TTFT distribution (not per request), predicted vs measured: " + ", ".join(cells)


def _phase_text(by_phase: dict[str, Any]) -> str:
    """Median signed step error by run phase and step kind."""
    cells = []
    for kind in ("prefill-heavy", "decode-only"):
        early, rest = by_phase["early"][kind], by_phase["rest"][kind]
        if early["n"] and rest["n"]:
            cells.append(
                f"{kind} {early['median_pct']:+.1f}% (n={early['n']}) then "
                f"{rest['median_pct']:+.1f}% (n={rest['n']})"
            )
    return "engine's own steps, median signed error, first fifth then the rest: " + "; ".join(cells)


def _batch_text(by_batch: dict[str, dict[str, Any]]) -> str:
    """The decode-only steps by batch size: each group's median signed error, its median
    measured - priced in microseconds, and its steps."""
    cells = [
        f"{label}: {s['median_pct']:+.1f}% {1e6 * s['median_residual_s']:+.0f} us ({s['n']})"
        for label, s in by_batch.items()
        if s.get("median_pct") is not None and s.get("median_residual_s") is not None
    ]
    if not cells:
        return ""
    return "decode-only steps by batch, median signed error, measured - priced: " + ", ".join(cells)


def print_table(result: dict[str, Any], file: Any = sys.stdout) -> None:
    """The error table: per cost model, per-request metrics and per-step error."""
    print_context(result, file)
    for name, model in result["models"].items():
        parts = _metric_cells(model["requests"]["metrics"])
        print(f"  {name:<10} per request, median |error|: " + "; ".join(parts), file=file)
        steps = model["steps"]
        kinds = ", ".join(
            f"{kind} {s['median_abs_pct']:.1f}% (n={s['n']})"
            for kind, s in steps["by_kind"].items()
            if s["median_abs_pct"] is not None
        )
        overall = steps["all"]["median_abs_pct"]
        if overall is not None:
            print(
                f"  {name:<10} engine's own steps, median |error| {overall:.1f}% "
                f"(bias {steps['all']['bias_pct']:+.1f}%): {kinds}",
                file=file,
            )
        if batches := _batch_text(steps.get("by_decode_batch") or {}):
            print(f"  {name:<10} {batches}", file=file)
        tail = _tail_text(model.get("tail") or {})
        if tail:
            print(f"  {name:<10} {tail}", file=file)
        if "by_phase" in steps:
            print(f"  {name:<10} {_phase_text(steps['by_phase'])}", file=file)
        if "ttft_wait_split" in model:
            print(f"  {name:<10} {_split_text(model['ttft_wait_split'])}", file=file)
        if model.get("ttft_distribution", {}).get("n"):
            print(f"  {name:<10} {_distribution_text(model['ttft_distribution'])}", file=file)
        div = model["divergence"]
        print(
            f"  {name:<10} batches identical for the first {div['num_identical_steps']} of "
            f"{model['num_engine_steps']} engine steps ({model['num_sim_steps']} simulated)",
            file=file,
        )
        if "why" in div:
            print(f"  {name:<10} where they part: {div['why']['text']}", file=file)


def _tail_text(tail: dict[str, Any]) -> str | None:
    """The decode-only steps' total against the model's beside their median step: what a
    request's TPOT (a mean over its steps) carries and a median does not, the run's slow steps;
    and how much of it is left without the steps whose input preparation ran slow too (the
    host's own stalls)."""
    if "tail_pts" not in tail:
        return None
    text = (
        f"decode-only steps in total {tail['total_pct']:+.1f}% over the model's, the median "
        f"step {tail['median_step_pct']:+.1f}%: the run's slow steps add "
        f"{tail['tail_pts']:+.1f} points to a TPOT"
    )
    if "tail_without_hiccups_pts" in tail:
        text += (
            f"; {tail['tail_without_hiccups_pts']:+.1f} without the "
            f"{100 * tail['hiccup_share']:.1f}% whose input preparation ran "
            f">= {tail['hiccup']:g}x the run's own table of it too (the host's stalls)"
        )
    return text


MEASURED_OPTION = "--measured"
LOADED_SHARE = 0.2
"""Above this share of a profile's steps in slow episodes, validate warns of a loaded
calibration."""


def measured_spelling(argv: Sequence[str]) -> list[str] | None:
    """Issue 16's spelling, ``validate --measured RUN_DIR [run options]``, as the argv of the one
    implementation, ``measured validate RUN_DIR [run options]``; None for any other argv. (The
    run options are ``sim run``'s, not the engine validation's, so the argv is rewritten before
    either parser sees it.)"""
    if not argv or argv[0] != "validate":
        return None
    rest = list(argv[1:])
    for idx, arg in enumerate(rest):
        if arg == MEASURED_OPTION:
            if idx + 1 == len(rest) or rest[idx + 1].startswith("-"):
                raise ValueError(f"{MEASURED_OPTION} needs a RUN_DIR (from sim measured import)")
            return ["measured", "validate", rest[idx + 1], *rest[:idx], *rest[idx + 2 :]]
        if arg.startswith(MEASURED_OPTION + "="):
            run_dir = arg.partition("=")[2]
            return ["measured", "validate", run_dir, *rest[:idx], *rest[idx + 1 :]]
    return None


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ValidateConfig()
    parser.add_argument(
        "trace",
        nargs="?",
        help="trace file (the formats `python -m sim run` reads); with --replay, the run's own "
        "trace by default; not with --measured",
    )
    parser.add_argument(
        MEASURED_OPTION,
        metavar="RUN_DIR",
        default=None,
        help="instead: replay a measured run (from `python -m sim measured import`) in the "
        "simulator and print the per-request error; the same command as `python -m sim "
        "measured validate RUN_DIR`, taking its run options (see its --help)",
    )
    parser.add_argument("--format", default="auto", help="trace format (default: detect)")
    parser.add_argument(
        "--model",
        default=None,
        help=f"model (default: the replayed run's, else {defaults.model})",
    )
    parser.add_argument(
        "--device", default=defaults.device, help="cpu or cuda (default: %(default)s)"
    )
    parser.add_argument(
        "--profile", default=None, help="cost-model profile; default: calibrate one first"
    )
    parser.add_argument(
        "--replay",
        action="append",
        default=None,
        metavar="ENGINE_RUN_DIR",
        help="compare against this saved engine run (python -m engine run --out, or a "
        "previous validate's engine/) instead of running the engine; given twice, the second "
        "run of the same configuration gives the engine against itself (the noise floor)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run (and calibrate) the engine without CUDA graphs (where it has them)",
    )
    parser.add_argument(
        "--mixed-graphs",
        default="off",
        choices=["off", "piecewise"],
        help="run (and calibrate) the engine with its steps with a prompt chunk on piecewise "
        "CUDA graphs (python -m engine run --mixed-graphs; CUDA only) (default: %(default)s)",
    )
    parser.add_argument(
        "--host-slowdown",
        type=_slowdown,
        default=1.0,
        metavar="X|measured",
        help="price the engine's host X times slower than the calibration's (its clock only, "
        "not the GPU's: CostModelConfig.host_slowdown), or as much slower as the run's input "
        "preparation was than the calibration's steps' (measured; a profile from sim calibrate "
        "since 2026-11-28 stores them). The table always prints that measurement where it can "
        "be made, and with a second run the second host against the first (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run the engine a second time for the engine against itself (the noise floor)",
    )
    parser.add_argument("--out", required=True, help="directory for validation.json and runs")
    parser.add_argument("--report", default=None, help="write the HTML validation section here")
    settings = parser.add_argument_group(
        "KV cache and scheduling (the engine's: the flags of python -m engine run)"
    )
    add_setting_flags(settings, (CacheConfig, SchedulerConfig), skip=LAYOUT_SETTINGS)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=defaults.time_scale,
        help="multiply arrival times by this (default: %(default)s)",
    )
    parser.add_argument(
        "--max-requests", type=int, default=None, help="use only the trace's first N requests"
    )
    parser.add_argument(
        "--hardware",
        default=None,
        help="hardware preset of the roofline baseline (default: the replayed run's device, "
        "else CPU-1T on cpu, H100-SXM on cuda)",
    )
    parser.add_argument(
        "--clock",
        default=defaults.clock,
        choices=CLOCK_CHOICES,
        help=CLOCK_HELP + "; with cpu the engine replays on a virtual clock advanced by each "
        "step's thread-CPU time (python -m engine run --clock), so the comparison is like "
        "with like (default: %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def _speed_text(speed: dict[str, Any]) -> str:
    """A measured host speed (``fidelity.host_speed.HostSpeed.as_dict``) in words."""
    fifths = " ".join(f"{x:.2f}" for x in speed["by_fifth"])
    return (
        f"(input preparation, {speed['num_steps']} steps): {speed['slowdown']:.3f}x, "
        f"+-{speed['spread']:.3f}; by fifth of the run {fifths}"
    )


def _slowdown(text: str) -> float | str:
    """--host-slowdown's value: ``measured``, or a finite number > 0."""
    if text == "measured":
        return text
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected 'measured' or a number > 0, got {text!r}")
    return value


def config_from_args(
    args: argparse.Namespace, model: str | None = None, hardware: str | None = None
) -> ValidateConfig:
    """The replay's configuration from the flags; ``model`` and ``hardware`` where a replayed
    run supplies them (else the flags', else the defaults)."""
    return build(
        ValidateConfig,
        {
            **given_settings(args),
            "model": model or args.model or ValidateConfig().model,
            "device": args.device,
            "time_scale": args.time_scale,
            "max_requests": args.max_requests,
            "hardware": hardware or args.hardware,
            "clock": args.clock,
            "enforce_eager": args.enforce_eager,
            "mixed_graphs": args.mixed_graphs,
            "host_slowdown": 1.0 if args.host_slowdown == "measured" else args.host_slowdown,
            "measure_host_slowdown": args.host_slowdown == "measured",
        },
    )


def run_validate(args: argparse.Namespace) -> int:
    import shlex

    from traces.loaders import load_trace

    if args.measured is not None:
        # main() rewrites this spelling before parsing (measured_spelling); reaching here means
        # a caller parsed it itself.
        raise ValueError(
            f"{MEASURED_OPTION}: call sim.cli.main.main, which runs `measured validate`"
        )
    replays = args.replay or []
    if len(replays) > 2:
        raise ValueError("--replay: give it once (the run compared) or twice (and its rerun)")
    trace_path, model, hardware = args.trace, args.model, args.hardware
    if replays:
        summary = run_summary(replays[0])
        trace_path = trace_path or str(trace_of(replays[0], summary))
        model = model or (summary.get("config") or {}).get("model")
        hardware = hardware or hardware_of(str(summary.get("device_name", "")))
        check_replay_options(replays[0], summary, args)
        if len(replays) > 1:
            note = check_rerun(replays[0], summary, replays[1], run_summary(replays[1]))
            if note is not None:
                print(f"note: {note}", file=sys.stderr)
    if trace_path is None:
        raise ValueError(f"validate needs a TRACE (or --replay RUN, or {MEASURED_OPTION} RUN_DIR)")
    config = config_from_args(args, model=model, hardware=hardware)
    if hardware is not None:
        load_hardware(hardware)
    trace = load_trace(trace_path, format=args.format)
    command = shlex.join(["python", "-m", "sim", *getattr(args, "argv", sys.argv[1:])])
    with needs_engine("validate"):
        from fidelity.validate import validate

    result = validate(
        trace,
        config,
        args.out,
        profile=args.profile,
        replay_dir=replays[0] if replays else None,
        command=command,
        progress=not args.quiet,
        floor_dir=replays[1] if len(replays) > 1 else None,
        rerun=args.rerun,
    )
    if not args.quiet:
        print_table(result)
        print(f"wrote {Path(args.out) / VALIDATION_FILE}")
    if args.report:
        from reports.validation import write_validation_report

        path = write_validation_report(result, args.report)
        if not args.quiet:
            print(f"wrote report {path}")
    return 0
