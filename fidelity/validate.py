"""The validation behind ``python -m sim validate``: replay a trace on the real engine,
calibrate if no profile is given, simulate the same trace and
configuration with the profile and with the analytic roofline, and compare (``fidelity.validation``)
into ``validation.json``. Its options and table are in ``fidelity.cli.validate``."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from core.config import SETTING_NAMES
from core.model.presets import load_model_spec
from core.settings import build, flat_settings
from engine.llm_engine import EngineConfig
from engine.replay import ReplayConfig, replay
from fidelity import host_speed, ttft_floor, validation
from fidelity.calibrate import calibrate
from fidelity.divergence import explain
from fidelity.loop_gap import loop_gap
from fidelity.replay_inputs import decode_split_of_run, engine_kind_of_run, run_summary
from fidelity.validate_config import VALIDATION_FILE, ValidateConfig
from records.run_dir import load_run, run_file
from records.step_shapes import STEP_SHAPES_FILE, load_step_shapes
from sim.costmodel.base import CostModel, CostModelConfig, make_cost_model
from sim.costmodel.profile import load_profile
from sim.executor import CostModelExecutor
from sim.recording import RecordingExecutor
from sim.run import RunConfig, RunResult, simulate
from sim.specs.hardware_file import load_hardware
from traces.schema import Trace

ENGINE_DIR = "engine"


def subset(trace: Trace, max_requests: int | None, time_scale: float) -> Trace:
    """The first ``max_requests`` requests, arrivals multiplied by ``time_scale`` (as the
    engine's replay does)."""
    requests = trace.requests[:max_requests] if max_requests else trace.requests
    scaled = tuple(replace(r, arrival_s=r.arrival_s * time_scale) for r in requests)
    return replace(trace, requests=scaled)


def run_engine(trace: Trace, config: ValidateConfig, out: Path, command: str) -> Path:
    """Replay on the real engine; writes the run (with step_shapes.jsonl) to ``out``."""
    engine = EngineConfig(
        cache=config.cache,
        scheduler=config.scheduler,
        enforce_eager=config.enforce_eager,
        mixed_graphs=config.mixed_graphs,
        model=config.model,
        device=config.device,
        weights="random",
        cpu_threads=config.cpu_threads,
        clock=config.engine_clock(),
    )
    # The trace is already subset; the engine stretches arrivals itself.
    replay_config = ReplayConfig(engine=engine, time_scale=config.time_scale)
    result = replay(trace, replay_config)
    result.command = command
    result.write(out)
    return out


# The settings every engine run has recorded since the first: a run without one is refused
# rather than replayed at a default it did not run with.
_ENGINE_RECORDED = (
    "policy",
    "block_size",
    "swap_space_gib",
    "max_num_seqs",
    "max_num_batched_tokens",
    "batch_size",
    "max_wait_s",
    "preemption_mode",
    "enable_prefix_caching",
)


def sim_config(engine_dir: Path, config: ValidateConfig, profile: str | None) -> RunConfig:
    """The simulator's configuration of the engine run in ``engine_dir``: its KV cache and
    scheduler settings as recorded (its block count the one it sized), paged memory, every
    step simulated (no fast-forward)."""
    run = load_run(engine_dir)
    if run.num_blocks is None:
        raise ValueError(f"{engine_dir / 'summary.json'}: field 'num_blocks': missing")
    missing = [name for name in _ENGINE_RECORDED if name not in run.config]
    if missing:
        raise ValueError(f"{engine_dir / 'summary.json'}: field 'config.{missing[0]}': missing")
    recorded = {name: run.config[name] for name in SETTING_NAMES if name in run.config}
    return build(
        RunConfig,
        {
            **recorded,
            "memory_model": "paged",
            "num_blocks": int(run.num_blocks),
            "model": config.model,
            "hardware": config.roofline_hardware(),
            "profile": profile,
            "fast_forward": False,
            # servesim's engine prepares each step only after the last one ends: no overlap.
            "async_scheduling": False,
        },
    )


def engine_cost_config(
    run: RunConfig,
    engine_kind: str = "servesim-eager",
    decode_split: str = "fixed",
    host_slowdown: float = 1.0,
) -> CostModelConfig:
    """The engine's step as the simulator prices it: servesim's own host clock of the kind the
    engine ran as (no overlap of host and model work; eager launches, or decode graphs:
    ``sim.costmodel.host_time``), its decode kernel's split (``decode_split``, which a run
    names, ``decode_split_of_run``), and no padding, since the engine packs a batch's real
    rows and never computes a static batch's padding. ``host_slowdown``: the run's host against
    the calibration's (``CostModelConfig.host_slowdown``; ``fidelity.host_speed`` measures it)."""
    return CostModelConfig(
        async_scheduling=run.async_scheduling,
        price_padding=False,
        engine=engine_kind,
        max_num_seqs=run.scheduler.max_num_seqs,
        max_model_len=run.cache.max_model_len,
        decode_split=decode_split,
        host_slowdown=host_slowdown,
    )


def cost_models(
    run: RunConfig, engine_kind: str, decode_split: str = "fixed", host_slowdown: float = 1.0
) -> dict[str, CostModel]:
    model, hardware = load_model_spec(run.model), load_hardware(run.hardware)
    cost_config = engine_cost_config(run, engine_kind, decode_split, host_slowdown)
    models = {
        "roofline": make_cost_model(
            model, hardware, run.tp, config=cost_config, block_size=run.cache.block_size
        )
    }
    if run.profile is not None:
        models["calibrated"] = make_cost_model(
            model,
            hardware,
            run.tp,
            run.profile,
            config=cost_config,
            block_size=run.cache.block_size,
        )
    return models


def engine_floor(first: Path, second: Path) -> dict[str, Any]:
    """The engine against itself: the second run's per-request error against the first's (the
    floor no simulator can be asked to beat), and the ratio of their median step times."""
    import numpy as np

    a, b = load_run(first), load_run(second)
    missing = set(a.requests["request_id"].astype(str)) ^ set(b.requests["request_id"].astype(str))
    if missing:
        raise ValueError(
            f"--replay: the two engine runs served different requests (e.g. {sorted(missing)[0]})"
        )
    steps_a = load_step_shapes(run_file(first, STEP_SHAPES_FILE))
    steps_b = load_step_shapes(run_file(second, STEP_SHAPES_FILE))
    ratio = float(np.median([s.busy_s for s in steps_b]) / np.median([s.busy_s for s in steps_a]))
    # The second run's host against the first's, from their input preparation.
    speed: dict[str, Any] | str
    problem = host_speed.clocks_problem(
        (str(first), host_speed.run_clocks(run_summary(first))),
        (str(second), host_speed.run_clocks(run_summary(second))),
    )
    if problem:
        speed = problem
    else:
        try:
            settle = host_speed.run_settle(run_summary(first))
            speed = host_speed.against(steps_b, steps_a, str(second), settle).as_dict()
        except ValueError as error:
            speed = str(error)
    return {
        "first": str(first),
        "second": str(second),
        "requests": validation.request_errors(a.requests, b.requests),
        "median_step_ratio": ratio,
        "host_speed": speed,
        "ttft_wait_split": ttft_floor.wait_split(
            a.requests,
            ttft_floor.engine_steps(steps_a),
            b.requests,
            ttft_floor.engine_steps(steps_b),
        ),
    }


def _host_ratios(engine_dir: Path, steps: list[Any]) -> list[float | None] | None:
    """Each step's input preparation against the run's own table of it (``host_speed.step_ratios``),
    or None where the preparation is off the steps' clock or too few steps are timed."""
    summary = run_summary(engine_dir)
    if host_speed.clock_problem(str(engine_dir), host_speed.run_clocks(summary)):
        return None
    try:
        return host_speed.step_ratios(steps, host_speed.run_settle(summary))
    except ValueError:  # (too few timed steps)
        return None


def host_against_profile(engine_dir: Path, profile: str | None) -> dict[str, Any]:
    """The engine run's host against the calibration's, from their input preparation
    (``fidelity.host_speed``), or why it cannot be measured (``error``)."""
    if profile is None:
        return {"error": "no profile"}
    try:
        calibration = load_profile(profile)
        # A busy machine stretches the preparation's wall time and not a thread's CPU time:
        # each side's preparation must be on its steps' clock, and the two on one clock.
        summary = run_summary(engine_dir)
        problem = host_speed.clocks_problem(
            (f"the calibration {profile}", host_speed.profile_clocks(calibration)),
            (f"the run {engine_dir}", host_speed.run_clocks(summary)),
        )
        if problem:
            return {"error": problem}
        reference = host_speed.profile_reference(calibration)
        steps = load_step_shapes(run_file(engine_dir, STEP_SHAPES_FILE))
        settle = host_speed.run_settle(summary)
        return host_speed.host_speed(steps, reference, str(engine_dir), settle).as_dict()
    except ValueError as error:
        return {"error": str(error)}


def profile_spread(cost_model: CostModel) -> dict[str, Any]:
    """How sure a calibrated profile is of itself: its host fit's median |residual| over its
    whole steps, the slow episodes it left out and the stalls it counted, the clock its GPU
    time comes from and the scale on it, and the median relative spread of its table points
    (version 5)."""
    host = getattr(cost_model, "host", None)
    profile = getattr(cost_model, "profile", None)
    out: dict[str, Any] = {}
    if host is not None:
        out["gpu_clock"] = host.gpu_clock
        out["host"] = asdict(host.model.params)
        out["device_scale"] = host.device_scale
        if host.fit is not None:
            out["steps_spread_pct"] = 100 * host.fit.spread
            out["num_steps"] = len(host.fit.residuals)
            out["episodes"] = [list(e) for e in host.fit.episodes]
            out["num_episode_steps"] = sum(last - first + 1 for first, last in host.fit.episodes)
            out["num_stalls"] = host.fit.num_stalls
    if profile is not None and profile.spreads:
        out["table_spread_pct"] = table_spread_pct(profile)
    return out


def table_spread_pct(profile: Any) -> float:
    """Median over every table point with a spread of spread / time, in percent."""
    import numpy as np

    ratios = []
    for op, spread in profile.spreads.items():
        times = profile.ops[op].times_s
        flat_t = np.ravel(np.array(times, dtype=float))
        flat_s = np.ravel(np.array(spread, dtype=float))
        keep = flat_t > 0
        ratios.extend((flat_s[keep] / flat_t[keep]).tolist())
    return float(100 * np.median(ratios)) if ratios else float("nan")


def compare(
    engine_dir: Path,
    trace: Trace,
    run: RunConfig,
    out: Path,
    progress: bool = False,
    engine_kind: str = "servesim-eager",
    decode_split: str = "fixed",
    host_slowdown: float = 1.0,
) -> dict[str, Any]:
    """Simulate ``trace`` under ``run`` with each cost model and compare with the engine run,
    which ran as ``engine_kind`` (its host clock) with its decode kernel's ``decode_split``, on
    a host ``host_slowdown`` times slower than the calibration's."""
    measured = load_run(engine_dir)
    shapes_path = run_file(engine_dir, STEP_SHAPES_FILE)
    if not shapes_path.exists():
        raise ValueError(f"{shapes_path}: missing (an engine run from before step shapes?)")
    engine_steps = load_step_shapes(shapes_path)
    result: dict[str, Any] = {
        "trace": trace.name,
        "num_requests": len(trace.requests),
        "engine_run": str(engine_dir),
        "engine_summary": measured.summary,
        "profile": run.profile,
        "roofline_hardware": run.hardware,
        "sim_config": flat_settings(run),
        "cost_config": asdict(engine_cost_config(run, engine_kind, decode_split, host_slowdown)),
        "engine_kind": engine_kind,
        "decode_split": decode_split,
        "models": {},
        "ttft_phase_floor": ttft_floor.phase_floor(measured.requests, engine_steps),
        "engine_loop_gap": loop_gap(engine_steps),
    }
    arrivals = dict(
        zip(
            measured.requests["request_id"].astype(str), measured.requests["arrival_s"], strict=True
        )
    )
    host_ratios = _host_ratios(engine_dir, engine_steps)
    for name, cost_model in cost_models(run, engine_kind, decode_split, host_slowdown).items():
        if name == "calibrated":
            result["profile_spread"] = profile_spread(cost_model)
        config = run if name == "calibrated" else replace(run, profile=None)
        recorders: list[RecordingExecutor] = []

        def wrap(inner: CostModelExecutor, keep: list[RecordingExecutor] = recorders) -> Any:
            keep.append(RecordingExecutor(inner))
            return keep[-1]

        simulated: RunResult = simulate(
            trace,
            config,
            progress=progress,
            cost_config=engine_cost_config(run, engine_kind, decode_split, host_slowdown),
            wrap_executor=wrap,
        )
        simulated.write(out / f"sim-{name}")
        sim_steps = recorders[0].shapes if recorders else []
        sim_frame = simulated.steps.to_frame()
        steps = validation.step_errors(
            engine_steps, cost_model.step_time_s, cost_model.step_breakdown
        )
        predicted = simulated.requests_frame()
        requests = validation.request_errors(measured.requests, predicted)
        divergence = validation.first_divergence(engine_steps, sim_steps)
        divergence["why"] = explain(
            divergence["step_idx"],
            engine_steps,
            sim_steps,
            sim_frame["start_s"].tolist(),
            arrivals,
        )
        result["models"][name] = {
            "requests": requests,
            "steps": steps,
            "tail": validation.tail_stats(steps["rows"], host_ratios, host_speed.HICCUP),
            "terms_by_kind": validation.term_shares(steps["rows"]),
            "aggregates": validation.aggregates(measured.summary, simulated.summary),
            "divergence": divergence,
            "ttft_distribution": ttft_floor.distribution_error(requests["rows"]),
            "ttft_wait_split": ttft_floor.wait_split(
                measured.requests,
                ttft_floor.engine_steps(engine_steps),
                predicted,
                (sim_frame["start_s"].tolist(), sim_frame["duration_s"].tolist()),
            ),
            "num_engine_steps": len(engine_steps),
            "num_sim_steps": len(sim_steps),
        }
    return result


def validate(
    trace: Trace,
    config: ValidateConfig,
    out: str | Path,
    profile: str | None = None,
    replay_dir: str | Path | None = None,
    command: str = "",
    progress: bool = False,
    floor_dir: str | Path | None = None,
    rerun: bool = False,
) -> dict[str, Any]:
    """The whole command: engine (or ``replay_dir``), profile (given or calibrated), compare;
    writes ``validation.json`` under ``out`` and returns its content. The engine against
    itself (``engine_floor``) from a second run of the same configuration: ``floor_dir``, or
    with ``rerun`` the engine run again."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    trace = subset(trace, config.max_requests, 1.0)
    if replay_dir is not None:
        engine_dir = Path(replay_dir)
        if not (engine_dir / "summary.json").exists():
            raise ValueError(f"--replay: {engine_dir} holds no summary.json (not a run directory)")
        engine_config = load_run(engine_dir).config
        scale = float(engine_config.get("time_scale", 1.0))
        if engine_config.get("model") not in (None, config.model):
            raise ValueError(
                f"--replay: the run is of model {engine_config.get('model')!r}, "
                f"not {config.model!r}"
            )
    else:
        engine_dir = run_engine(trace, config, out / ENGINE_DIR, command)
        scale = config.time_scale
    if rerun and floor_dir is None:
        floor_dir = run_engine(trace, config, out / f"{ENGINE_DIR}-rerun", command)
    if profile is None:
        profile = str(
            calibrate(
                config.model,
                config.device,
                config.cache.block_size,
                out / "profile.json",
                command,
                progress=progress,
                cpu_threads=config.cpu_threads,
                clock=config.engine_clock(),
                enforce_eager=config.enforce_eager,
                mixed_graphs=config.mixed_graphs,
            )
        )
    run = sim_config(engine_dir, config, profile)
    scaled = subset(trace, None, scale)
    engine_ids = set(load_run(engine_dir).requests["request_id"].astype(str))
    trace_ids = {r.request_id for r in scaled.requests}
    if engine_ids != trace_ids:
        missing = sorted(engine_ids ^ trace_ids)[:3]
        raise ValueError(
            f"the engine run's requests differ from the trace's (e.g. {missing}); "
            "use the same trace and --max-requests as the run"
        )
    summary = run_summary(engine_dir)
    kind = engine_kind_of_run(summary)
    split = decode_split_of_run(summary, Path(engine_dir) / "summary.json")
    measured = host_against_profile(engine_dir, run.profile)
    slowdown = config.host_slowdown
    if config.measure_host_slowdown:
        if "error" in measured:
            raise ValueError(f"--host-slowdown measured: {measured['error']}")
        slowdown = float(measured["slowdown"])
    result = compare(engine_dir, scaled, run, out, progress, kind, split, slowdown)
    result["host_speed"] = {**measured, "applied": slowdown}
    if floor_dir is not None:
        result["engine_floor"] = engine_floor(engine_dir, Path(floor_dir))
    result["command"] = command
    result["time_scale"] = scale
    result["engine_clock"] = str(load_run(engine_dir).config.get("clock", "wall"))
    result["profile_timer"] = load_profile(profile).timer
    (out / VALIDATION_FILE).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result
