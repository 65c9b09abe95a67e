"""Analytic per-step cost: each kernel priced by `sim.costmodel.kernel_costs` from its shape and the
`HardwareSpec` (tiled GEMMs, row kernels with launch floors, attention, alpha-beta all-reduce),
and a step is the sum of its kernels (kernels on one stream do not overlap)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from core.model.spec import ModelSpec, check_tp
from sim.costmodel.config import CostModelConfig
from sim.costmodel.decode_chain import DecodeChain
from sim.costmodel.host_time import HostTimeModel
from sim.costmodel.kernel_costs import allreduce_s, gemm_s, link_s, streaming_s
from sim.costmodel.layer_ops import LayerOps
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import HardwareSpec

TERMS: tuple[str, ...] = (
    "linear",
    "prefill_attention",
    "decode_attention",
    "store_kv",
    "elementwise",
    "lm_head",
    "allreduce",
    "copy_blocks",
    "swap",
    "overhead",
)
"""Keys of `step_breakdown`, in the order they are summed."""

_LOGIT_BYTES: Final = 4  # logits and the sampler's softmax are fp32 in vLLM and HF alike
_NO_WORK = (0.0,) * len(TERMS)
_MAX_MEMO: Final = 1 << 16


class RooflineCostModel:
    """Analytic cost of one step of `model` on `tp` GPUs of kind `hardware`, per rank, with KV
    blocks of `block_size` tokens (the deployment's: it sets how much KV a decode reads, and
    what a copied or swapped block moves)."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        tp: int = 1,
        config: CostModelConfig | None = None,
        *,
        block_size: int,
    ) -> None:
        check_tp(model, tp)
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size!r}")
        self.model, self.hardware, self.tp = model, hardware, tp
        self.block_size = block_size
        self.config = config = config or CostModelConfig()
        peak, bandwidth = hardware.peak_flops(model.dtype_bytes), hardware.hbm_bandwidth_bytes_per_s
        self._matmul_flops_per_s = peak * hardware.gemm_flops_efficiency
        self._memory_bytes_per_s = bandwidth * hardware.memory_bandwidth_efficiency
        self._attention_flops_per_s = peak * hardware.attention_flops_efficiency
        self._attention_bytes_per_s = bandwidth * hardware.attention_bandwidth_efficiency
        mixed = hardware.mixed_attention_bandwidth_efficiency
        self._mixed_attention_bytes_per_s = (
            bandwidth * mixed if mixed else self._attention_bytes_per_s
        )
        self._attention_latency_s = model.num_layers * hardware.attention_latency_s
        kv_heads = model.kv_heads_per_shard(tp)
        self.host = HostTimeModel(config.host_params(), model.num_layers, kv_heads)
        self.decode_chain = DecodeChain.for_cost_model(model, hardware, tp, config)
        # Where servesim's decode kernel is priced (with its walk), so are its other kernels:
        # the decode's fixed cost, the fused row kernels and the LM head's fixed cost.
        own = self.decode_chain is not None
        per_layer = hardware.decode_latency_s if own else hardware.attention_latency_s
        self._decode_latency_s = model.num_layers * per_layer
        self._lm_head_latency_s = hardware.lm_head_latency_s if own else 0.0
        self.layer_ops = LayerOps(model, hardware, tp, fused=own)
        # Steps priced from aggregates (fast-forward) need a host clock of sequence counts
        # alone and no decode walk (which reads the longest context).
        self._aggregates_ok = self.host.simple and self.decode_chain is None
        self._precompute_shapes(model, tp)
        # Terms that depend only on (tokens, sequences) in a step, computed once per pair.
        self._by_size: dict[tuple[int, int], tuple[float, ...]] = {}
        self._steppers: dict[tuple[int, int, int], RepeatStepper] = {}

    def _precompute_shapes(self, model: ModelSpec, tp: int) -> None:
        """Per-model constants, so a step costs a few multiplications."""
        layers, hidden, dtype = model.num_layers, model.hidden_size, model.dtype_bytes
        q_size = model.q_size // tp
        kv_size = model.kv_heads_per_shard(tp) * model.head_dim
        # QK^T and PV: 2 FLOPs per multiply-add, 2 matmuls, over this rank's query heads.
        self._attention_flops_per_pair = 4 * layers * q_size
        self._attention_q_bytes_per_token = 2 * layers * q_size * dtype  # read Q, write O
        self._kv_bytes_per_token = 2 * layers * kv_size * dtype  # K and V, all layers, this rank
        self._vocab_shard = -(-model.vocab_size // tp)
        # The sampler reads the gathered fp32 logits, softmaxes in place and reads them again.
        self._sampler_bytes_per_row = 3 * model.vocab_size * _LOGIT_BYTES
        self._allreduce_bytes_per_token = hidden * dtype
        self._num_allreduces = 2 * layers if tp > 1 else 0

    # Each term takes aggregates so that CalibratedCostModel can swap any one for a table.

    def expected_experts_touched(self, num_tokens: int) -> float:
        """Distinct routed experts a step's tokens use, per layer (`LayerOps`)."""
        return self.layer_ops.expected_experts_touched(num_tokens)

    def expert_weight_bytes(self, num_tokens: int) -> float:
        """Routed-expert weights one rank reads in a step, all layers (`LayerOps`)."""
        return self.model.num_layers * self.layer_ops.expert_weight_bytes(num_tokens)

    def linear_s(self, num_tokens: int) -> float:
        """QKV, output, gate-up and down projections of every layer, as tiled GEMMs; a MoE
        model's router and routed experts (`LayerOps.experts_s`) included."""
        if num_tokens <= 0:
            return 0.0
        return self.model.num_layers * self.layer_ops.linear_s(num_tokens)

    def prefill_attention_s(self, chunks: tuple[tuple[int, int], ...]) -> float:
        """Attention of each chunk's new tokens over its context and the chunk itself (the
        causal square priced whole); K and V are read whole blocks at a time."""
        block_size = self.block_size
        pairs = 0.0
        q_tokens = 0
        kv_tokens = 0
        for num_new, num_context in chunks:
            # The chunk's causal triangle costs its full square: the measured prefill kernel
            # (Vidur's A100 attention.csv) prices in-chunk pairs at twice the context's, as a
            # kernel computing the masked tiles would.
            pairs += num_new * (num_context + num_new)
            q_tokens += num_new
            kv_tokens += -(-(num_context + num_new) // block_size) * block_size
        if not q_tokens:
            return 0.0
        compute = pairs * self._attention_flops_per_pair / self._attention_flops_per_s
        bytes_moved = (
            q_tokens * self._attention_q_bytes_per_token + kv_tokens * self._kv_bytes_per_token
        )
        latency = len(chunks) * self._attention_latency_s
        return latency + max(compute, bytes_moved / self._attention_bytes_per_s)

    def decode_attention_s(
        self,
        num_seqs: int,
        sum_context_tokens: int,
        kv_read_tokens: int,
        mixed: bool = False,
        max_context: int = 0,
    ) -> float:
        """One query token per sequence against its whole context; `kv_read_tokens` is the
        context rounded up to whole blocks (what a paged kernel actually reads). ``mixed``: the
        step also prefills (its decodes read at `mixed_attention_bandwidth_efficiency`).
        ``max_context``, the longest context, given: no faster than the kernel's longest walk
        (``decode_walk_s``). Plus the fixed cost: ``decode_latency_s`` where the walk is priced
        (servesim's kernel), else ``attention_latency_s``."""
        if num_seqs <= 0:
            return 0.0
        compute = sum_context_tokens * self._attention_flops_per_pair / self._attention_flops_per_s
        bytes_moved = (
            num_seqs * self._attention_q_bytes_per_token + kv_read_tokens * self._kv_bytes_per_token
        )
        rate = self._mixed_attention_bytes_per_s if mixed else self._attention_bytes_per_s
        walk = self.decode_walk_s(num_seqs, max_context, mixed) if max_context else 0.0
        return self._decode_latency_s + max(compute, bytes_moved / rate, walk)

    def decode_walk_s(self, num_seqs: int, max_context: int, mixed: bool = False) -> float:
        """The decode kernel's longest walk over every layer (``DecodeChain``; 0 without one)."""
        chain = self.decode_chain
        if chain is None:
            return 0.0
        return self.model.num_layers * chain.layer_s(num_seqs, max_context, mixed)

    def store_kv_s(self, num_tokens: int) -> float:
        """Scatter the new K and V into the cache, one kernel a layer: read once, write once."""
        if num_tokens <= 0:
            return 0.0
        layers = self.model.num_layers
        per_layer_bytes = 2 * num_tokens * self._kv_bytes_per_token / layers
        return layers * streaming_s(self.hardware, per_layer_bytes)

    def elementwise_s(self, num_tokens: int) -> float:
        """Norms, rotary, activation and residual adds of every layer, and the embedding.

        The step time stays monotone in tokens (a scheduler's more work never takes less
        time): the embedding takes the lower envelope of its kernel and the kernel just past
        the small-index switch. PyTorch's serial walk over 4-16 indices (`embedding_s`) is up
        to ~10 us slower than the gather of 17 rows; `costmodel check` scores that kernel as
        is, the step leaves the dip out."""
        if num_tokens <= 0:
            return 0.0
        layers = self.model.num_layers * self.layer_ops.elementwise_s(num_tokens)
        emb = self.layer_ops.op_s("emb", num_tokens)
        switch = self.hardware.small_index_max_rows + 1
        if num_tokens < switch:
            emb = min(emb, self.layer_ops.op_s("emb", switch))
        return layers + emb

    def lm_head_s(self, num_seqs: int) -> float:
        """Logits for the last token of each sequence (vLLM computes them for partial prefill
        chunks too, then drops them), sampling over the vocabulary (servesim's: + fixed cost)."""
        if num_seqs <= 0:
            return 0.0
        hw, model = self.hardware, self.model
        logits = gemm_s(hw, num_seqs, self._vocab_shard, model.hidden_size, model.dtype_bytes)
        sampler = streaming_s(hw, num_seqs * self._sampler_bytes_per_row)
        return self._lm_head_latency_s + logits + sampler

    def allreduce_call_s(self, num_bytes: float) -> float:
        """One all-reduce over the tp ranks (alpha-beta ring, `kernel_costs.allreduce_s`)."""
        return allreduce_s(self.hardware, num_bytes, self.tp)

    def allreduce_s(self, num_tokens: int) -> float:
        """Megatron-style TP: one all-reduce after attention and one after the MLP per layer."""
        if not self._num_allreduces or num_tokens <= 0:
            return 0.0
        return self._num_allreduces * self.allreduce_call_s(
            num_tokens * self._allreduce_bytes_per_token
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's K and V over all layers, on one rank."""
        return self._kv_bytes_per_token

    @property
    def block_bytes(self) -> int:
        """One KV block over all layers, on one rank."""
        return self.block_size * self._kv_bytes_per_token

    def copy_blocks_s(self, num_blocks: int) -> float:
        """Copy-on-write: each block is read and written once in device memory."""
        return 2 * num_blocks * self.block_bytes / self._memory_bytes_per_s

    def swap_s(self, num_blocks: int) -> float:
        """Blocks to or from host memory over PCIe; vLLM issues them before the forward pass and
        waits, so they add to the step rather than overlap it."""
        bandwidth = self.hardware.host_link_bandwidth_bytes_per_s * self.config.host_link_efficiency
        return num_blocks * self.block_bytes / bandwidth

    def overhead_s(self, num_seqs: int) -> float:
        """The host's per-step and per-sequence seconds (all of a vLLM-like host's time)."""
        return self.host.params.step_s + num_seqs * self.host.params.seq_s

    def step_terms(self, shape: StepShape) -> tuple[float, ...]:
        """Seconds per term, in the order of TERMS. A step with no work costs nothing."""
        contexts = shape.decode_context_tokens
        bs = self.block_size
        kv_read_tokens = sum([-(-ctx // bs) for ctx in contexts]) * bs
        swaps = shape.num_swap_out_blocks + shape.num_swap_in_blocks
        return self._terms(
            shape.prefill_chunks,
            (len(contexts), sum(contexts), kv_read_tokens),
            shape.num_padding_tokens if self.config.price_padding else 0,
            (shape.num_copy_blocks, swaps),
            max(contexts, default=0),
        )

    def _terms(
        self,
        chunks: tuple[tuple[int, int], ...],
        decode: tuple[int, int, int],
        num_padding: int,
        block_moves: tuple[int, int],
        max_context: int = 0,
    ) -> tuple[float, ...]:
        """`decode` is (num_seqs, sum of contexts, KV tokens read); `block_moves` is
        (copy-on-write copies, blocks swapped either way); `max_context` the longest decode
        context (read by a host clock of more than the sequence count)."""
        num_decode, sum_context, kv_read_tokens = decode
        copies, swaps = block_moves
        num_tokens = num_decode + num_padding
        for chunk in chunks:
            num_tokens += chunk[0]
        num_seqs = num_decode + len(chunks)
        if not (num_tokens or copies or swaps):
            return _NO_WORK
        shared = self._by_size.get((num_tokens, num_seqs)) or self._size_terms(num_tokens, num_seqs)
        linear, store_kv, elementwise, lm_head, allreduce, overhead = shared
        device = (
            linear,
            self.prefill_attention_s(chunks) if chunks else 0.0,
            self.decode_attention_s(
                num_decode, sum_context, kv_read_tokens, bool(chunks), max_context
            ),
            store_kv,
            elementwise,
            lm_head,
            allreduce,
            self.copy_blocks_s(copies) if copies else 0.0,
            self.swap_s(swaps) if swaps else 0.0,
        )
        if self.host.simple:
            return (*device, self.host_wait_s(overhead, sum(device)))
        block_size = self.block_size
        entries = kv_read_tokens // block_size
        for new, context in chunks:
            entries += -(-(new + context) // block_size)
        device_s = sum(device)
        host = self.host.host_time(len(chunks), num_decode, max_context, entries, num_tokens)
        return (*device, self.host.duration_s(host, device_s) - device_s)

    def host_wait_s(self, host_s: float, device_s: float) -> float:
        """What the host's `host_s` of work adds to a step whose kernels take `device_s`: all
        of it when the GPU waits for the host, only what exceeds the kernels when the host
        prepares the next step while they run (async scheduling)."""
        return self.host.wait_s(host_s, device_s)

    def _size_terms(self, num_tokens: int, num_seqs: int) -> tuple[float, ...]:
        """The terms that depend on a step's token and sequence counts alone: (linear, KV
        store, elementwise, LM head, all-reduce, overhead), memoized."""
        shared = self._by_size.get((num_tokens, num_seqs))
        if shared is None:
            if len(self._by_size) >= _MAX_MEMO:
                self._by_size.clear()  # keep memory bounded for unbounded step sizes
            shared = self._by_size[(num_tokens, num_seqs)] = (
                self.linear_s(num_tokens),
                self.store_kv_s(num_tokens),
                self.elementwise_s(num_tokens),
                self.lm_head_s(num_seqs),
                self.allreduce_s(num_tokens),
                self.overhead_s(num_seqs),
            )
        return shared

    def step_time_s(self, shape: StepShape) -> float:
        return sum(self.step_terms(shape))

    def step_breakdown(self, shape: StepShape) -> dict[str, float]:
        return dict(zip(TERMS, self.step_terms(shape), strict=True))

    def decode_step_time_s(
        self, num_seqs: int, sum_context_tokens: int, sum_context_blocks: int
    ) -> float:
        """A decode-only step from aggregates alone: O(1) whatever the batch."""
        return self.aggregate_step_time_s((), num_seqs, sum_context_tokens, sum_context_blocks)

    def repeat_stepper(
        self, prefill_chunks: tuple[tuple[int, int], ...], num_decode_seqs: int
    ) -> Callable[[tuple[tuple[int, int], ...], int, int], float]:
        """For steps of one shape (the same chunk sizes and decode count), a function of
        (chunks, summed context, summed context blocks) giving what ``aggregate_step_time_s``
        gives, to the last bit, with the terms that do not change computed once
        (``RepeatStepper.step``)."""
        return self.stepper(prefill_chunks, num_decode_seqs).step

    def decode_repeat_durations(
        self,
        num_decode_seqs: int,
        sum_context_tokens: np.ndarray,
        sum_context_blocks: np.ndarray,
    ) -> np.ndarray:
        """Durations of many decode-only steps of ``num_decode_seqs`` sequences at once, one per
        (summed context, summed blocks) pair: the arithmetic of ``repeat_stepper(())``, done
        elementwise in the same order, so each equals that step's time to the last bit."""
        if num_decode_seqs <= 0:
            raise ValueError("decode_repeat_durations needs at least one decoding sequence")
        self._check_aggregates()
        num_tokens = num_seqs = num_decode_seqs
        compute = sum_context_tokens * self._attention_flops_per_pair / self._attention_flops_per_s
        bytes_moved = (
            num_decode_seqs * self._attention_q_bytes_per_token
            + (sum_context_blocks * self.block_size) * self._kv_bytes_per_token
        )
        linear, *after, overhead = self._size_terms(num_tokens, num_seqs)
        total: np.ndarray = (linear + 0.0) + (
            self._decode_latency_s + np.maximum(compute, bytes_moved / self._attention_bytes_per_s)
        )
        for term in after:
            total += term
        if self.host.params.async_scheduling:
            return total + np.maximum(0.0, overhead - total)
        return total + overhead

    @property
    def async_scheduling(self) -> bool:
        """Whether the engine priced schedules a step while the previous one runs (vLLM's async
        scheduling): it then also takes in arrivals a step later (``sim.async_admission``)."""
        return self.host.params.async_scheduling

    @property
    def prices_aggregates(self) -> bool:
        """Whether a step's aggregates (chunks, decode count, summed context and blocks) are
        enough to price it: not when the host's clock reads more (``host_time``), such as the
        longest decode context, or the decode kernel's longest walk (``decode_chain``)."""
        return self._aggregates_ok

    def _check_aggregates(self) -> None:
        if not self._aggregates_ok:
            raise ValueError(
                "this cost model reads each decode's context (its host clock, or the decode "
                "kernel's longest walk): price by StepShape"
            )

    def aggregate_step_time_s(
        self,
        prefill_chunks: tuple[tuple[int, int], ...],
        num_decode_seqs: int,
        sum_context_tokens: int,
        sum_context_blocks: int,
    ) -> float:
        """A step without padding, copies or swaps, its decodes given by aggregates alone.
        Equal, to the last bit, to ``step_time_s`` of the same step: ``RepeatStepper`` adds
        the same terms in the same order (a fifth of the work of building them all)."""
        self._check_aggregates()
        num_tokens = num_decode_seqs
        for num_new, _ in prefill_chunks:
            num_tokens += num_new
        if num_tokens <= 0:  # (no work: ``_terms`` prices nothing at all)
            decode = (num_decode_seqs, sum_context_tokens, sum_context_blocks * self.block_size)
            return sum(self._terms(prefill_chunks, decode, 0, (0, 0)))
        stepper = self.stepper(prefill_chunks, num_decode_seqs)
        return stepper.step(prefill_chunks, sum_context_tokens, sum_context_blocks)

    def stepper(
        self, prefill_chunks: tuple[tuple[int, int], ...], num_decode_seqs: int
    ) -> RepeatStepper:
        """``RepeatStepper(self, prefill_chunks, num_decode_seqs)``, memoized: it
        reads the chunks only through their count and their new tokens' total (a step's price
        builds one, and most steps repeat a size seen before)."""
        num_tokens = num_decode_seqs
        for num_new, _ in prefill_chunks:
            num_tokens += num_new
        key = (num_decode_seqs, num_tokens, len(prefill_chunks))
        stepper = self._steppers.get(key)
        if stepper is None:
            if len(self._steppers) >= _MAX_MEMO:
                self._steppers.clear()  # (bounded, as ``_size_terms``)
            stepper = RepeatStepper(self, prefill_chunks, num_decode_seqs)
            self._steppers[key] = stepper
        return stepper

    def kv_transfer_time_s(
        self, num_tokens: int, link_bandwidth_bytes_per_s: float, link_latency_s: float
    ) -> float:
        """Ship `num_tokens` tokens of KV (all layers, all TP ranks) over one link, as a
        disaggregated prefill replica does to its decode replica (`kernel_costs.link_s`)."""
        num_bytes = max(0, num_tokens) * self.model.kv_bytes_per_token()
        return link_s(num_bytes, link_bandwidth_bytes_per_s, link_latency_s)


class RepeatStepper:
    """The price of each step of a run of one shape (the same chunk sizes and decode count):
    ``step`` gives what ``aggregate_step_time_s`` gives, to the last bit, with the terms that
    do not change computed once. A class rather than a closure, so that a compiled executor
    (docs/compiled_core.md) calls ``step`` directly instead of through the interpreter's call
    protocol; fast-forward prices most short runs here, step by step."""

    def __init__(
        self,
        model: RooflineCostModel,
        prefill_chunks: tuple[tuple[int, int], ...],
        num_decode_seqs: int,
    ) -> None:
        self.model = model
        self.num_decode_seqs = num_decode_seqs
        self.block_size: int = model.block_size
        model._check_aggregates()
        self.overlap = model.host.params.async_scheduling
        # Decode-only steps write ``decode_attention_s`` and the sums after it out, the same
        # operations in the same order (so the same bits), with no call per step.
        self.decode_only = not prefill_chunks and num_decode_seqs > 0
        num_tokens = num_decode_seqs + sum(n for n, _ in prefill_chunks)
        num_seqs = num_decode_seqs + len(prefill_chunks)
        # The rest, in the order `_terms` lists them (copies and swaps are 0.0 here; adding
        # 0.0 changes nothing, so they are left out), added one by one in that order.
        terms = model._size_terms(num_tokens, num_seqs)
        linear, store_kv, elementwise, lm_head, allreduce, overhead = terms
        self.linear: float = linear
        self.start: float = linear + 0.0  # (what `_terms` adds for no prefill chunk)
        self.store_kv: float = store_kv
        self.elementwise: float = elementwise
        self.lm_head: float = lm_head
        self.allreduce: float = allreduce
        self.overhead: float = overhead
        self.flops_per_pair: int = model._attention_flops_per_pair
        self.flops_per_s: float = model._attention_flops_per_s
        self.q_bytes: int = num_decode_seqs * model._attention_q_bytes_per_token
        self.kv_bytes_per_token: int = model._kv_bytes_per_token
        self.bytes_per_s: float = model._attention_bytes_per_s
        self.latency: float = model._decode_latency_s

    def step(self, chunks: tuple[tuple[int, int], ...], sum_context: int, sum_blocks: int) -> float:
        """One step's time: ``chunks`` its prompt chunks (new tokens, context after them),
        its decodes' summed context tokens and summed context blocks."""
        if self.decode_only:
            compute = sum_context * self.flops_per_pair / self.flops_per_s
            bytes_moved = self.q_bytes + (sum_blocks * self.block_size) * self.kv_bytes_per_token
            total = self.start + (self.latency + max(compute, bytes_moved / self.bytes_per_s))
        else:
            model = self.model
            total = self.linear + (model.prefill_attention_s(chunks) if chunks else 0.0)
            total += model.decode_attention_s(
                self.num_decode_seqs, sum_context, sum_blocks * self.block_size, bool(chunks)
            )
        total = (((total + self.store_kv) + self.elementwise) + self.lm_head) + self.allreduce
        if self.overlap:
            wait = self.overhead - total  # `host_wait_s`, inlined: one call less per step
            return total + (wait if wait > 0.0 else 0.0)
        return total + self.overhead
