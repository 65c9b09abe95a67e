"""Fitting the host clock to measured whole steps: known parameters come back, a sustained slow
episode (outside load) is left out, lone slow steps become the stall share, graph replays and
eager launches are each fitted on their own terms."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.costmodel.host_fit import (
    EPISODE_MIN_STEPS,
    StepSample,
    _device_scale,
    fit_host,
    predict,
)
from sim.costmodel.host_time import HostParams, HostTimeModel

TRUTH = HostParams(seq_s=2e-5, layer_s=3.5e-4, attention_launch_s=3e-5, split_programs=264)
START = HostParams(seq_s=1e-5, layer_s=3e-4, attention_launch_s=2e-5, split_programs=264)


def _samples(noise: float = 0.0, seed: int = 0) -> list[StepSample]:
    """Decode steps of 1-64 sequences at short and long contexts, and prefill steps, whose GPU
    time runs from far below the launches to far above them."""
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(6):
        for seqs in (1, 2, 4, 8, 16, 32, 48, 64):
            for context in (64, 2000):
                shapes.append(StepSample(0, seqs, context, seqs * context // 16, 4e-3, 0.0))
        for tokens in (64, 256, 1024, 4096):
            shapes.append(StepSample(1, 0, 0, tokens // 16, 1.2e-5 * tokens + 3e-3, 0.0))
    model = HostTimeModel(TRUTH, 32, 8)
    times = predict(model, shapes)
    times = times * (1 + noise * rng.standard_normal(len(times)))
    return [replace(s, measured_s=float(t)) for s, t in zip(shapes, times, strict=True)]


def test_known_parameters_come_back() -> None:
    fit = fit_host(_samples(), START, 32, 8)
    assert fit.params.layer_s == pytest.approx(TRUTH.layer_s, rel=1e-3)
    assert fit.params.attention_launch_s == pytest.approx(TRUTH.attention_launch_s, rel=1e-3)
    assert fit.params.seq_s == pytest.approx(TRUTH.seq_s, rel=1e-3)
    assert fit.params.overlap_loss == 0.0 and fit.spread < 1e-6
    assert fit.episodes == () and fit.num_stalls == 0


def test_a_slow_episode_is_left_out_and_lone_stalls_are_counted() -> None:
    samples = _samples(noise=0.01)
    slowed = [
        replace(s, measured_s=1.6 * s.measured_s) if 40 <= i < 40 + 3 * EPISODE_MIN_STEPS else s
        for i, s in enumerate(samples)
    ]
    for i in (5, 90, 110):  # lone stalls: +40%
        slowed[i] = replace(slowed[i], measured_s=1.4 * slowed[i].measured_s)
    fit = fit_host(slowed, START, 32, 8)
    assert fit.episodes == ((40, 40 + 3 * EPISODE_MIN_STEPS - 1),)
    assert fit.num_stalls == 3
    assert fit.params.layer_s == pytest.approx(TRUTH.layer_s, rel=0.03)
    assert 0 < fit.params.stall_share < 0.05
    assert 0.005 < fit.spread < 0.02


def test_too_few_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 5 measured steps"):
        fit_host(_samples()[:3], START, 32, 8)


def test_piecewise_replays_are_fitted_beside_the_eager_launches() -> None:
    """An engine with decode graphs and piecewise graphs, its host's part of each step
    measured: decode-only steps replay one graph, steps with a chunk of up to 512 tokens one
    piece a layer, larger ones launch eagerly. Each kind pins its own term; a step without a
    token count is priced eager."""
    truth = HostParams(
        step_s=1e-4, seq_s=2e-5, layer_s=3.5e-4, attention_launch_s=3e-5, graph_replay_s=1e-4,
        cuda_graphs=True, piecewise_graphs=True, piece_replay_s=2.5e-5, split_programs=264,
        mixed_split_s=1e-4,
    )  # fmt: skip
    start = replace(truth, seq_s=1e-5, layer_s=3e-4, attention_launch_s=2e-5, piece_replay_s=1e-5)
    model = HostTimeModel(truth, 32, 8)
    shapes = []
    for _ in range(4):
        for seqs in (1, 4, 16, 64):
            shapes.append(StepSample(0, seqs, 500, seqs * 32, 4e-3, 0.0, num_tokens=seqs))
            for context in (100, 2000):  # the decodes' kernel splits at 2,000 below 33 seqs
                entries = seqs * context // 16
                for tokens in (16, 128, 400, 1024):  # launch-bound: on pieces, then eager
                    device = 1e-3 if tokens <= 512 else 2e-3
                    step = StepSample(1, seqs, context, entries, device, 0.0)
                    shapes.append(replace(step, num_tokens=tokens + seqs))
        shapes.append(StepSample(1, 0, 0, 64, 2e-3, 0.0, num_tokens=1024))
    measured = [
        replace(s, measured_s=float(t), host_s=s.host_time(model).before_s)
        for s, t in zip(shapes, predict(model, shapes), strict=True)
    ]
    fit = fit_host(measured, start, 32, 8)
    for name in (
        "step_s", "seq_s", "piece_replay_s", "layer_s", "attention_launch_s", "mixed_split_s",
        "graph_replay_s",
    ):  # fmt: skip
        assert getattr(fit.params, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
    assert fit.spread < 1e-6
    # The same steps with no token count are priced as eager launches: they take longer.
    seen = [s for s in measured if s.num_chunks and s.num_decodes and s.num_tokens <= 512]
    blind = [replace(s, num_tokens=None) for s in seen]
    assert (predict(model, blind) > predict(model, seen)).all()


def test_the_gpu_time_scale_comes_from_the_steps_the_gpu_sets_the_pace_of() -> None:
    # The GPU ran 1.25x the GPU time given (the roofline's): the host's steps cannot tell, the
    # prefills of 8,192 tokens (GPU time over four times the host's) can.
    big = [StepSample(1, 0, 0, 512, 1.2e-5 * 8192 + 3e-3, 0.0) for _ in range(6)]
    shapes = _samples() + big
    measured = predict(HostTimeModel(TRUTH, 32, 8), shapes, scale=1.25)
    samples = [replace(s, measured_s=float(t)) for s, t in zip(shapes, measured, strict=True)]
    fit = fit_host(samples, START, 32, 8)
    assert fit.device_scale == pytest.approx(1.25, rel=1e-3)
    assert fit.params.layer_s == pytest.approx(TRUTH.layer_s, rel=1e-3)
    assert fit.params.seq_s == pytest.approx(TRUTH.seq_s, rel=1e-3)
    assert fit.spread < 1e-6 and fit.num_stalls == 0
    # Fewer than four such steps leave the scale at 1: the prefills the fit cannot explain sit
    # above it.
    few = fit_host(samples[:-3], START, 32, 8)
    assert few.device_scale == 1.0 and few.num_stalls >= 3
    # A decode step replayed as one graph is the GPU's too, but its host time and its GPU time
    # are pinned by the same steps: it measures no scale.
    graphs = replace(TRUTH, cuda_graphs=True, graph_replay_s=1e-4)
    decodes = [StepSample(0, 8, 500, 256, 5e-3, 0.0, num_tokens=8) for _ in range(8)]
    model = HostTimeModel(graphs, 32, 8)
    assert all(d.host_time(model).graphs for d in decodes)
    times = predict(model, decodes, scale=1.25)
    replays = [replace(d, measured_s=float(t)) for d, t in zip(decodes, times, strict=True)]
    assert _device_scale(model, replays) is None


def _two_regimes() -> tuple[HostParams, list[StepSample], list[int]]:
    """An engine with CUDA graphs: many decode-only steps replayed as one graph (a few tenths of
    a millisecond of host), and fewer steps with a prompt chunk launched eagerly (~25 ms of
    launches, far above their GPU time up to a thousand tokens, far below it for the long
    prefills). A few steps of each kind stall (+40%): the indices returned."""
    truth = HostParams(
        seq_s=1e-5, layer_s=6e-4, attention_launch_s=3e-5, graph_replay_s=5e-5,
        cuda_graphs=True, split_programs=264,
    )  # fmt: skip
    rng = np.random.default_rng(1)
    shapes = []
    for _ in range(6):
        for seqs in (1, 2, 4, 8, 16, 32, 48, 64):
            for context in (64, 2000):
                device = 5e-3 + 2e-5 * seqs
                shapes.append(StepSample(0, seqs, context, seqs * context // 16, device, 0.0))
        for tokens, decodes in ((64, 0), (256, 0), (128, 8), (512, 16), (1024, 4), (8192, 0)):
            device = 5e-3 + 2.1e-5 * tokens
            entries = tokens // 16 + decodes * 64
            shapes.append(StepSample(1, decodes, 1000 if decodes else 0, entries, device, 0.0))
    times = predict(HostTimeModel(truth, 32, 8), shapes)
    # The long prefills ran 6% slower than their GPU time says (a GPU that clocks down under
    # sustained load): the only steps that measure a scale on the GPU time.
    times = np.array([t * (1.06 if s.num_chunks and s.device_s > 0.1 else 1.0)
                      for s, t in zip(shapes, times, strict=True)])  # fmt: skip
    times = times * (1 + 0.01 * rng.standard_normal(len(times)))
    stalls = [7, 30, 50, 95, 115, 17, 63]  # five replays, two eager steps
    assert [shapes[i].num_chunks for i in stalls] == [0, 0, 0, 0, 0, 1, 1]
    for i in stalls:
        times[i] *= 1.4
    samples = [replace(s, measured_s=float(t)) for s, t in zip(shapes, times, strict=True)]
    return truth, samples, stalls


def test_eager_steps_beside_graph_replays_keep_their_launch_cost() -> None:
    """The eager steps' launches come back and are not taken for stalls: a step is slow
    against the steps of its own regime, and a fit (its overlap loss, its GPU time's scale) is
    chosen on each regime alike (the graph replays outnumber the eager steps)."""
    truth, samples, stalls = _two_regimes()
    start = replace(truth, layer_s=3.8e-4, attention_launch_s=3.5e-5, graph_replay_s=1e-4)
    fit = fit_host(samples, start, 32, 8)
    assert fit.params.overlap_loss == 0.0
    assert fit.params.layer_s == pytest.approx(truth.layer_s, rel=0.05)
    assert fit.num_stalls == len(stalls)
    # The scale the long prefills measure is not put on the replays, which it would leave
    # slower than their GPU time alone.
    assert fit.device_scale == 1.0
    # The stall share is what the seven stalls add over every step's host time: a few percent.
    assert 0 < fit.params.stall_share < 0.05
    residuals = np.array(fit.residuals)  # (without the stall share)
    eager = np.array([s.num_chunks > 0 for s in samples])
    assert np.median(np.abs(residuals[eager])) < 0.02
    assert np.median(np.abs(residuals[~eager])) < 0.02


def test_the_host_part_measured_on_most_steps_sets_the_terms_before_the_forward() -> None:
    """As on the H200 (2026-11-28): the grid's steps store their host part, the few check
    steps timed before it do not. Whole steps alone cannot tell the per-step host time from a
    graph replay (both once a step); the measured host part can."""
    truth = HostParams(
        step_s=2.5e-4, seq_s=8e-6, layer_s=6e-4, attention_launch_s=1.3e-5,
        graph_replay_s=5e-5, cuda_graphs=True, split_programs=264,
    )  # fmt: skip
    start = replace(truth, step_s=0.0, seq_s=1e-5, graph_replay_s=1e-4, layer_s=3e-4)
    model = HostTimeModel(truth, 32, 8)
    shapes = []
    for _ in range(4):
        for seqs in (1, 2, 4, 8, 16, 32, 48, 64):
            for context in (100, 2000):
                device = 4.5e-3 + 2e-5 * seqs
                shapes.append(StepSample(0, seqs, context, seqs * context // 16, device, 0.0))
        for tokens in (64, 256, 1024, 4096):  # eager: a prefill alone, and beside decodes
            shapes.append(StepSample(1, 0, 0, tokens // 16, 3e-3 + 1e-5 * tokens, 0.0))
            shapes.append(StepSample(1, 4, 2000, 500, 3e-3 + 1e-5 * tokens, 0.0))
    # The eager steps' launches move with the host (+-10%), the replays hardly (+-0.5%); the
    # host part before the forward is measured as it ran.
    rng = np.random.default_rng(0)
    noise = [0.1 if s.num_chunks else 0.005 for s in shapes]
    times = predict(model, shapes) * (1 + np.array(noise) * rng.standard_normal(len(shapes)))
    measured = [
        replace(s, measured_s=float(t), host_s=s.host_time(model).before_s)
        for s, t in zip(shapes, times, strict=True)
    ]
    checks = [replace(s, host_s=None) for s in measured[:10]]  # timed before the grid
    fit = fit_host(checks + measured[10:], start, 32, 8)
    assert fit.params.step_s == pytest.approx(truth.step_s, rel=1e-3)
    assert fit.params.seq_s == pytest.approx(truth.seq_s, rel=1e-3)
    # What is left of a replayed step is the replay (and the GPU's own noise).
    assert fit.params.graph_replay_s == pytest.approx(truth.graph_replay_s, abs=2e-5)
