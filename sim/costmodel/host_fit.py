"""Fitting the host clock (`HostParams`) to an engine's measured whole steps, given each step's
GPU time: a least-squares fit on relative error that trusts the fast side of the data (load on a
shared machine only ever adds time), removes sustained slow episodes, and counts isolated slow
steps as the engine's own stalls (`fit_host`). Steps launched eagerly and steps replayed as
graphs are told slow, and score a candidate fit, each against their own kind (`regimes`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sim.costmodel.host_time import MIN_FIT_STEPS, HostParams, HostTime, HostTimeModel

EPISODE_MIN_STEPS = 10
"""Consecutive slow steps (in measurement order) that make an episode of outside load rather
than stalls of the engine's own."""
EPISODE_GAP_STEPS = 2
"""Steps that were not slow inside an episode, at most, between slow ones."""
SLOW_FLOOR = 0.08
"""A step is slow when it is this much (or four noise widths, if more) above the fit."""
DEVICE_BOUND = 4.0
"""A step is the GPU's when its GPU time is at least this many times its host time: there the
GPU sets the pace, an error of a fifth in the host's part moves it by 5% at most, and the GPU
time's scale is measured (``_device_scale``)."""
SCALE_ROUNDS = 8
"""At most this many turns of measuring the GPU time's scale and refitting the host at it."""
MIN_DEVICE_BOUND_STEPS = 4
"""The GPU's steps it takes to measure the scale on its time; with fewer it stays 1."""
EAGER, GRAPH, PIECES = 0, 1, 2
"""A step's host regime (``regimes``): its kernels launched one by one, its forward one CUDA
graph replay, or a graph a layer (piecewise)."""
LOWER_WEIGHT = 0.1
"""The first pass's weight of steps measured slower than the fit (0.9 for faster ones): an
expectile fit that sits near the fast steps, so that a slow majority cannot pull it up."""
_FITTED = (
    "step_s",
    "seq_s",
    "block_entry_s",
    "layer_s",
    "attention_launch_s",
    "graph_replay_s",
    "mixed_split_s",
    "piece_replay_s",
)


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured whole step: its shape in aggregate and its GPU time by the chosen clock."""

    num_chunks: int
    num_decodes: int
    max_decode_context: int
    num_block_entries: int
    device_s: float
    measured_s: float
    # The host's measured part of the step (schedule, prepare, update), when the engine
    # recorded it: the terms before the forward are fitted to it directly.
    host_s: float | None = None
    # Its rows, which say whether piecewise graphs held it (None: priced eager).
    num_tokens: int | None = None

    def host_time(self, model: HostTimeModel, entries: bool = True) -> HostTime:
        """The step's host time under ``model`` (without its block-table entries: 0)."""
        return model.host_time(
            self.num_chunks,
            self.num_decodes,
            self.max_decode_context,
            self.num_block_entries if entries else 0,
            self.num_tokens,
        )


@dataclass(frozen=True, slots=True)
class HostFit:
    """The fitted parameters and what the fit saw: each step's relative residual
    ((measured - predicted) / predicted, in measurement order), which steps it kept, the
    slow episodes it removed (first, last step index), and the scale it put on the GPU time."""

    params: HostParams
    device_scale: float
    residuals: tuple[float, ...]
    kept: tuple[bool, ...]
    episodes: tuple[tuple[int, int], ...] = ()
    num_stalls: int = 0
    candidates: dict[float, float] = field(default_factory=dict)

    @property
    def spread(self) -> float:
        """Median |relative residual| of the steps outside slow episodes (lone stalls
        included): how far the engine's own steps scatter around the fit."""
        inside = np.zeros(len(self.residuals), dtype=bool)
        for first, last in self.episodes:
            inside[first : last + 1] = True
        values = np.abs(np.array(self.residuals))[~inside]
        return float(np.median(values)) if values.size else float("nan")


def predict(model: HostTimeModel, samples: list[StepSample], scale: float = 1.0) -> np.ndarray:
    """Each step's duration under ``model`` with its GPU time multiplied by ``scale``."""
    return np.array([model.duration_s(s.host_time(model), scale * s.device_s) for s in samples])


def _rows(
    model: HostTimeModel, samples: list[StepSample], scale: float, fit_scale: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The design matrix of one regime assignment (each step launch- or GPU-bound under
    ``model``): one column per ``_FITTED`` parameter (and the GPU scale when ``fit_scale``),
    and the part of each step's time that no fitted parameter carries."""
    params, layers, heads = model.params, model.num_layers, model.kv_heads
    theta = params.overlap_loss
    counts = replace(
        params, layer_s=0.0, attention_launch_s=1.0, mixed_split_s=0.0, piece_replay_s=0.0
    )
    attn = HostTimeModel(counts, layers, heads)
    rows, fixed = [], []
    for s in samples:
        host = s.host_time(model)
        seqs = s.num_chunks + s.num_decodes
        row = [1.0, float(seqs), float(s.num_block_entries)]
        if host.graphs:
            row += [0.0, 0.0, 1.0, 0.0, 0.0]
            on_device = 1.0
        else:
            launches = s.host_time(attn, entries=False)
            launch_bound = params.launches_kernels and host.launch_s >= scale * s.device_s
            on_launch = 1.0 if launch_bound else theta
            on_device = theta if launch_bound else 1.0
            mixed = s.num_chunks and model.splits(s.num_decodes, s.max_decode_context)
            pieces = model.on_pieces(s.num_tokens)
            row += [0.0 if pieces else on_launch * layers, on_launch * launches.launch_s, 0.0]
            row.append(on_launch * layers if mixed else 0.0)
            row.append(on_launch * (layers + 1) if pieces else 0.0)
        if fit_scale:
            row.append(on_device * s.device_s)
            fixed.append(0.0)
        else:
            fixed.append(on_device * scale * s.device_s)
        rows.append(row)
    return np.array(rows), np.array(fixed)


def _solve(
    data: np.ndarray, target: np.ndarray, weight: np.ndarray, active: list[int]
) -> np.ndarray:
    """Weighted least squares over the ``active`` columns, dropping any that come out negative
    (each is a non-negative cost) until none does."""
    coef = np.zeros(data.shape[1])
    while active:
        sol = np.linalg.lstsq(data[:, active] * weight[:, None], target * weight, rcond=None)[0]
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        active = [a for a, v in zip(active, sol, strict=True) if v >= 0]
    return coef


def _fit_once(
    model: HostTimeModel,
    samples: list[StepSample],
    keep: np.ndarray,
    scale: float,
    fit_scale: bool,
    lower: bool,
    before_known: bool = False,
) -> tuple[HostTimeModel, float]:
    """Alternate regime assignment and least squares until the assignment settles; ``lower``
    weighs steps above the fit by ``LOWER_WEIGHT`` (an expectile near the fast steps).
    ``before_known``: the per-step, per-sequence and per-entry terms stay as they are.

    Without measured host times, block-table entries are not fitted: on a calibration grid
    they grow with the context, as the attention does, and take its share."""
    measured = np.array([s.measured_s for s in samples])
    active = [] if before_known else [0, 1]
    if model.params.layer_s or model.params.attention_launch_s:
        active += [3, 4, 6]
    if model.params.cuda_graphs:
        active.append(5)
    if model.params.piecewise_graphs:
        active.append(7)
    if fit_scale:
        active.append(len(_FITTED))
    for _ in range(30):
        data, fixed = _rows(model, samples, scale, fit_scale)
        weight = 1.0 / measured
        if lower:
            above = measured > predict(model, samples, scale)
            weight = weight * np.where(above, LOWER_WEIGHT, 1 - LOWER_WEIGHT)
        # The columns not fitted keep their values: their part of each step is known.
        current = np.array([float(getattr(model.params, name)) for name in _FITTED] + [scale])
        inactive = [c for c in range(data.shape[1]) if c not in active]
        known = data[:, inactive] @ current[inactive] if inactive else 0.0
        coef = _solve(data[keep], (measured - fixed - known)[keep], weight[keep], active)
        coef[inactive] = current[inactive]
        values: dict[str, Any] = {name: float(v) for name, v in zip(_FITTED, coef, strict=False)}
        fitted = replace(model.params, **values)
        new_scale = float(coef[len(_FITTED)]) if fit_scale else scale
        new_model = HostTimeModel(fitted, model.num_layers, model.kv_heads)
        if fitted == model.params and new_scale == scale:
            break
        model, scale = new_model, new_scale
    return model, scale


def regimes(model: HostTimeModel, samples: list[StepSample]) -> np.ndarray:
    """Each step's host regime under ``model``'s flags: ``EAGER`` (each kernel launched),
    ``GRAPH`` (the forward one graph replay) or ``PIECES`` (a graph a layer). Their host times
    differ by a hundredfold, and each has its own launch terms: a step is slow against the
    steps of its own kind, and a fit is scored on each kind alike."""
    return np.array(
        [
            GRAPH
            if s.host_time(model).graphs
            else PIECES
            if model.on_pieces(s.num_tokens)
            else EAGER
            for s in samples
        ],
        dtype=int,
    )


def _slow_by_regime(relative: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """``_slow`` over the steps of each regime apart: each its own fast mode and width (a
    regime that the fit prices badly must not make the other's steps look fast, nor its own
    steps all look slow against the other's mode)."""
    slow = np.zeros(len(relative), dtype=bool)
    for kind in np.unique(kinds):
        own = kinds == kind
        slow[own] = _slow(relative[own])
    return slow


def _score(fit: HostFit, clean: np.ndarray, kinds: np.ndarray) -> float:
    """A candidate fit's score: the mean over regimes of the median |relative residual| of
    their steps in ``clean``. The eager launch terms and the overlap loss move only the eager
    steps, which a calibration may hold few of beside the graph replays."""
    residuals = np.abs(np.array(fit.residuals))
    medians = [float(np.median(residuals[clean & (kinds == k)])) for k in np.unique(kinds[clean])]
    return float(np.mean(medians)) if medians else float("inf")


def _slow(relative: np.ndarray) -> np.ndarray:
    """Steps well above the fast mode of the residuals: its centre is the middle of the
    densest half of the residuals below their median (load on a shared machine only adds
    time, so the fast side is the engine's own), its width the one-sided spread below it."""
    lower = np.sort(relative[relative <= np.median(relative)])
    size = max(2, len(lower) // 2)
    if len(lower) < size:
        return np.zeros(len(relative), dtype=bool)
    spans = lower[size - 1 :] - lower[: len(lower) - size + 1]
    first = int(np.argmin(spans))
    centre = float(np.median(lower[first : first + size]))
    below = centre - relative[relative <= centre]
    width = 1.4826 * float(np.median(below)) if below.size else 0.0
    slow: np.ndarray = relative > centre + max(SLOW_FLOOR, 4 * width)
    return slow


def _episodes(slow: np.ndarray) -> list[tuple[int, int]]:
    """Runs of slow steps (as (first, last)) that span at least ``EPISODE_MIN_STEPS`` steps,
    a run bridging up to ``EPISODE_GAP_STEPS`` steps that were not slow (load comes and goes
    within an episode)."""
    runs, start, last = [], None, -1
    for idx, is_slow in enumerate(slow.tolist()):
        if not is_slow:
            continue
        if start is not None and idx - last > EPISODE_GAP_STEPS + 1:
            runs.append((start, last))
            start = None
        if start is None:
            start = idx
        last = idx
    if start is not None:
        runs.append((start, last))
    return [(a, b) for a, b in runs if b - a + 1 >= EPISODE_MIN_STEPS]


def fit_host(
    samples: list[StepSample],
    start: HostParams,
    num_layers: int,
    kv_heads: int,
    overlap_losses: tuple[float, ...] = (0.0, 0.15, 0.3, 0.5, 0.75, 1.0),
    fit_scale: bool = False,
) -> HostFit:
    """Fit ``start``'s per-step, per-sequence, per-block-entry, per-layer and per-launch
    seconds (and its graph replay when it has graphs) to the measured ``samples``, for each
    of ``overlap_losses`` in turn, keeping the one that fits best (``_score``: each regime's
    steps alike); the GPU time's scale too when ``fit_scale``, else at 1 or at the scale the
    GPU's own steps measure, whichever fits better (one scale serves every regime, and the
    eager prefills that measure it need not speak for the graph replays).

    Each pass: an expectile fit near the fast steps; steps more than ``SLOW_FLOOR`` (or four
    noise widths) above it are slow; slow runs of ``EPISODE_MIN_STEPS`` or more are outside
    load and dropped, lone slow steps are the engine's stalls; then least squares on relative
    error over the rest. A step is slow against its own regime's steps. The stall share is what
    the lone slow steps added, over the host time of the steps counted."""
    if len(samples) < MIN_FIT_STEPS:
        raise ValueError(
            f"fitting the host clock needs at least {MIN_FIT_STEPS} measured steps, "
            f"got {len(samples)}"
        )
    base = replace(start, stall_share=0.0)
    measured_before = _fit_before(samples)
    if measured_before is not None:
        base = replace(base, **measured_before)
    fits = [
        (theta, fit)
        for theta in overlap_losses
        for fit in _fit_theta(
            samples, replace(base, overlap_loss=theta), num_layers, kv_heads, fit_scale
        )
    ]
    # Every candidate is scored on the same steps: those outside the episodes of the one that
    # left out the fewest (a fit that calls most steps an episode cannot win by it).
    lenient = min((f for _, f in fits), key=lambda f: sum(b - a + 1 for a, b in f.episodes))
    clean = ~_inside(lenient.episodes, len(samples))
    kinds = regimes(HostTimeModel(base, num_layers, kv_heads), samples)
    scores = [_score(fit, clean, kinds) for _, fit in fits]
    candidates: dict[float, float] = {}
    for (theta, _), score in zip(fits, scores, strict=True):
        candidates[theta] = min(score, candidates.get(theta, float("inf")))
    # Fits that tie to rounding (noise-free steps) go to the first: the lower overlap loss, and
    # the scale the GPU's own steps measured (a median need not see the few steps that do).
    floor = min(scores) + 1e-12
    best = next(fit for (_, fit), score in zip(fits, scores, strict=True) if score <= floor)
    return replace(best, candidates=candidates)


def _inside(episodes: tuple[tuple[int, int], ...], size: int) -> np.ndarray:
    inside = np.zeros(size, dtype=bool)
    for first, last in episodes:
        inside[first : last + 1] = True
    return inside


def _host_timed(samples: list[StepSample]) -> list[StepSample]:
    """The steps that measured their host part, when at least ``MIN_FIT_STEPS`` did (a
    calibration's check steps, timed before the grid, do not), else none."""
    timed = [s for s in samples if s.host_s is not None and s.host_s > 0]
    return timed if len(timed) >= MIN_FIT_STEPS else []


def _fit_before(samples: list[StepSample]) -> dict[str, Any] | None:
    """``step_s``, ``seq_s`` and ``block_entry_s`` fitted to the steps' measured host time
    (least squares on relative error, each non-negative), where enough steps measured it
    (``_host_timed``)."""
    timed = _host_timed(samples)
    if not timed:
        return None
    host = np.array([float(s.host_s or 0.0) for s in timed])
    data = np.array(
        [[1.0, s.num_chunks + s.num_decodes, s.num_block_entries] for s in timed], dtype=float
    )
    coef = _solve(data, host, 1.0 / host, [0, 1, 2])
    return dict(zip(("step_s", "seq_s", "block_entry_s"), map(float, coef), strict=True))


def _device_scale(model: HostTimeModel, samples: list[StepSample]) -> float | None:
    """The scale on the GPU time that the GPU's own steps measure: over the steps whose GPU
    time is at least ``DEVICE_BOUND`` times their host time, the median of (measured - the
    host's part of the step) / GPU time, the host's part being what ``model`` adds to the GPU
    time there. None with fewer than ``MIN_DEVICE_BOUND_STEPS`` such steps.

    The host's steps fit the host's terms, where the GPU time hardly shows; these steps are
    the only ones that tell how fast the GPU ran against the roofline (or the tables)."""
    ratios = []
    for sample in samples:
        host = sample.host_time(model)
        if host.graphs or sample.device_s < DEVICE_BOUND * max(host.total_s, 1e-12):
            continue
        rest = model.duration_s(host, sample.device_s) - sample.device_s
        ratios.append((sample.measured_s - rest) / sample.device_s)
    if len(ratios) < MIN_DEVICE_BOUND_STEPS:
        return None
    scale = float(np.median(ratios))
    return scale if scale > 0 else None


def _fit_theta(
    samples: list[StepSample], params: HostParams, layers: int, heads: int, fit_scale: bool
) -> tuple[HostFit, ...]:
    """The fits at one overlap loss: with the GPU time at the scale its own steps measure, when
    they measure one and ``fit_scale`` does not free it, and with the GPU time as it is
    (``fit_host`` keeps the better)."""
    fit = first = _fit_theta_at(samples, params, layers, heads, fit_scale, 1.0)
    if fit_scale:
        return (fit,)
    # Every step counts, those the host's fit calls slow too: the GPU's steps sit above a fit
    # at the GPU time as given, and a slow host hardly moves a step four times its time. The
    # host's terms, refitted at the new scale, move the host's part of those steps, so the two
    # are measured in turn while each turn moves the scale less than the one before; a turn
    # that moves it more is walking off (both pinned by the same steps) and is not taken.
    step = float("inf")
    for _ in range(SCALE_ROUNDS):
        scale = _device_scale(HostTimeModel(fit.params, layers, heads), samples)
        if scale is None:
            break
        change = abs(scale - fit.device_scale)
        if change >= step:
            break
        step = change
        fit = _fit_theta_at(samples, params, layers, heads, fit_scale, scale)
        if change < 1e-4 * scale:
            break
    return (fit,) if fit is first else (fit, first)


def _fit_theta_at(
    samples: list[StepSample],
    params: HostParams,
    layers: int,
    heads: int,
    fit_scale: bool,
    scale: float,
) -> HostFit:
    measured = np.array([s.measured_s for s in samples])
    model = HostTimeModel(params, layers, heads)
    # With the host's part measured, only the launch terms (and the scale) are left to fit.
    measured_before = bool(_host_timed(samples))
    keep = np.ones(len(samples), dtype=bool)
    kinds = regimes(model, samples)
    model, scale = _fit_once(model, samples, keep, scale, fit_scale, True, measured_before)
    episodes: list[tuple[int, int]] = []
    lone = np.zeros(len(samples), dtype=bool)
    for _ in range(3):
        predicted = predict(model, samples, scale)
        relative = (measured - predicted) / predicted
        slow = _slow_by_regime(relative, kinds)
        episodes = _episodes(slow)
        in_episode = np.zeros(len(samples), dtype=bool)
        for first, last in episodes:
            in_episode[first : last + 1] = True
        lone = slow & ~in_episode
        keep = ~slow
        model, scale = _fit_once(model, samples, keep, scale, fit_scale, False, measured_before)
    predicted = predict(model, samples, scale)
    hosts = [s.host_time(model) for s in samples]
    host_total = np.array([h.total_s for h in hosts])
    counted = ~slow | lone
    host_sum = float(np.sum(host_total[counted]))
    stall = float(np.sum((measured - predicted)[lone]) / host_sum) if host_sum > 0 else 0.0
    params = replace(model.params, stall_share=max(0.0, stall))
    relative = (measured - predicted) / predicted
    return HostFit(
        params=params,
        device_scale=scale,
        residuals=tuple(float(r) for r in relative),
        kept=tuple(bool(k) for k in keep),
        episodes=tuple(episodes),
        num_stalls=int(lone.sum()),
    )
