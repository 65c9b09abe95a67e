"""``RepeatStepper``: the roofline's price of each step of a run of one shape, with the terms that
do not change computed once (``RooflineCostModel.stepper``). Compiled with the roofline
(``sim.compiled.build.HOT_MODULES``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.costmodel.roofline import RooflineCostModel


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
