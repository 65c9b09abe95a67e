"""`CalibratedCostModel`: per-step cost from a measured profile's tables, falling back to the
analytic roofline for any op the profile did not time."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from core.decode_split import split_mode_of
from sim.costmodel.calibrated_host import calibrated_host, is_cpu_profile, measured_prepare
from sim.costmodel.moe_table import moe_layer_s
from sim.costmodel.profile import Profile, StepTiming, Table1D, Table2D
from sim.costmodel.roofline import TERMS, RooflineCostModel
from sim.costmodel.step_attention import step_attention_s
from sim.costmodel.step_fit import (
    DECODE_KNOTS,
    TOKEN_KNOTS,
    hat,
    least_absolute,
    prepare_at,
    theil_sen,
)
from sim.costmodel.step_shape import StepShape

GROWING_OPS = ("linear", "elementwise", "store_kv", "lm_head", "allreduce", "copy_blocks",
               "swap_in", "swap_out")  # fmt: skip
"""Ops whose work grows with their size: a smaller call is never slower (``monotone``)."""


def monotone(table: Table1D) -> Table1D:
    """``table`` with each time at most the time of every larger size after it: a timing round
    once measured its first calls slow (on the H200, linear at one token 187 us against 123 us
    at two; elementwise 57 us against 13), which no smaller call can be."""
    times = list(table.times_s)
    for i in range(len(times) - 2, -1, -1):
        times[i] = min(times[i], times[i + 1])
    return Table1D(table.xs, tuple(times))


def own_split_fallback(profile: Profile, fallback: RooflineCostModel) -> RooflineCostModel:
    """``fallback`` with the decode split the profile's engine ran (``engine.decode_split``;
    "fixed" where it names none), so that its whole steps are priced as they ran even when the
    run priced now uses the other split; ``fallback`` itself when they are the same."""
    where = f"{profile.path}: field 'engine.decode_split'"
    split = split_mode_of(dict(profile.engine or {}), where)
    if fallback.decode_chain is None or split == fallback.config.decode_split:
        return fallback
    config = replace(fallback.config, decode_split=split)
    return RooflineCostModel(
        fallback.model, fallback.hardware, fallback.tp, config, block_size=fallback.block_size
    )


class CalibratedCostModel:
    """Per-layer tables are scaled by the layer count; step overhead is fitted to `steps`.

    The profile must have been measured for the fallback's model, tp and block size: its
    tables are only meaningful for the shapes they were timed at.
    """

    def __init__(self, profile: Profile, fallback: RooflineCostModel) -> None:
        if fallback.block_size != profile.block_size:
            raise ValueError(
                f"{profile.path}: field 'block_size': profile measured at block size "
                f"{profile.block_size}, the run uses {fallback.block_size}"
            )
        if profile.tp != fallback.tp:
            raise ValueError(
                f"{profile.path}: field 'tp': profile measured at tp={profile.tp}, "
                f"cost model wants tp={fallback.tp}"
            )
        if profile.model != fallback.model.name:
            raise ValueError(
                f"{profile.path}: field 'model': profile is for {profile.model!r}, "
                f"cost model is for {fallback.model.name!r}"
            )
        self.profile, self.fallback = profile, fallback
        # A GPU's growing ops made monotone (``monotone``). Not a CPU's: the joint fit below was
        # chosen on its tables as timed: made monotone, the recorded CPU pairs of
        # benchmarks/results/refit_cpu.txt priced their engines' own steps 1.8-2.4 points
        # worse in sets 2 and 3, 0.7-0.8 in set 4, and -0.1 and +0.5 in set 1.
        self._cpu = is_cpu_profile(profile)
        repair = not self._cpu
        self._tables1 = {
            op: monotone(table) if repair and op in GROWING_OPS else table
            for op, table in profile.ops.items()
            if isinstance(table, Table1D)
        }
        self.block_size = fallback.block_size
        self._roofline_edges = profile.extrapolation == "roofline"
        self._layers = fallback.model.num_layers
        self._kv_bytes_per_token_per_layer = fallback.kv_bytes_per_token / self._layers
        self._fixed_overhead_s = fallback.config.step_overhead_s
        self._per_seq_overhead_s = 0.0
        # Joint fit (v4 ``step_fit: joint``, ``sim.costmodel.step_fit``): the per-token terms'
        # scale (linear, KV store, elementwise) on each of TOKEN_KNOTS, the prefill
        # attention's, and the decode attention's at each end of DECODE_KNOTS; 1.0 means the
        # tables as timed.
        self._token_scales = np.ones(len(TOKEN_KNOTS))
        self._prefill_scale = 1.0
        self._decode_scales = np.ones(len(DECODE_KNOTS))
        self._joint = profile.step_fit == "joint" and bool(profile.steps)
        self._fitting = False
        # The joint fit's measured input preparation by batch size, where the profile's whole
        # steps store it on their own clock (``measured_prepare``); None: fitted with the glue.
        self._prepare: tuple[tuple[int, float], ...] | None = None
        self._prefill_per_token: Table2D | None = None
        if (prefill := self._table2("prefill_attention")) is not None:
            rows = zip(prefill.xs, prefill.times_s, strict=True)
            per_token = tuple(tuple(t / q for t in row) for q, row in rows)
            self._prefill_per_token = Table2D(prefill.xs, prefill.ys, per_token)
        # The host clock, where the profile prices GPU time on the roofline (a GPU engine's
        # CUDA-event spans) or stores a fitted host set (version 5). The profile's own steps
        # are priced under the decode split they ran (``own_split_fallback``).
        self.fallback = own_split_fallback(profile, fallback)
        self.host = calibrated_host(profile, self.fallback, self._tables_device_s)
        self.fallback = fallback
        if self.host is not None:
            self._joint = False
        elif self._joint:
            self._prepare = measured_prepare(profile)
            self._fit_joint()
        elif profile.steps:
            self._fixed_overhead_s, self._per_seq_overhead_s = self._fit_overhead()

    def _table1(self, op: str) -> Table1D | None:
        return self._tables1.get(op)

    def _table2(self, op: str) -> Table2D | None:
        table = self.profile.ops.get(op)
        return table if isinstance(table, Table2D) else None

    def _step_shape(self, step: StepTiming) -> StepShape:
        contexts = step.decode_context_tokens
        if contexts is None:
            mean = (
                step.sum_decode_context_tokens / step.num_decode_seqs if step.num_decode_seqs else 0
            )
            contexts = (max(1, round(mean)),) * step.num_decode_seqs
        return StepShape(prefill_chunks=step.prefill_chunks, decode_context_tokens=contexts)

    def _fit_joint(self) -> None:
        """Fit ``measured = tokens x s(num_tokens) + b x prefill_attention + decode_attention
        x d(decode context) + rest + fixed + per_seq x num_seqs`` to the profile's whole engine
        steps, where ``tokens`` is the linear, KV-store and elementwise terms as their tables
        give them, ``s`` piecewise linear over log2(tokens) on TOKEN_KNOTS, ``d`` linear over
        log2(the decode contexts' sum), and ``rest`` the LM head, copies and swaps as timed.

        Why this form (benchmarks/results/step_anatomy.txt, ``sim.costmodel.step_fit``): in a
        real step every part runs once per layer between the others, with the model's weights
        and KV streamed from the shared cache each step, not hot in a tight loop, by an amount
        that depends on the step's size; and the step's Python glue (module calls, views,
        residual adds, input preparation, sampling bookkeeping) is timed by no table: a fixed
        and a per-sequence cost, beside the input preparation where the profile's steps
        measured it (``measured_prepare``, then part of ``rest``). A least-absolute fit of
        relative error (each residual weighs 1 / measured), decode-only and prefill steps
        weighted equally as groups: a step slowed by load moves it no more than another. A
        negative coefficient is pinned (scales at 1, overheads at 0)."""
        self._fitting = True
        self._token_scales = np.ones(len(TOKEN_KNOTS))
        self._prefill_scale = 1.0
        self._decode_scales = np.ones(len(DECODE_KNOTS))
        self._fixed_overhead_s, self._per_seq_overhead_s = 0.0, 0.0
        rows, measured, weights = [], [], []
        steps = [s for s in self.profile.steps if s.measured_s > 0]
        num_decode_only = sum(1 for s in steps if not s.prefill_chunks)
        num_prefill = len(steps) - num_decode_only
        for step in steps:
            shape = self._step_shape(step)
            terms = self.step_terms(shape)
            tokens = terms[0] + terms[3] + terms[4]
            # (terms[9] is the measured preparation alone while fitting: known, as the rest)
            rest = sum(terms) - tokens - terms[1] - terms[2]
            by_tokens = tokens * hat(shape.num_batched_tokens, TOKEN_KNOTS)
            by_context = terms[2] * hat(sum(shape.decode_context_tokens), DECODE_KNOTS)
            rows.append([*by_tokens, terms[1], *by_context, 1.0, float(shape.num_seqs), rest])
            measured.append(step.measured_s)
            group = num_prefill if step.prefill_chunks else num_decode_only
            weights.append(1.0 / (step.measured_s * group**0.5))
        self._fitting = False
        if len(rows) < 5:
            return
        data = np.array(rows)
        steps_s = np.array(measured)
        scales = len(TOKEN_KNOTS) + 1 + len(DECODE_KNOTS)
        pinned_at = np.r_[np.ones(scales), 0.0, 0.0]
        coef = least_absolute(
            data[:, :-1], steps_s - data[:, -1], steps_s, np.array(weights), pinned_at
        )
        prefill_at = len(TOKEN_KNOTS)  # (the token scales come first, one per knot)
        self._token_scales = coef[:prefill_at]
        self._prefill_scale = float(coef[prefill_at])
        self._decode_scales = coef[prefill_at + 1 : scales]
        self._fixed_overhead_s, self._per_seq_overhead_s = float(coef[-2]), float(coef[-1])

    @property
    def async_scheduling(self) -> bool:
        """Whether the engine priced overlaps its steps (the host set's flag; a profile priced
        without a host clock is a synchronous engine's)."""
        return self.host is not None and self.host.model.params.async_scheduling

    @property
    def fitted(self) -> dict[str, float]:
        """The step fit's coefficients (scales 1 and the config's overhead when none)."""
        fitted = {
            f"token_scale@{round(2**knot)}": float(scale)
            for knot, scale in zip(TOKEN_KNOTS, self._token_scales, strict=True)
        }
        fitted["prefill_attention_scale"] = self._prefill_scale
        for knot, scale in zip(DECODE_KNOTS, self._decode_scales, strict=True):
            fitted[f"decode_attention_scale@{round(2**knot)}"] = float(scale)
        fitted["fixed_overhead_s"] = self._fixed_overhead_s
        fitted["per_seq_overhead_s"] = self._per_seq_overhead_s
        return fitted

    def _fit_overhead(self) -> tuple[float, float]:
        """The step overhead the per-op tables do not see (scheduler, per-sequence host work,
        launches, syncs), fitted to the profile's whole steps as (fixed, per sequence) seconds.

        Each step's residual is its measured time less every other term. Where the profile has
        decode-only steps of at least two batch sizes, the fit is a line through their
        residuals against the number of sequences (Theil-Sen: the median pairwise slope, then
        the median intercept; robust to a few steps slowed by load), on decode-only steps
        because a prefill's residual also holds the prefill tables' own error. Otherwise the
        median residual of all steps, with no per-sequence part. Both parts floored at zero."""
        # Priced below with no overhead at all but the measured ``prepare`` table.
        self._fixed_overhead_s, self._per_seq_overhead_s, self._fitting = 0.0, 0.0, True
        points = []  # (sequences, residual, decode-only)
        for step in self.profile.steps:
            contexts = step.decode_context_tokens
            if contexts is None:
                mean = (
                    step.sum_decode_context_tokens / step.num_decode_seqs
                    if step.num_decode_seqs
                    else 0
                )
                contexts = (max(1, round(mean)),) * step.num_decode_seqs
            shape = StepShape(prefill_chunks=step.prefill_chunks, decode_context_tokens=contexts)
            residual = step.measured_s - self.step_time_s(shape)
            points.append((shape.num_seqs, residual, not step.prefill_chunks))
        self._fitting = False
        decode = [(n, r) for n, r, only in points if only]
        if len({n for n, _ in decode}) < 2:
            return max(0.0, statistics.median(r for _, r, _ in points)), 0.0
        fixed, per_seq = theil_sen(decode)
        return max(0.0, fixed), per_seq

    def step_terms(self, shape: StepShape) -> tuple[float, ...]:
        """Seconds per term, in the order of roofline.TERMS."""
        analytic = self.fallback.step_terms(shape)
        if not any(analytic):
            return analytic
        if self.host is not None:
            return self._host_terms(shape, analytic)  # (its host set is at the slowdown)
        terms = self._table_terms(shape, analytic)
        slowdown = self.fallback.config.host_slowdown
        if slowdown == 1 or self._fitting:  # (a fit prices the profile's own host)
            return terms
        if self._cpu:  # one processor runs both clocks: all of the step is the host's
            return tuple(slowdown * term for term in terms)
        return (*terms[:-1], slowdown * terms[-1])  # the fitted overhead is the host's

    def _table_terms(self, shape: StepShape, analytic: tuple[float, ...]) -> tuple[float, ...]:
        """The tables' terms over the roofline's, the fitted overhead last."""
        num_decode = len(shape.decode_context_tokens)
        padding = shape.num_padding_tokens if self.fallback.config.price_padding else 0
        num_tokens = shape.num_batched_tokens + padding
        num_seqs = num_decode + len(shape.prefill_chunks)
        layers = self._layers
        terms = list(analytic)
        fallback = self.fallback
        if (table := self._table1("linear")) is not None:
            terms[0] = layers * self._at(table, num_tokens, fallback.linear_s)
            if fallback.model.is_moe:  # its MoE layer, which no dense table times
                terms[0] += layers * moe_layer_s(self.profile, fallback, num_tokens)
        if self.profile.attention is not None:
            if shape.prefill_chunks or num_decode:
                prefill, decode = step_attention_s(
                    self.profile.attention,
                    self.profile.decode_skew,
                    shape.prefill_chunks,
                    shape.decode_context_tokens,
                    self._attention_roof if self._roofline_edges else None,
                )
                terms[1], terms[2] = layers * prefill, layers * decode
            terms[3] = 0.0  # the table's attention layer writes the KV cache itself
        else:
            terms[1], terms[2] = self._attention_terms(shape, terms[1], terms[2])
        if num_decode and fallback.decode_chain is not None:
            # The tables time each batch under the plan an eager step of uniform contexts
            # runs; a graph's plan, or one long context among short ones, may walk further (a
            # graph step's table is re-planned and read at its mean: ``_decode_attention_s``).
            contexts = shape.decode_context_tokens
            walk = fallback.decode_walk_s(num_decode, max(contexts), bool(shape.prefill_chunks))
            terms[2] = max(terms[2], walk)
        if (table := self._table1("store_kv")) is not None:
            terms[3] = layers * self._at(
                table, num_tokens * self._kv_bytes_per_token_per_layer, self._store_kv_roof
            )
        if (table := self._table1("elementwise")) is not None:
            terms[4] = layers * self._at(table, num_tokens, fallback.elementwise_s)
        if (table := self._table1("lm_head")) is not None:
            terms[5] = self._at(table, num_seqs, fallback.lm_head_s)
        if fallback.tp > 1 and (table := self._table1("allreduce")) is not None:
            call_bytes = num_tokens * fallback.model.hidden_size * fallback.model.dtype_bytes
            terms[6] = 2 * layers * self._at(table, call_bytes, fallback.allreduce_call_s)
        block_bytes = self.fallback.block_bytes
        if shape.num_copy_blocks and (table := self._table1("copy_blocks")) is not None:
            terms[7] = table(shape.num_copy_blocks * block_bytes)
        terms[8] = self._swap_s(shape, block_bytes, terms[8])
        if self._joint and not self._fitting:
            token_scale = float(hat(num_tokens, TOKEN_KNOTS) @ self._token_scales)
            for i in (0, 3, 4):
                terms[i] *= token_scale
            terms[1] *= self._prefill_scale
            # At the KV the batch reads, its contexts' sum, whatever context the table is read
            # at: read at the longest times the batch under the ``max`` rule, the six recorded
            # CPU calibrations priced TPOT 7.0-13.2% off against 5.9-8.9%.
            context = sum(shape.decode_context_tokens)
            terms[2] *= float(hat(context, DECODE_KNOTS) @ self._decode_scales)
        terms[9] = self._overhead_s(num_seqs)
        return tuple(terms)

    def _tables_device_s(self, shape: StepShape) -> float:
        """The tables' GPU time of ``shape`` (every term but the host's)."""
        return sum(self._table_terms(shape, self.fallback.step_terms(shape))[:-1])

    def _host_terms(self, shape: StepShape, analytic: tuple[float, ...]) -> tuple[float, ...]:
        """The GPU's terms by the host's clock source (the roofline's, or the tables' scaled
        by the fit), and ``overhead`` what the host adds to them (``HostTimeModel``)."""
        host = self.host
        assert host is not None
        if host.gpu_clock == "roofline":
            device = list(analytic[:-1])
        else:
            device = list(self._table_terms(shape, analytic)[:-1])
        if host.device_scale != 1.0:
            device = [host.device_scale * term for term in device]
        return (*device, host.model.step_overhead_s(shape, self.block_size, sum(device)))

    def _attention_terms(
        self, shape: StepShape, prefill_s: float, decode_s: float
    ) -> tuple[float, float]:
        """Prefill and decode attention (all layers) from the 2-D tables where the profile has
        them; ``prefill_s`` and ``decode_s`` (the roofline's) where it does not."""
        layers = self._layers
        if shape.prefill_chunks and (grid := self._table2("prefill_attention")) is not None:
            prefill_s = 0.0
            for new, context in shape.prefill_chunks:
                if self._roofline_edges:
                    roof = self._prefill_roof
                    q, c = min(max(new, grid.xs[0]), grid.xs[-1]), min(context, grid.ys[-1])
                    chunk_s = self._prefill_attention_s(grid, int(q), int(c))
                    if (q, c) != (new, context) and (edge := roof(q, c)) > 0:
                        chunk_s *= roof(new, context) / edge
                else:
                    chunk_s = self._prefill_attention_s(grid, new, context)
                prefill_s += layers * chunk_s
        contexts = shape.decode_context_tokens
        if contexts and (grid := self._table2("decode_attention")) is not None:
            chain, mixed = self.fallback.decode_chain, bool(shape.prefill_chunks)
            replayed = chain is not None and chain.replays(len(contexts), mixed)
            if replayed and (graph := self._table2("decode_attention_graph")) is not None:
                # Timed on the graphs' own plan: read at the mean context, as it is.
                mean = sum(contexts) / len(contexts)
                decode_s = layers * self._decode_at(len(contexts), mean, graph)
            else:
                decode_s = layers * self._decode_attention_s(grid, contexts, replayed)
        return prefill_s, decode_s

    def _at(self, table: Table1D, x: float, roof: Callable[[int], float]) -> float:
        """``table`` at ``x``; past its measured sizes, by the profile's ``extrapolation``:
        the edge's throughput, or the edge's time scaled by the roofline's ratio."""
        if not self._roofline_edges or x <= 0:
            return table(x)
        edge = min(max(x, table.xs[0]), table.xs[-1])
        time_s = table.within(edge)
        if edge != x and (at_edge := roof(round(edge))) > 0:
            time_s *= roof(round(x)) / at_edge
        return time_s

    def _attention_roof(self, pc: float, kp: float, nd: float, kvd: float) -> float:
        """The roofline's attention of one chunk and ``nd`` decodes of ``kvd`` cached tokens."""
        return (self._prefill_roof(pc, kp) if pc else 0.0) + self._decode_roof(nd, kvd + 1)

    def _prefill_roof(self, new: float, context: float) -> float:
        return self.fallback.prefill_attention_s(((round(new), round(context)),))

    def _decode_roof(self, num_seqs: float, context: float) -> float:
        n, c, bs = round(num_seqs), round(context), self.profile.block_size
        return self.fallback.decode_attention_s(n, n * c, n * -(-c // bs) * bs)

    def _store_kv_roof(self, num_bytes: int) -> float:
        return self.fallback.store_kv_s(round(num_bytes / self._kv_bytes_per_token_per_layer))

    def _prefill_attention_s(self, grid: Table2D, new: int, context: int) -> float:
        """One chunk's prefill attention, per layer. A chunk's cost grows as new x (new / 2 +
        context): quadratic in its length, so a straight line between two timed lengths lies
        above it (by 36% at 640 tokens between timed 256 and 1024, no context). Per query
        token the cost is linear in both, so the table is interpolated per query token and
        scaled back up; below the first timed length, the first length's time (a call's fixed
        cost) is the floor."""
        if new <= grid.xs[0] or self._prefill_per_token is None:
            return grid(new, context)
        past_edge = new / grid.xs[-1] if new > grid.xs[-1] else 1.0
        return new * self._prefill_per_token(new, context) / past_edge

    def _decode_attention_s(
        self, grid: Table2D, contexts: tuple[int, ...], replayed: bool = False
    ) -> float:
        """One layer's decode attention for a batch of these contexts, by the profile's rule:
        at the mean context, at the longest, or per sequence (the mean over the batch of its
        cost at each sequence's own context: the same as the mean where the cost is linear in
        context, more where it grows faster, as when a long context leaves the CPU's caches).

        ``replayed``: the step replays a decode graph (``DecodeChain.replays``), whose split
        plan is not the one the table and the rule's checks were timed under (each launched
        eagerly, its splits sized for its own longest context). There the table is read at the
        mean context, re-planned (``DecodeChain.on_graph``): it prices the batch's reads, and the
        longest context's walk is the chain's (``_table_terms`` floors the term by it); read at
        the longest, as the rule ``max`` chosen by eager checks would, it prices every
        sequence's reads at the longest context's (the H200's per-sequence split of
        2026-11-28: decode-only steps of 17-32 decodes, longest 1,278 tokens and mean 478 at
        the median, priced 11.6% slow against 3.1% at the mean)."""
        num_decode, rule = len(contexts), self.profile.decode_attention_context
        at = self._decode_at if self._roofline_edges else grid
        if replayed:
            chain, mean = self.fallback.decode_chain, sum(contexts) / num_decode
            assert chain is not None
            eager_s, floor_s = at(num_decode, mean), at(num_decode, grid.ys[0])
            return chain.on_graph(eager_s, floor_s, num_decode, math.ceil(mean))
        if rule == "max":
            return at(num_decode, float(max(contexts)))
        if rule == "per_sequence":
            counts = Counter(contexts)
            return sum(n * at(num_decode, float(c)) for c, n in counts.items()) / num_decode
        return at(num_decode, sum(contexts) / num_decode)

    def _decode_at(self, num_seqs: float, context: float, grid: Table2D | None = None) -> float:
        """The decode table (``grid``, or ``decode_attention``) at (num_seqs, context); past its
        grid, by ``extrapolation``: the edge's time scaled by the roofline's ratio."""
        grid = grid or self._table2("decode_attention")
        assert grid is not None
        if not self._roofline_edges:
            return grid(num_seqs, context)
        n = min(max(num_seqs, grid.xs[0]), grid.xs[-1])
        c = min(max(context, grid.ys[0]), grid.ys[-1])
        time_s = grid.within(n, c)
        if (n, c) != (num_seqs, context) and (edge := self._decode_roof(n, c)) > 0:
            time_s *= self._decode_roof(num_seqs, context) / edge
        return time_s

    def _overhead_s(self, num_seqs: int) -> float:
        """The fitted overhead, plus the input preparation: under the joint fit the steps'
        measured one where they store it (``measured_prepare``), else the ``prepare`` table
        where the profile has one (without steps to fit to and without ``prepare``: the
        roofline's per-sequence overhead)."""
        fitted = self._fixed_overhead_s + self._per_seq_overhead_s * num_seqs
        if self._joint:  # the measured preparation, or the per-sequence part stands for it
            return fitted + (prepare_at(self._prepare, num_seqs) if self._prepare else 0.0)
        if (table := self._table1("prepare")) is not None:
            return fitted + table(num_seqs)
        if self._per_seq_overhead_s or self._fitting:
            return fitted
        return fitted + num_seqs * self.fallback.config.per_sequence_overhead_s

    def _swap_s(self, shape: StepShape, block_bytes: int, analytic: float) -> float:
        """Swaps from the per-direction tables (version 2), else the shared ``swap`` table."""
        out_blocks, in_blocks = shape.num_swap_out_blocks, shape.num_swap_in_blocks
        if not (out_blocks or in_blocks):
            return analytic
        out_table, in_table = self._table1("swap_out"), self._table1("swap_in")
        if out_table is not None and in_table is not None:
            return out_table(out_blocks * block_bytes) + in_table(in_blocks * block_bytes)
        if (table := self._table1("swap")) is not None:
            return table((out_blocks + in_blocks) * block_bytes)
        return analytic

    def step_time_s(self, shape: StepShape) -> float:
        return sum(self.step_terms(shape))

    def step_breakdown(self, shape: StepShape) -> dict[str, float]:
        return dict(zip(TERMS, self.step_terms(shape), strict=True))

    def kv_transfer_time_s(
        self, num_tokens: int, link_bandwidth_bytes_per_s: float, link_latency_s: float
    ) -> float:
        # A link between replicas is not something a single-replica profile measures.
        return self.fallback.kv_transfer_time_s(
            num_tokens, link_bandwidth_bytes_per_s, link_latency_s
        )
