"""Capacity search: the highest arrival rate at which at least a share ``goodput`` of requests
meets both SLOs in the steady state. ``find_capacity`` brackets the rate by doubling or halving,
then bisects it (in rounds of as many probes as there are workers) to a relative tolerance;
every probe is one run through the sweep executors, of the trace repeated until it is long
enough (``probe_repeats``). The ``capacity`` command is
``sim.cli.capacity``."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.experiments.sweep import (
    PointOutput,
    PointTask,
    Workers,
    _write_point,
    execute,
    resumed_output,
)
from sim.experiments.sweep_spec import (
    RATE,
    REPEATS,
    OptionValue,
    TraceSource,
)

DEFAULT_GOODPUT = 0.9
DEFAULT_REL_TOL = 0.02
MAX_DOUBLINGS = 30  # 2^30 × the start rate: past that the SLOs do not bind the rate at all


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """What "meets the SLOs" means and how finely to search."""

    goodput: float = DEFAULT_GOODPUT
    rel_tol: float = DEFAULT_REL_TOL
    start_rate: float | None = None  # None: the trace's own mean rate
    min_probe_requests: int | None = None  # None: `probe_requests`'s rule

    def __post_init__(self) -> None:
        if self.min_probe_requests is not None and not self.min_probe_requests >= 1:
            raise ValueError(
                f"min_probe_requests must be >= 1 request, got {self.min_probe_requests!r}"
            )
        if not 0 < self.goodput <= 1:
            raise ValueError(f"goodput must be in (0, 1], got {self.goodput!r}")
        if not 0 < self.rel_tol < 1:
            raise ValueError(f"rel_tol must be in (0, 1), got {self.rel_tol!r}")
        if self.start_rate is not None and not self.start_rate > 0:
            raise ValueError(f"start_rate must be > 0 req/s, got {self.start_rate!r}")


@dataclass
class CapacityResult:
    """The bracket ``[low_rate, high_rate]``: ``low_rate`` passed, ``high_rate`` failed (None:
    none failed, or none passed for ``low_rate``)."""

    low_rate: float | None = None
    high_rate: float | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def capacity_rate(self) -> float | None:
        """The highest passing rate below the lowest failure; None when the search failed."""
        return None if self.error else self.low_rate


Runner = Callable[[list[float]], list[PointOutput]]
# A search is a generator: it yields the rates it wants probed, is sent their rows (in the same
# order) and returns its result, so that many searches can share one batch of probes per round.
Search = Generator[list[float], list[dict[str, Any]], CapacityResult]
Asks = Generator[list[float], list[dict[str, Any]], list[bool]]


def passes(row: Mapping[str, Any], goodput: float) -> bool:
    """A probe passes when it ran, its SLO attainment reaches ``goodput``, and it was not
    overloaded: a queue that grows through the whole run has no steady state, however many of
    its requests a finite run saw within the SLOs."""
    attained = row.get("slo_attainment")
    if row.get("status") != "ok" or attained is None or row.get("overloaded") is True:
        return False
    return float(attained) >= goodput


def _probe(rates: list[float], result: CapacityResult, goodput: float) -> Asks:
    rows = yield rates
    for row in rows:
        if row.get("status") != "ok":
            raise ValueError(f"probe at {row.get(RATE)} req/s failed: {row.get('error')}")
        result.probes.append(row)
        num_requests = row.get("num_requests")
        if num_requests and row.get("rejected") == num_requests:
            # A request is rejected for what it is (too long for the model or the cache), not
            # for when it arrives: no other rate can do better.
            reason = row.get("reject_reason") or "no reason recorded"
            raise ValueError(
                f"every request is rejected, at any rate (probe at {row.get(RATE)} req/s): {reason}"
            )
    return [passes(row, goodput) for row in rows]


def _bracket(start: float, width: int, result: CapacityResult, goodput: float) -> Asks:
    first = (yield from _probe([start], result, goodput))[0]
    factor = 2.0 if first else 0.5
    result.low_rate, result.high_rate = (start, None) if first else (None, start)
    for step in range(1, MAX_DOUBLINGS + 1, width):
        rates = [start * factor**k for k in range(step, min(step + width, MAX_DOUBLINGS + 1))]
        oks = yield from _probe(rates, result, goodput)
        for rate, ok in zip(rates, oks, strict=True):
            if ok and first:
                result.low_rate = rate
            elif not ok and first:
                result.high_rate = rate
                return []
            elif ok:  # going down: the first pass closes the bracket
                result.low_rate = rate
                return []
            else:
                result.high_rate = rate
    limit = start * factor**MAX_DOUBLINGS
    raise ValueError(
        f"no bracket: every rate {'up to' if first else 'down to'} {limit:.6g} req/s "
        f"{'meets' if first else 'misses'} the SLOs"
    )


def search(start: float, settings: SearchSettings, width: int) -> Search:
    """Bracket then bisect, ``width`` probes per round (doublings, or rates splitting the
    bracket geometrically)."""
    if width < 1:
        raise ValueError(f"width must be >= 1 probe per round, got {width}")
    result = CapacityResult()
    try:
        yield from _bracket(start, width, result, settings.goodput)
        while True:
            low, high = result.low_rate, result.high_rate
            assert low is not None and high is not None
            if (high - low) / low <= settings.rel_tol:
                return result
            # Geometric split: the bracket spans up to a factor of two.
            rates = [low * (high / low) ** (j / (width + 1)) for j in range(1, width + 1)]
            oks = yield from _probe(rates, result, settings.goodput)
            for rate, ok in zip(rates, oks, strict=True):
                if ok:
                    result.low_rate = rate
                else:
                    result.high_rate = rate
                    break
    except ValueError as error:
        result.error = str(error)
        return result


Prober = Callable[[list[tuple[int, float]]], list[dict[str, Any]]]


def run_searches(searches: Sequence[Search], probe: Prober) -> list[CapacityResult]:
    """Drive every search to its end; each round sends all their asks to ``probe`` at once as
    (search index, rate) pairs, so that C searches keep C × width workers busy."""
    results: dict[int, CapacityResult] = {}
    asks: dict[int, list[float]] = {}

    def advance(idx: int, rows: list[dict[str, Any]] | None) -> None:
        try:
            asks[idx] = searches[idx].send(rows)  # type: ignore[arg-type]  # None starts it
        except StopIteration as stop:
            results[idx] = stop.value

    for idx in range(len(searches)):
        advance(idx, None)
    while asks:
        current = dict(asks)
        asks.clear()
        rows = iter(probe([(idx, rate) for idx, rates in current.items() for rate in rates]))
        for idx, rates in current.items():
            advance(idx, [next(rows) for _ in rates])
    return [results[idx] for idx in range(len(searches))]


def find_capacity(
    run: Runner, start: float, settings: SearchSettings, width: int
) -> CapacityResult:
    """One search; ``run`` simulates a list of rates and returns their outputs."""

    def probe(batch: list[tuple[int, float]]) -> list[dict[str, Any]]:
        return [output.row for output in run([rate for _, rate in batch])]

    return run_searches([search(start, settings, width)], probe)[0]


class ProbeRunner:
    """Runs probes as sweep points on ``workers``, each at most once: a probe whose options
    (configuration plus rate) were already run in this search, or whose folder under ``out``
    holds a complete run with those options, is read back instead of run again."""

    def __init__(
        self,
        source: TraceSource,
        configs: Sequence[Mapping[str, OptionValue]],
        workers: Workers,
        out: Path | None,
        repeats: Callable[[int, float], int] = lambda config_idx, rate: 1,
    ) -> None:
        self.source, self.configs, self.workers, self.out = source, configs, workers, out
        self.repeats = repeats  # how many times a probe (configuration, rate) replays the trace
        self.cache: dict[str, dict[str, Any]] = {}
        self.num_run = self.num_reused = 0

    def __call__(self, batch: list[tuple[int, float]]) -> list[dict[str, Any]]:
        keys: list[str] = []
        todo: dict[str, PointTask] = {}
        for config_idx, rate in batch:
            options = {**self.configs[config_idx], RATE: rate}
            copies = self.repeats(config_idx, rate)
            if copies > 1:  # (a probe of the trace as it is keeps the identity it always had)
                options[REPEATS] = copies
            task = PointTask(
                len(self.cache) + len(todo), tuple(sorted(options.items())), self.source
            )
            key = json.dumps(task.identity, sort_keys=True)
            keys.append(key)
            if key in self.cache or key in todo:
                self.num_reused += 1
                continue
            resumed = resumed_output(task, self.out) if self.out is not None else None
            if resumed is not None:
                self.cache[key] = resumed.row
                self.num_reused += 1
            else:
                todo[key] = task
        out = self.out
        outputs = execute(
            list(todo.values()),
            self.workers,
            keep_files=out is not None,
            on_output=(lambda o: _write_point(out, o)) if out is not None else None,
        )
        self.num_run += len(outputs)
        self.cache.update(zip(todo, (o.row for o in outputs), strict=True))
        rows = []
        for (config_idx, _), key in zip(batch, keys, strict=True):
            rows.append({**self.cache[key], "config": config_idx})
        return rows
