"""The GPU check's parts (``plan``): each a command line of the project with the time it is
expected to take, the limit it is stopped at, what it needs (modules, parts before it, input
files) and the reader of what it measured (``engine.gpu_check.figures``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.affinity import current_cores
from engine.gpu_check import figures

ROOT = Path(__file__).resolve().parents[2]
TRACES = "traces/data"
WALK_JSON = "decode_walk.json"
EFFICIENCIES_JSON = "efficiencies.json"
ENGINE = ("torch", "triton", "safetensors")
SIM = ("simpy", "pandas", "plotly", "tqdm")


@dataclass(frozen=True, slots=True)
class Command:
    """``python HEAD... ARGS...``; ``python HEAD... --help`` lists the flags ARGS may use."""

    head: tuple[str, ...]
    args: tuple[str, ...] = ()

    def argv(self, python: str) -> list[str]:
        return [python, *self.head, *self.args]

    def help_argv(self, python: str) -> list[str]:
        return [python, *self.head, "--help"]


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the check. Its commands run in turn in ``DIR/<name>/`` (the log there too);
    ``read`` turns that folder into the part's figures."""

    name: str
    about: str
    commands: tuple[Command, ...]
    estimate_s: float
    limit_s: float
    modules: tuple[str, ...] = ()
    after: tuple[str, ...] = ()  # parts that must have passed
    inputs: tuple[str, ...] = ()  # files (from the project root) the commands read
    read: Callable[[Path], dict[str, Any]] | None = None
    keep_going: bool = False  # run every command even after one fails (the part fails)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"Part.name must be a plain folder name, got {self.name!r}")
        if not self.commands:
            raise ValueError(f"Part {self.name}: commands must not be empty")
        if not 0 < self.estimate_s <= self.limit_s:
            raise ValueError(
                f"Part {self.name}: need 0 < estimate_s <= limit_s, got {self.estimate_s!r} "
                f"and {self.limit_s!r}"
            )


@dataclass(frozen=True, slots=True)
class CheckSettings:
    """What the check runs on: the model, the roofline's hardware preset (from the device),
    whether the engine has CUDA graphs (and piecewise ones for its other steps, an option),
    whether ``kernels.bench`` times kernels in a CUDA graph and the flag that asks it to
    (None: it does by default, or cannot), and the pytest workers (pytest-xdist, 0 = none)."""

    out: Path
    model: str = "llama-3-8b"
    dtype: str = "bfloat16"
    hardware: str = "H100-SXM"
    graphs: bool = False
    piecewise: bool = False
    bench_graphs: bool = False
    bench_graph_flag: str | None = None
    pytest_workers: int = 0
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        if self.pytest_workers < 0:
            raise ValueError(f"pytest_workers must be >= 0, got {self.pytest_workers!r}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")


# The engine's other modes, beside the default (decode on CUDA graphs, other steps eager): each
# is calibrated, run twice and validated as the default is (``_mode_parts``). ``piecewise``
# replays its steps with a prompt chunk on piecewise graphs too: on the H200 (2026-11-28) it
# took them from 23.4 to 10.5 ms by median, TTFT from 28.8 to 15.0 ms.
MODE_FLAGS: dict[str, tuple[str, ...]] = {
    "": (),
    "eager": ("--enforce-eager",),
    "piecewise": ("--mixed-graphs", "piecewise"),
}
MODE_ABOUT = {
    "": "the engine",
    "eager": "the eager engine (--enforce-eager)",
    "piecewise": "the engine with piecewise graphs (--mixed-graphs piecewise)",
}


def _tail(mode: str) -> str:
    return f"-{mode}" if mode else ""


def environment_part(settings: CheckSettings) -> Part:
    out = settings.out / "environment" / "environment.json"
    return Part(
        "environment",
        "device, software and installed modules",
        (Command(("-m", "engine.gpu_check.environment"), ("--out", str(out))),),
        estimate_s=15,
        limit_s=60,
        modules=("torch",),
        read=figures.environment,
    )


def plan(settings: CheckSettings) -> list[Part]:
    """The parts after ``environment``, most wanted first (the budget drops the last)."""
    return [
        _gpu_tests(settings),
        *_bench_engine(settings),
        _profile_decode(settings),
        _calibrate(settings),
        # The engine twice on example.csv, then the simulator against the first run with the
        # engine against itself beside it (the noise floor), from the same two runs.
        _engine_self(settings),
        _validate_self(settings),
        # What the cost model takes from this GPU: the decode walk's tile time (from the
        # engine's graph replays) and the GEMM efficiencies (from the calibrations' tables).
        *([_model_fits(settings)] if settings.graphs else []),
        # The engine once more with the decode split it had before (end-to-end A/B of
        # ``--decode-split``; engine-self's two runs are the other side and its noise).
        *([_split_fixed(settings)] if settings.graphs else []),
        # And with its other steps on piecewise graphs (``--mixed-graphs piecewise``).
        *([_piecewise(settings)] if settings.piecewise else []),
        _kernels_bench(settings),
        # The other traces' first 100 requests: all four in about the time of one whole trace.
        _validate(settings, "example", "continuous", 0.25, max_requests=100),
        _validate(settings, "shared_prefix", "chunked", 0.25, True, max_requests=100),
        _validate(settings, "parallel_sampling", "chunked", 0.25, True, max_requests=100),
        _validate(settings, "bursty", "chunked", 1.0, max_requests=100),
        # Where the engine has CUDA graphs, the eager engine too, and where it has them, the
        # engine with piecewise graphs (dropped first by the budget).
        *(_mode_parts(settings, "eager") if settings.graphs else []),
        *(_mode_parts(settings, "piecewise") if settings.piecewise else []),
        # The eager engine pinned to cores of its own, beside its runs unpinned.
        *([_pinned_eager(settings)] if settings.graphs else []),
    ]


def _gpu_tests(settings: CheckSettings) -> Part:
    args = ["-m", "gpu and not gpu_memory", "-q", "-p", "no:cacheprovider", "tests"]
    if settings.pytest_workers:
        args += ["-n", str(settings.pytest_workers)]
    # The tests that size a KV cache from the whole device's memory run after, one at a time.
    alone = ("-m", "gpu_memory", "-q", "-p", "no:cacheprovider", "tests")
    return Part(
        "gpu-tests",
        "the tests marked gpu (kernels against their references, engine on CUDA), then those "
        "that size a cache from the GPU's memory, alone",
        (Command(("-m", "pytest"), tuple(args)), Command(("-m", "pytest"), alone)),
        # 89 tests took 65 s on 8 workers on the H200 (2026-11-27), 91 took 79 s and the 4 that
        # size a cache from memory 55 s after them, alone (139 s in all, 2026-11-28); one
        # worker compiles them in turn.
        estimate_s=150 if settings.pytest_workers else 200,
        limit_s=240,
        modules=(*ENGINE, "pytest", "hypothesis"),
        read=figures.pytest_counts,
        keep_going=True,
    )


def _model_args(settings: CheckSettings) -> tuple[str, ...]:
    return ("--model", settings.model, "--device", "cuda", "--dtype", settings.dtype)


def _bench_engine(settings: CheckSettings) -> list[Part]:
    """``bench_engine``: the model's forward, whole engine decode steps and the trace figure;
    where the engine has CUDA graphs, the engine sections once more with ``--enforce-eager``."""
    common = (
        *_model_args(settings), "--hardware", settings.hardware, "--batches", "1,32,64,256",
        "--contexts", "512,2048", "--prefill-tokens", "512,2048", "--step-batches", "1,32,64",
        "--step-contexts", "512,2048", "--repeats", "5",
    )  # fmt: skip
    script = ("benchmarks/bench_engine.py",)
    mode = "with CUDA graphs" if settings.graphs else "eager (this engine has no CUDA graphs)"
    json_out = ("--json", str(settings.out / "bench-engine" / figures.BENCH_ENGINE_FILE))
    parts = [
        Part(
            "bench-engine",
            f"decode/prefill forward, whole decode steps and trace tokens/s, {mode}",
            (Command(script, (*common, *json_out)),),
            estimate_s=70,
            limit_s=180,
            modules=ENGINE,
            read=figures.bench_engine,
        )
    ]
    if settings.graphs:
        eager = ("--sections", "steps,trace", "--enforce-eager")
        json_out = ("--json", str(settings.out / "bench-engine-eager" / figures.BENCH_ENGINE_FILE))
        parts.append(
            Part(
                "bench-engine-eager",
                "whole decode steps and trace tokens/s with --enforce-eager",
                (Command(script, (*common, *eager, *json_out)),),
                estimate_s=50,
                limit_s=150,
                modules=ENGINE,
                read=figures.bench_engine,
            )
        )
    return parts


def _profile_decode(settings: CheckSettings) -> Part:
    """The decode profile in the engine's own mode, and eager too where it has CUDA graphs."""
    folder = settings.out / "profile-decode"
    args = (*_model_args(settings), "--batches", "1,32", "--context", "512", "--steps", "20")
    modes = {"graphs": (), "eager": ("--enforce-eager",)} if settings.graphs else {"eager": ()}
    commands = tuple(
        Command(
            ("-m", "engine.profiling.decode"), (*args, *flags, "--out", f"{folder}/{mode}.json")
        )
        for mode, flags in modes.items()
    )
    return Part(
        "profile-decode",
        "torch.profiler over 20 decode steps at batch 1 and 32: kernels per step, host time",
        commands,
        estimate_s=30 * len(commands),  # (48 s for both on the H200, 2026-11-28)
        limit_s=150 * len(commands),
        modules=ENGINE,
        read=figures.decode_profiles,
    )


def _calibrate(settings: CheckSettings, mode: str = "") -> Part:
    """Two calibrations, one after the other (``--repeat 2``): the profile, and how far the
    second's predictions of the step grid are from the first's."""
    name = f"calibrate{_tail(mode)}"
    out = settings.out / name / "profile.json"
    args: tuple[str, ...] = ("--model", settings.model, "--device", "cuda", "--out", str(out))
    args += ("--repeat", "2", "--quiet", *MODE_FLAGS[mode])
    return Part(
        name,
        f"python -m sim calibrate --repeat 2: {MODE_ABOUT[mode]}'s parts and whole steps as a "
        "cost-model profile, twice, and how far the two profiles' predictions differ",
        (Command(("-m", "sim", "calibrate"), args),),
        estimate_s=100,  # (76 s with graphs, 82 s eager, on the H200 of 2026-11-28)
        limit_s=360,
        modules=(*ENGINE, *SIM),
        read=figures.calibration,
    )


def _validate_self(settings: CheckSettings, mode: str = "") -> Part:
    """The simulator against the first engine-self run, the second beside it as the floor."""
    tail = _tail(mode)
    runs = settings.out / f"engine-self{tail}"
    calibration = f"calibrate{tail}"
    args = (
        "--replay", str(runs / "run1"), "--replay", str(runs / "run2"),
        "--profile", str(settings.out / calibration / "profile.json"),
        "--hardware", settings.hardware,
        "--out", str(settings.out / f"validate-example-chunked{tail}"), "--quiet",
    )  # fmt: skip
    return Part(
        f"validate-example-chunked{tail}",
        f"python -m sim validate --replay run1 --replay run2 (engine-self{tail}'s example.csv "
        "runs): the simulator against the engine, beside the engine against itself",
        (Command(("-m", "sim", "validate"), args),),
        estimate_s=15,  # (6-10 s on the H200, 2026-11-28)
        limit_s=120,
        modules=(*ENGINE, *SIM),
        after=(calibration, f"engine-self{tail}"),
        read=figures.validation,
    )


def _model_fits(settings: CheckSettings) -> Part:
    """``benchmarks/decode_walk.py`` on engine-self's graph replays and
    ``benchmarks/derive_efficiencies.py`` on calibrate's two profiles: the values this GPU's
    preset would state (``HardwareSpec.decode_tile_s``, the GEMM efficiencies, servesim's own
    kernels: ``decode_latency_s``, the fused row kernels', ``lm_head_latency_s``)."""
    folder, out = settings.out / "model-fits", settings.out
    calibration = out / "calibrate"
    walk = (str(out), "--hardware", settings.hardware, "--model", settings.model)
    efficiencies = (
        "--gpu", settings.hardware, "--servesim-gpu", settings.hardware,
        "--servesim-profiles", str(calibration / "profile.json"),
        str(calibration / "profile-repeat2.json"),
        "--json", str(folder / EFFICIENCIES_JSON),
    )  # fmt: skip
    return Part(
        "model-fits",
        "the decode kernel's tile time from the graph replays of engine-self (fit of "
        "benchmarks/decode_walk.py), the GEMM efficiencies from calibrate's linear tables and "
        "servesim's own kernels (the decode's and LM head's fixed costs, the fused row kernels) "
        "from its other tables (benchmarks/derive_efficiencies.py), beside what the preset "
        "states",
        (
            Command(("benchmarks/decode_walk.py",), (*walk, "--json", str(folder / WALK_JSON))),
            Command(("benchmarks/derive_efficiencies.py",), efficiencies),
        ),
        estimate_s=15,
        limit_s=90,
        modules=SIM,
        after=("calibrate", "engine-self"),
        read=figures.model_fits,
    )


def _engine_ab(
    settings: CheckSettings,
    name: str,
    flags: tuple[str, ...],
    description: str,
    timing: tuple[int, int],
    read: Callable[[Path], dict[str, Any]],
    beside: str = "engine-self",
) -> Part:
    """``python -m engine run example.csv`` as engine-self's, once, with ``flags``: one side
    of an A/B whose other side (and its noise) is ``beside``'s two runs."""
    path = f"{TRACES}/example.csv"
    args: tuple[str, ...] = (path, "--model", settings.model, "--device", "cuda")
    args += ("--weights", "random", "--dtype", settings.dtype, "--time-scale", "0.25", "--quiet")
    args += (*flags, "--out", f"{settings.out / name}/run1")
    return Part(
        name,
        description,
        (Command(("-m", "engine", "run"), args),),
        estimate_s=timing[0],
        limit_s=timing[1],
        modules=(*ENGINE, "tqdm", "pandas"),
        after=(beside,),
        inputs=(path,),
        read=read,
    )


def _split_fixed(settings: CheckSettings) -> Part:
    """The engine with ``--decode-split fixed``: its decode split until 39ba127 (2026-11-27),
    beside engine-self's two runs of ``per_sequence``."""
    return _engine_ab(
        settings,
        "engine-split-fixed",
        ("--decode-split", "fixed"),
        "python -m engine run example.csv with the fixed decode split (--decode-split fixed), "
        "beside engine-self's two runs of the per-sequence split",
        (40, 120),  # (30 s on the H200, 2026-11-28)
        figures.split_ab,
    )


def _piecewise(settings: CheckSettings) -> Part:
    """The engine with ``--mixed-graphs piecewise``: the steps with a prompt chunk replay
    graphs of every op but the attention, beside engine-self's two runs with them eager."""
    return _engine_ab(
        settings,
        "engine-piecewise",
        ("--mixed-graphs", "piecewise"),
        "python -m engine run example.csv with its steps with a prompt chunk on piecewise "
        "CUDA graphs (--mixed-graphs piecewise), beside engine-self's two runs with them eager",
        (45, 180),  # (30 s on the H200, 2026-11-28)
        figures.piecewise_ab,
    )


PINNED_CORES = "2,3"
"""The cores ``engine-pinned-eager`` runs on: two, past core 0 (where the machine's own
work and interrupts tend to land); the H200 machines have 16."""


def pinned_cores(usable: tuple[int, ...] | None) -> str:
    """``PINNED_CORES`` where this process may use both (or cannot tell); otherwise the two
    usable cores after the first (a container may allow other cores than the machine's
    first few); the one core where only one is usable."""
    if usable is None or {2, 3} <= set(usable):
        return PINNED_CORES
    chosen = usable[1:3] if len(usable) > 2 else usable[-2:]
    return ",".join(str(core) for core in chosen)


def _pinned_eager(settings: CheckSettings) -> Part:
    """The eager engine pinned to two cores (``--cpu-cores``), beside engine-self-eager's two
    runs: whether its host's slow stretches (steps and input preparation 1.3-1.9 times slower
    for tens to hundreds of steps) are the process moving among cores (``engine.affinity``)."""
    cores = pinned_cores(current_cores())
    return _engine_ab(
        settings,
        "engine-pinned-eager",
        ("--enforce-eager", "--cpu-cores", cores),
        f"python -m engine run example.csv eager, pinned to cores {cores} "
        "(--cpu-cores), beside engine-self-eager's two runs unpinned",
        (50, 150),  # (the eager runs of engine-self-eager took about 40 s each, 2026-11-28)
        figures.host_modes_ab,
        beside="engine-self-eager",
    )


def _mode_parts(settings: CheckSettings, mode: str) -> list[Part]:
    """The engine in another mode (``MODE_FLAGS``) as the default engine: its calibration,
    itself twice on example.csv, and the simulator against those runs (``eager``: the host
    clock without graphs; ``piecewise``: its steps with a prompt chunk on graphs too)."""
    return [
        _calibrate(settings, mode),
        _engine_self(settings, mode),
        _validate_self(settings, mode),
    ]


def _validate(
    settings: CheckSettings,
    trace: str,
    policy: str,
    time_scale: float,
    prefix_caching: bool = False,
    max_requests: int | None = None,
    eager: bool = False,
) -> Part:
    name = f"validate-{trace.replace('_', '-')}-{policy}" + ("-eager" if eager else "")
    calibration = "calibrate-eager" if eager else "calibrate"
    path = f"{TRACES}/{trace}.csv"
    args = [
        path, "--policy", policy, "--model", settings.model, "--device", "cuda",
        "--profile", str(settings.out / calibration / "profile.json"),
        "--hardware", settings.hardware, "--time-scale", str(time_scale),
        "--out", str(settings.out / name), "--quiet",
    ]  # fmt: skip
    if prefix_caching:
        args.append("--prefix-caching")
    if eager:
        args.append("--enforce-eager")
    if max_requests:
        args += ["--max-requests", str(max_requests)]
    about = f"python -m sim validate {trace}.csv, {policy}"
    about += ", prefix caching" if prefix_caching else ""
    about += f", first {max_requests} requests" if max_requests else ""
    about += ", the eager engine (--enforce-eager)" if eager else ""
    return Part(
        name,
        f"{about}, time scale {time_scale}",
        (Command(("-m", "sim", "validate"), tuple(args)),),
        estimate_s=(50 if time_scale >= 1 else 35) if max_requests else 50,
        limit_s=150,
        modules=(*ENGINE, *SIM),
        after=(calibration,),
        inputs=(path,),
        read=figures.validation,
    )


def _engine_self(settings: CheckSettings, mode: str = "") -> Part:
    path = f"{TRACES}/example.csv"
    tail = _tail(mode)
    folder = settings.out / f"engine-self{tail}"
    common: tuple[str, ...] = (path, "--model", settings.model, "--device", "cuda")
    common += ("--weights", "random", "--dtype", settings.dtype, "--time-scale", "0.25", "--quiet")
    common += MODE_FLAGS[mode]
    return Part(
        f"engine-self{tail}",
        f"python -m engine run example.csv twice: {MODE_ABOUT[mode]} against itself",
        tuple(
            Command(("-m", "engine", "run"), (*common, "--out", f"{folder}/run{i}")) for i in (1, 2)
        ),
        estimate_s=80,  # (61 s with graphs, 73 s eager, on the H200 of 2026-11-28)
        limit_s=200,
        modules=(*ENGINE, "tqdm", "pandas"),
        inputs=(path,),
        read=figures.engine_against_itself,
    )


def _kernels_bench(settings: CheckSettings) -> Part:
    out = settings.out / "kernels-bench" / "kernels_bench.json"
    args: tuple[str, ...] = ("--quick", "--out", str(out))
    if settings.bench_graph_flag:
        args += (settings.bench_graph_flag,)
    graphs = (
        "with small shapes also in a CUDA graph"
        if settings.bench_graphs
        else "(this kernels.bench times nothing in a CUDA graph)"
    )
    return Part(
        "kernels-bench",
        f"python -m kernels.bench --quick {graphs}",
        (Command(("-m", "kernels.bench"), args),),
        estimate_s=40,  # (24 s on the H200, 2026-11-28)
        limit_s=150,
        modules=("torch", "triton"),
        read=figures.kernels_bench,
    )
