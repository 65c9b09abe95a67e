"""A sweep's spec (``SweepSpec``, read from TOML by ``load_spec``): where the trace comes from
and the list of points, each a set of ``run`` options that ``point_config`` parses with the
``run`` command's own parser, so a point means exactly what the same ``run`` flags mean."""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.run import RunConfig
from traces import cli as traces_cli
from traces.loaders import load_trace
from traces.schema import Trace

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with the tomli backport
    import tomli as tomllib

OptionValue = str | int | float | bool
# Options that name the trace or the outputs: the spec's [trace] table or the sweep CLI own them.
NOT_SWEPT = frozenset({"trace", "format", "on_error", "out", "report", "quiet"})
RATE = "rate"  # target mean arrival rate in req/s: time-scales a trace, or the generator's rate
REPEATS = "repeats"  # the trace replayed this many times end to end (``repeat_trace``)
TRACE_OPTIONS = (RATE, REPEATS)  # point options that shape the trace, not the run


class _RaisingParser(argparse.ArgumentParser):
    """An argparse parser that raises ``ValueError`` instead of printing and exiting."""

    def error(self, message: str) -> Any:
        raise ValueError(message)


def _run_parser() -> _RaisingParser:
    from sim.cli.options import add_run_arguments

    parser = _RaisingParser(prog="run", add_help=False)
    add_run_arguments(parser)
    return parser


def _run_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every ``run`` option by its dest-style name (``max_num_seqs`` for ``--max-num-seqs``)."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                out[flag[2:].replace("-", "_")] = action
    return out


def _key(name: str) -> str:
    return name.replace("-", "_")


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A trace file (``path``, ``format``) or a generator (``generator``: ``trace generate``
    options); ``load`` returns the trace, time-scaled or regenerated at ``rate`` req/s."""

    path: str | None = None
    format: str = "auto"
    on_error: str = "raise"
    generator: tuple[tuple[str, OptionValue], ...] = ()

    def __post_init__(self) -> None:
        if (self.path is None) == (not self.generator):
            raise ValueError("exactly one of [trace] path or [generator] must be given")

    def describe(self) -> dict[str, Any]:
        described = {"path": self.path, "format": self.format, "generator": dict(self.generator)}
        return {**described, "on_error": self.on_error}

    def load(self, rate: float | None = None) -> Trace:
        if self.path is not None:
            trace = load_trace(self.path, format=self.format, on_error=self.on_error)
            return trace if rate is None else scale_trace(trace, rate)
        args = self._generator_args(rate)
        args.name = args.name or "generated"
        return traces_cli.build_trace(args)

    def unused_options(self) -> list[str]:
        """The ``[generator]`` options this generator never reads (``--cv`` without gamma
        arrivals, a length option of another length model), each with what it applies to."""
        if self.path is not None:
            return []
        return [
            f"[generator] {note}"
            for note in traces_cli.unused_generate_options(self._generator_args())
        ]

    def _generator_args(self, rate: float | None = None) -> argparse.Namespace:
        """The generator's options parsed as ``trace generate`` parses them."""
        options = dict(self.generator)
        if rate is not None:
            options["rate"] = rate
        parser = _RaisingParser(prog="generator", add_help=False)
        traces_cli.add_generate_arguments(parser)
        argv = ["--output", "generated.csv", *_argv(options, _run_options(parser))]
        return parser.parse_args(argv)


def repeat_trace(trace: Trace, copies: int) -> Trace:
    """``trace`` replayed ``copies`` times end to end: copy k starts one mean gap after copy
    k - 1 ends, and its request ids (``#k``), prefix hash ids and prompt token ids are its own
    (shifted past the trace's largest), so no copy hits the prefix cache on another's prompts:
    each copy is a fresh draw of the same workload, not the same requests again."""
    if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
        raise ValueError(f"repeats must be an int >= 1, got {copies!r}")
    if copies == 1:
        return trace
    n = len(trace.requests)
    period = trace.duration_s * n / (n - 1) if n > 1 else 0.0
    hash_span = 1 + max((max(r.prefix_hash_ids or (0,)) for r in trace.requests), default=0)
    token_span = 1 + max((max(r.prompt_token_ids or (0,)) for r in trace.requests), default=0)
    requests = list(trace.requests)
    for k in range(1, copies):
        for r in trace.requests:
            hashes = r.prefix_hash_ids
            tokens = r.prompt_token_ids
            requests.append(
                replace(
                    r,
                    request_id=f"{r.request_id}#{k}",
                    arrival_s=r.arrival_s + k * period,
                    prefix_hash_ids=None
                    if hashes is None
                    else tuple(h + k * hash_span for h in hashes),
                    prompt_token_ids=None
                    if tokens is None
                    else tuple(t + k * token_span for t in tokens),
                )
            )
    return replace(trace, requests=tuple(requests))


def scale_trace(trace: Trace, rate: float) -> Trace:
    """``trace`` with its arrivals time-scaled so that its mean rate is ``rate`` req/s."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 req/s, got {rate!r}")
    if trace.mean_rate_per_s <= 0:
        raise ValueError(f"trace {trace.name!r} has no arrival spread to time-scale")
    factor = trace.mean_rate_per_s / rate
    requests = tuple(replace(r, arrival_s=r.arrival_s * factor) for r in trace.requests)
    return replace(trace, requests=requests)


def _argv(options: Mapping[str, OptionValue], actions: Mapping[str, argparse.Action]) -> list[str]:
    argv: list[str] = []
    for name, value in options.items():
        action = actions.get(_key(name))
        if action is None:
            raise ValueError(f"unknown option {name!r}")
        # The flag the key spells (``no-enable-prefix-caching``), else the option's first.
        spelled = "--" + _key(name).replace("_", "-")
        flags = [f for f in action.option_strings if f.startswith("--")]
        flag = spelled if spelled in flags else flags[0]
        switch = isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction))
        if switch and not isinstance(value, bool):
            raise ValueError(f"option {name!r} is a switch: give true or false, got {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            # An on/off setting: false is its ``--no-`` flag (or, for that flag, the plain one).
            negated = "--" + flag[5:] if flag.startswith("--no-") else "--no-" + flag[2:]
            argv.append(flag if value else negated)
        elif switch:
            argv.extend([flag] if value else [])
        elif isinstance(value, bool):
            raise ValueError(f"option {name!r} takes a value, got {value!r}")
        else:
            argv.extend([flag, str(value)])
    return argv


def point_argv(options: Mapping[str, OptionValue]) -> list[str]:
    """The ``run`` flags these options stand for (``rate`` and ``repeats`` left out: ``run`` has
    no such flags)."""
    run_options = {k: v for k, v in options.items() if _key(k) not in TRACE_OPTIONS}
    return _argv(run_options, _run_options(_run_parser()))


def point_config(options: Mapping[str, OptionValue]) -> RunConfig:
    """The `RunConfig` that ``run`` would build from these options (``rate`` left out)."""
    from sim.cli.options import config_from_args

    return config_from_args(_run_parser().parse_args(["TRACE", *point_argv(options)]))


def unused_in_points(
    points: Sequence[Mapping[str, OptionValue]], what: str = "points"
) -> list[str]:
    """The options some points give that their run never reads (`unused_options`: a batch size
    under chunked prefill, a link without disagg), each with how many points (or ``what``) it
    concerns."""
    from sim.cli.options import unused_options

    counts: dict[str, int] = {}
    for point in points:
        args = _run_parser().parse_args(["TRACE", *point_argv(point)])
        for note in unused_options(point_config(point), args):
            counts[note] = counts.get(note, 0) + 1
    return [f"{note} (in {n} of {len(points)} {what})" for note, n in counts.items()]


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """The trace source and the points (option dicts, keys in ``run``'s dest-style names)."""

    source: TraceSource
    points: tuple[dict[str, OptionValue], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("SweepSpec.points must not be empty")

    @property
    def option_names(self) -> list[str]:
        return sorted({name for point in self.points for name in point})


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"[{name}] must be a table, got {value!r}")
    return value


def _check_options(
    where: str, options: Mapping[str, Any], allowed: Mapping[str, argparse.Action]
) -> None:
    seen: dict[object, str] = {}
    for name, value in options.items():
        key = _key(name)
        if key in NOT_SWEPT:
            raise ValueError(f"{where}: {name!r} is set by [trace] or the command line")
        if key not in TRACE_OPTIONS and key not in allowed:
            raise ValueError(f"{where}: unknown run option {name!r}")
        # Two spellings of one option in one table: one of them would be silently dropped.
        option = allowed.get(key, key)
        if option in seen:
            raise ValueError(f"{where}: {seen[option]!r} and {name!r} set the same option")
        seen[option] = name
        values = value if isinstance(value, list) and where.endswith("[grid]") else [value]
        if not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise ValueError(f"{where}: option {name!r} must be a string, number or boolean")


def _grid_points(
    base: dict[str, Any], grid: dict[str, Any], listed: list[Any]
) -> list[dict[str, OptionValue]]:
    for name, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"[grid] {name!r} must be a non-empty list, got {values!r}")
        repeated = [value for idx, value in enumerate(values) if value in values[:idx]]
        if repeated:
            raise ValueError(
                f"[grid] {name!r} lists {repeated[0]!r} more than once; every point would run twice"
            )
    names = list(grid)
    # No [grid] gives one grid point, [run] itself, only where no [[points]] are listed.
    points = [
        {**base, **dict(zip(names, combo, strict=True))}
        for combo in itertools.product(*(grid[n] for n in names))
        if names or not listed
    ]
    for idx, item in enumerate(listed):
        if not isinstance(item, dict):
            raise ValueError(f"[[points]] entry {idx + 1} must be a table, got {item!r}")
        points.append({**base, **item})
    return [{_key(k): v for k, v in sorted(p.items(), key=lambda kv: _key(kv[0]))} for p in points]


def parse_spec(data: dict[str, Any], root: Path, where: str) -> SweepSpec:
    """A spec from parsed TOML; relative trace paths are taken from ``root``."""
    known = {"trace", "generator", "run", "grid", "points"}
    for name in data:
        if name not in known:
            raise ValueError(f"{where}: unknown table {name!r} (expected one of {sorted(known)})")
    trace, generator = _table(data, "trace"), _table(data, "generator")
    base, grid = dict(_table(data, "run")), dict(_table(data, "grid"))
    listed = data.get("points", [])
    if not isinstance(listed, list):
        raise ValueError(f"{where}: points must be an array of tables ([[points]])")
    rates = (trace or generator).get("rates")
    if rates is not None:
        grid.setdefault(RATE, rates)
    allowed = _run_options(_run_parser())
    _check_options(f"{where} [run]", base, allowed)
    _check_options(f"{where} [grid]", grid, allowed)
    for idx, item in enumerate(listed):
        _check_options(
            f"{where} [[points]] {idx + 1}", item if isinstance(item, dict) else {}, allowed
        )
    source, trace_read = _source(trace, generator, root, where)
    try:
        points = tuple(_grid_points(base, grid, listed))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from error
    checked: set[tuple[str, str]] = set()
    for idx, point in enumerate(points):
        repeats = point.get(REPEATS, 1)
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"{where}: point {idx} {point}: repeats must be an int >= 1")
        rate = point.get(RATE)
        if rate is not None and not _is_rate(rate):
            raise ValueError(f"{where}: point {idx} {point}: rate must be a number > 0 req/s")
        try:
            _check_named_files(point_config(point), checked)
        except ValueError as error:
            raise ValueError(f"{where}: point {idx} {point}: {error}") from error
    scaled = source.path is not None and any(RATE in point for point in points)
    if scaled and trace_read.mean_rate_per_s <= 0:
        raise ValueError(
            f"{where} [trace]: {source.path} has no arrival spread to time-scale to a rate; "
            "remove rates (and rate)"
        )
    return SweepSpec(source, points)


def _check_named_files(config: RunConfig, checked: set[tuple[str, str]]) -> None:
    """Read the model, hardware and profile ``config`` names (each once over all points, in
    ``checked``), so that a preset or file that does not exist is refused before any point
    runs rather than reported by each point that names it."""
    from core.model.presets import load_model_spec
    from sim.costmodel.profile import load_profile
    from sim.specs.hardware_file import load_hardware

    for option, value, load in (
        ("model", config.model, load_model_spec),
        ("hardware", config.hardware, load_hardware),
        ("profile", config.profile, load_profile),
    ):
        if value is None or (option, str(value)) in checked:
            continue
        try:
            load(str(value))
        except (ValueError, OSError) as error:
            raise ValueError(f"{option}: {error}") from error
        checked.add((option, str(value)))


def _is_rate(value: object) -> bool:
    """Whether ``value`` is a usable arrival rate: a finite number > 0 (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value > 0


def _source(
    trace: dict[str, Any], generator: dict[str, Any], root: Path, where: str
) -> tuple[TraceSource, Trace]:
    """The spec's trace source, and its trace as read (or generated at its own rate) now: a
    trace no point could use is refused before any point runs, not reported by every point."""
    if bool(trace) == bool(generator):
        raise ValueError(f"{where}: give exactly one of [trace] (path = ...) or [generator]")
    if trace:
        keys = ("path", "format", "on_error", "rates")
        unknown = set(trace) - set(keys)
        if unknown:
            raise ValueError(
                f"{where} [trace]: unknown key(s) {sorted(unknown)}; the keys are {list(keys)}"
            )
        if not isinstance(trace.get("path"), str):
            raise ValueError(f"{where} [trace]: needs path = '...' (the trace file)")
        path = Path(trace["path"])
        path = path if path.is_absolute() else root / path
        source = TraceSource(
            path=str(path),
            format=str(trace.get("format", "auto")),
            on_error=str(trace.get("on_error", "raise")),
        )
    else:
        options = {k: v for k, v in generator.items() if k != "rates"}
        if any(_key(k) in ("output", "rate") for k in options):
            raise ValueError(f"{where} [generator]: set rates = [...], not output or rate")
        source = TraceSource(generator=tuple(sorted(options.items())))
    try:
        return source, source.load(rate=None)
    except (ValueError, OSError) as error:
        raise ValueError(f"{where} [{'trace' if trace else 'generator'}]: {error}") from error


def load_spec(path: str | Path) -> SweepSpec:
    """Read a sweep spec TOML file (see docs/sweep.md)."""
    spec_path = Path(path)
    try:
        data = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{spec_path}: not valid TOML: {error}") from error
    return parse_spec(data, spec_path.parent, str(spec_path))
