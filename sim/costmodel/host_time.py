"""The host's clock of an engine step: what the CPU spends on one step as a function of its
shape (`HostParams`: per step, per scheduled sequence, per block-table entry, per sampled row,
per layer launch), and how that combines with the GPU's clock into the step's duration
(`HostTimeModel.duration_s`). One model, one parameter set per engine (docs/host_time.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from sim.costmodel.step_shape import StepShape

ENGINE_KINDS: Final = ("vllm", "servesim-eager", "servesim-graphs", "servesim-piecewise")
"""The engines with a documented host parameter set (``host_params``)."""


HOST_SECONDS: Final = (
    "step_s",
    "seq_s",
    "block_entry_s",
    "sampled_row_s",
    "layer_s",
    "attention_launch_s",
    "graph_replay_s",
    "mixed_split_s",
    "piece_replay_s",
)
"""The fields of ``HostParams`` that are seconds of the host's work (what a slower host
stretches: ``HostParams.at_speed``)."""


@dataclass(frozen=True, slots=True)
class HostParams:
    """Seconds of host work per unit of a step's shape, and how the host and the GPU overlap.

    A step's host work is split by when it runs (``HostTime``): *before* the forward (the
    scheduler, input preparation: ``step_s``, ``seq_s``, ``block_entry_s``), *launch* while
    the GPU runs it (issuing each decoder layer's kernels: ``layer_s`` plus
    ``attention_launch_s`` per attention-side launch, or one ``graph_replay_s``) and *after*
    the GPU's result (the sampler's per-row work: ``sampled_row_s``). How they meet the GPU's
    time is ``HostTimeModel.duration_s``.
    """

    step_s: float = 0.0
    seq_s: float = 0.0
    block_entry_s: float = 0.0
    sampled_row_s: float = 0.0
    layer_s: float = 0.0
    attention_launch_s: float = 0.0
    graph_replay_s: float = 0.0
    # The share of the shorter of (kernel launching, GPU work) that an eager forward does not
    # hide: 0 when the host runs ahead freely, 1 when every kernel waits for its launch.
    overlap_loss: float = 0.0
    # Host stalls (garbage collection, page faults, the OS) as an expected share of the host's
    # time: a mean over steps, so that per-request means (TPOT) see them.
    stall_share: float = 0.0
    # vLLM >= 0.14: the host prepares step n + 1 while the GPU runs step n, so a step lasts the
    # longer of the two clocks, not their sum.
    async_scheduling: bool = False
    # Decode-only steps replay a captured CUDA graph: one launch for the whole forward.
    cuda_graphs: bool = False
    # The decode kernel splits each sequence's context over programs (one more launch a
    # layer, the reduction) when sequences x kv heads < this many programs (0: never) and the
    # batch's longest context reaches ``split_min_context``.
    split_programs: int = 0
    split_min_context: int = 449
    # Per layer, a step that prefills beside decodes whose kernel splits: what servesim's
    # engine at 8d1f2ca spends beyond the launches counted (measured, not explained).
    mixed_split_s: float = 0.0
    # The other steps of at most ``piecewise_max_tokens`` tokens replay piecewise graphs
    # (``engine.mixed_graphs``): one ``piece_replay_s`` a layer (and one more) in place of
    # ``layer_s``, and only the attention's own launches beside it.
    piecewise_graphs: bool = False
    piece_replay_s: float = 0.0
    piecewise_max_tokens: int = 512

    def __post_init__(self) -> None:
        for name in (*HOST_SECONDS, "stall_share"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value < math.inf):
                raise ValueError(f"HostParams.{name} must be finite and >= 0, got {value!r}")
        if not 0 <= self.overlap_loss <= 1:
            raise ValueError(
                f"HostParams.overlap_loss must be in [0, 1], got {self.overlap_loss!r}"
            )
        for name in ("split_programs", "split_min_context", "piecewise_max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"HostParams.{name} must be >= 0, got {getattr(self, name)!r}")

    def at_speed(self, slowdown: float) -> HostParams:
        """This set on a host ``slowdown`` times slower (0.8: faster): every second of host
        work (``HOST_SECONDS``) scaled; the shares, counts and flags kept."""
        if not (isinstance(slowdown, int | float) and 0 < slowdown < math.inf):
            raise ValueError(f"a host slowdown must be finite and > 0, got {slowdown!r}")
        if slowdown == 1:
            return self
        return replace(self, **{name: getattr(self, name) * slowdown for name in HOST_SECONDS})

    @property
    def launches_kernels(self) -> bool:
        """Whether the forward's kernel launches are priced (an eager engine's host clock)."""
        return bool(
            self.layer_s
            or self.attention_launch_s
            or self.graph_replay_s
            or self.mixed_split_s
            or self.piece_replay_s
        )

    @property
    def per_sequence_only(self) -> bool:
        """Whether the host's time depends on the number of sequences alone (``step_s`` +
        ``seq_s`` per sequence): the simulator's fast paths then price it as before."""
        return not (
            self.launches_kernels or self.block_entry_s or self.sampled_row_s or self.stall_share
        )


# vLLM 0.19 (async scheduling on by default since 0.14.0, CUDA graphs for decode): the host's
# per-step and per-sequence work, overlapped with the GPU's previous step. Sources in
# docs/host_time.md.
VLLM_HOST: Final = HostParams(step_s=2e-3, seq_s=1e-5, async_scheduling=True)

# servesim's own engine at 8d1f2ca, eager, on the H200 machine's host (16 cores, Python 3.12,
# torch 2.11): fitted on the recorded calibration's whole steps (cal1) and read against the
# code (docs/host_time.md, ../shared/gpu-runs/h200-2026-11-27/host-overhead.md).
SERVESIM_EAGER_HOST: Final = HostParams(
    seq_s=2.1e-5,
    layer_s=3.8e-4,
    attention_launch_s=3.5e-5,
    overlap_loss=0.0,
    stall_share=0.049,
    split_programs=264,
    mixed_split_s=1.8e-4,
)

# servesim's engine with a persistent batch and CUDA graphs for decode-only steps: the same
# host for prefills, one graph replay for decodes. A decode step's host time as the two GPU
# checks' calibrations fitted it from their whole steps (254 us + 7.1 us a sequence on
# 2026-11-28, 262 + 9.1 on 2026-11-27; benchmarks/refit_gpu.py), priced since the roofline
# prices servesim's fused kernels and LM head as measured (docs/host_time.md).
SERVESIM_GRAPHS_HOST: Final = replace(
    SERVESIM_EAGER_HOST, seq_s=7e-6, graph_replay_s=2.5e-4, cuda_graphs=True
)

# The same engine with ``--mixed-graphs piecewise``: its other steps of up to 512 tokens
# replay a graph per layer (a replay's host cost estimated from the decode graphs' ~100 us for
# a whole forward of 32 layers plus the call, until a GPU check measures it).
SERVESIM_PIECEWISE_HOST: Final = replace(
    SERVESIM_GRAPHS_HOST, piecewise_graphs=True, piece_replay_s=1e-5
)

_PRESETS: Final = {
    "vllm": VLLM_HOST,
    "servesim-eager": SERVESIM_EAGER_HOST,
    "servesim-graphs": SERVESIM_GRAPHS_HOST,
    "servesim-piecewise": SERVESIM_PIECEWISE_HOST,
}


MIN_FIT_STEPS: Final = 5
"""Whole measured steps a profile needs before its host set is fitted (``host_fit.fit_host``)."""


def host_params(kind: str, async_scheduling: bool | None = None) -> HostParams:
    """The documented parameter set of engine ``kind`` (ENGINE_KINDS); ``async_scheduling``
    overrides vLLM's default (servesim's engine never overlaps steps)."""
    if kind not in _PRESETS:
        raise ValueError(f"engine kind must be one of {ENGINE_KINDS}, got {kind!r}")
    params = _PRESETS[kind]
    if async_scheduling is None or async_scheduling == params.async_scheduling:
        return params
    if kind != "vllm":
        raise ValueError(f"engine kind {kind!r} has no async scheduling")
    return replace(params, async_scheduling=async_scheduling)


def host_args(shape: StepShape, block_size: int) -> tuple[int, int, int, int]:
    """``HostTimeModel.host_time``'s arguments of ``shape``: chunks, decodes, the longest
    decode context and block-table entries (of ``block_size`` tokens)."""
    bs = block_size
    entries = sum(-(-c // bs) for c in shape.decode_context_tokens)
    entries += sum(-(-(new + context) // bs) for new, context in shape.prefill_chunks)
    contexts = shape.decode_context_tokens
    return len(shape.prefill_chunks), len(contexts), max(contexts, default=0), entries


@dataclass(frozen=True, slots=True)
class HostTime:
    """One step's host seconds by when they run: ``before_s`` the GPU waits for (scheduling,
    input preparation), ``launch_s`` issuing the forward while it runs, ``after_s`` once its
    result is back (sampling); ``graphs`` when the forward is one graph replay."""

    before_s: float
    launch_s: float
    after_s: float
    graphs: bool = False

    @property
    def total_s(self) -> float:
        return self.before_s + self.launch_s + self.after_s


class HostTimeModel:
    """``HostParams`` applied to the steps of one model: ``host_time`` from a step's shape in
    aggregate, ``duration_s`` combining it with the step's GPU time."""

    def __init__(self, params: HostParams, num_layers: int, kv_heads: int) -> None:
        if num_layers < 1 or kv_heads < 1:
            raise ValueError(f"need num_layers, kv_heads >= 1, got {num_layers}, {kv_heads}")
        self.params, self.num_layers, self.kv_heads = params, num_layers, kv_heads
        self.simple = params.per_sequence_only

    def splits(self, num_decodes: int, max_decode_context: int) -> bool:
        """Whether the decode kernel splits this batch's contexts (one launch more a layer)."""
        p = self.params
        return bool(
            num_decodes
            and num_decodes * self.kv_heads < p.split_programs
            and max_decode_context >= p.split_min_context
        )

    def on_pieces(self, num_tokens: int | None) -> bool:
        """Whether piecewise graphs hold a step of ``num_tokens`` rows that no decode graph
        takes (``host_time`` asks that first); None, unknown, says no."""
        p = self.params
        return bool(p.piecewise_graphs and num_tokens and num_tokens <= p.piecewise_max_tokens)

    def attention_launches(
        self, num_chunks: int, num_decodes: int, split: bool, piecewise: bool = False
    ) -> int:
        """Attention-side kernel launches per layer: the KV store, the decode kernel (and its
        split reduction), the prefill kernel, and a mixed step's output buffer and its two
        slice copies (servesim's ``engine.attention.attend``). Between piecewise graphs the
        store is in the graph and the output buffer is the graph's: neither is launched."""
        launches = 0 if piecewise else 1
        if num_decodes:
            launches += 2 if split else 1
        if num_chunks:
            launches += (3 if piecewise else 4) if num_decodes else 1
        return launches

    def host_time(
        self,
        num_chunks: int,
        num_decodes: int,
        max_decode_context: int,
        num_block_entries: int,
        num_tokens: int | None = None,
    ) -> HostTime:
        """The host's seconds for a step of ``num_chunks`` prompt chunks and ``num_decodes``
        decodes (the longest of their contexts), whose block tables hold
        ``num_block_entries``. ``num_tokens`` (the step's rows) says whether piecewise graphs
        hold it; None (not known) prices it eager."""
        p = self.params
        num_seqs = num_chunks + num_decodes
        before = p.step_s + num_seqs * p.seq_s + num_block_entries * p.block_entry_s
        after = num_seqs * p.sampled_row_s
        if p.cuda_graphs and not num_chunks and num_decodes:
            return HostTime(before, p.graph_replay_s, after, graphs=True)
        if not p.launches_kernels:
            return HostTime(before, 0.0, after)
        split = self.splits(num_decodes, max_decode_context)
        pieces = self.on_pieces(num_tokens)
        launches = self.attention_launches(num_chunks, num_decodes, split, pieces)
        per_layer = (p.piece_replay_s if pieces else p.layer_s) + launches * p.attention_launch_s
        if split and num_chunks:
            per_layer += p.mixed_split_s
        launch = self.num_layers * per_layer + (p.piece_replay_s if pieces else 0.0)
        return HostTime(before, launch, after)

    def duration_s(self, host: HostTime, device_s: float) -> float:
        """The step's duration from its host time and its GPU time ``device_s``.

        With async scheduling, the longer of the two. Otherwise the GPU waits for the host's
        work before the forward and the host waits for the GPU's result after it; in between,
        an eager forward's launching and its kernels run side by side (the longer of the two,
        plus ``overlap_loss`` of the shorter), a graph replay is launched before the GPU runs
        it. Host stalls add ``stall_share`` of the host's time."""
        p = self.params
        total = host.total_s
        if p.async_scheduling:
            wait = total - device_s
            duration = device_s + (wait if wait > 0.0 else 0.0)
        elif host.graphs or not host.launch_s:
            duration = device_s + total
        else:
            launch = host.launch_s
            longer, shorter = (launch, device_s) if launch >= device_s else (device_s, launch)
            duration = host.before_s + (longer + p.overlap_loss * shorter) + host.after_s
        if p.stall_share:
            duration += p.stall_share * total
        return duration

    def wait_s(self, host_s: float, device_s: float) -> float:
        """What ``host_s`` of host work before the forward adds to a step whose GPU time is
        ``device_s``, for a set that prices nothing else (``per_sequence_only``): all of it,
        or with async scheduling only what exceeds the GPU's time. The roofline's fast paths
        inline this."""
        if self.params.async_scheduling:
            return max(0.0, host_s - device_s)
        return host_s

    def overhead_s(self, host: HostTime, device_s: float) -> float:
        """A step's ``overhead`` term: what the host adds to its GPU time ``device_s``."""
        if self.simple:
            return self.wait_s(host.total_s, device_s)
        return self.duration_s(host, device_s) - device_s

    def step_overhead_s(self, shape: StepShape, block_size: int, device_s: float) -> float:
        """``overhead_s`` of ``shape``, whose KV blocks hold ``block_size`` tokens."""
        num_tokens = len(shape.decode_context_tokens) + sum(n for n, _ in shape.prefill_chunks)
        host = self.host_time(*host_args(shape, block_size), num_tokens=num_tokens)
        return self.overhead_s(host, device_s)
