"""A step of data-parallel attention with expert-parallel MoE layers, as vLLM runs a mixture of
experts with ``data_parallel_size > 1``: every rank pads its batch to the group's largest, its
attention and dense layers run on its own, and each MoE layer gathers all ranks' tokens,
runs this GPU's share of the experts over them and scatters the results back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from core.model.spec import ModelSpec
from sim.costmodel.kernel_costs import ring_link
from sim.costmodel.layer_ops import experts_touched
from sim.costmodel.moe_table import experts_from_table
from sim.costmodel.profile import Table2D
from sim.costmodel.roofline import TERMS, RooflineCostModel
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import HardwareSpec

if TYPE_CHECKING:
    from sim.costmodel.calibrated import CalibratedCostModel


def expert_weight_bytes_per_gpu(model: ModelSpec, num_gpus: int) -> int:
    """Weights one GPU holds when the routed experts are spread over ``num_gpus`` GPUs (EP, or
    MoE tensor parallelism flattened over data parallelism) and the rest over its ``tp``: the
    caller adds the non-expert share."""
    experts = model.num_layers * model.num_experts * model.expert_params * model.dtype_bytes
    return -(-experts // num_gpus)


def weight_bytes_per_gpu(model: ModelSpec, tp: int, dp: int) -> int:
    """This GPU's weights: everything but the routed experts split by ``tp``, the routed experts
    by ``dp * tp``."""
    experts = model.num_layers * model.num_experts * model.expert_params * model.dtype_bytes
    return -(-(model.weight_bytes - experts) // tp) + expert_weight_bytes_per_gpu(model, dp * tp)


def ring_gather_s(hw: HardwareSpec, total_bytes: float, num_workers: int) -> float:
    """One ring all-gather (or reduce-scatter) of ``total_bytes`` over ``num_workers`` GPUs:
    the call latency, p - 1 hops, and (p - 1) / p of the data through each GPU's link: half a
    ring all-reduce (`kernel_costs.allreduce_s`), on the same links."""
    if num_workers <= 1 or total_bytes <= 0:
        return 0.0
    link, hop, bus = ring_link(hw, num_workers, hw.nvlink_domain_size)
    steps = num_workers - 1
    return (
        hw.allreduce_call_latency_s + steps * hop + steps / num_workers * total_bytes / (link * bus)
    )


@dataclass(frozen=True, slots=True)
class GroupStep:
    """One lockstep step of a data-parallel group: each rank's seconds by term (TERMS plus
    ``experts`` and ``dispatch_combine``), and the step's length, the slowest rank's."""

    per_rank: tuple[dict[str, float], ...]
    duration_s: float
    tokens_per_rank: int  # every rank's batch padded to the largest
    gathered_bytes: int  # hidden states one MoE layer's all-gather assembles on each rank


class ExpertParallelCost:
    """Prices a data-parallel group's step on ``roofline`` (one rank's model: its TP degree,
    its hardware): dense parts on each rank at the padded token count, attention on its own
    sequences, the routed experts over all ranks' tokens on this GPU's ``1 / (dp * tp)`` share
    of them, and per MoE layer an all-gather of the tokens across the ``dp`` ranks and a
    reduce-scatter of the outputs (vLLM's default ``allgather_reducescatter`` backend)."""

    def __init__(
        self, roofline: RooflineCostModel, dp: int, priced: CalibratedCostModel | None = None
    ) -> None:
        if dp < 1:
            raise ValueError(f"dp must be >= 1, got {dp!r}")
        self.roofline, self.dp = roofline, dp
        self.model, self.hardware = roofline.model, roofline.hardware
        self.num_gpus = dp * roofline.tp
        # ``priced``: a profile's tables price each rank's step (its ``experts`` table, where it
        # has one, the experts: ``sim.costmodel.moe_table``); None: the roofline does.
        self.priced = priced
        table = priced.profile.ops.get("experts") if priced is not None else None
        self._table = table if isinstance(table, Table2D) else None

    def _own_experts_s(self, tokens: int) -> float:
        """The routed experts a rank's own step terms hold: its own tokens over every expert."""
        if self._table is not None:
            return experts_from_table(self._table, self.model, tokens)
        return self.roofline.layer_ops.experts_s(tokens)

    def _share_experts_s(self, tokens_total: int) -> float:
        """This GPU's share of the experts over every rank's tokens."""
        if self._table is not None:
            return experts_from_table(self._table, self.model, tokens_total, self.num_gpus)
        return self.experts_s(tokens_total)

    def experts_s(self, num_tokens_total: int) -> float:
        """One MoE layer's routed experts on one GPU, for ``num_tokens_total`` tokens gathered
        from every rank: its E / (dp tp) whole experts take that share of the (token, expert)
        pairs in expectation, and read the weights of those its tokens touch."""
        model, hw = self.model, self.hardware
        if not model.is_moe or num_tokens_total <= 0:
            return 0.0
        k = model.num_experts_per_token
        pairs = num_tokens_total * k / self.num_gpus
        touched = experts_touched(model, num_tokens_total) / self.num_gpus
        dtype = model.dtype_bytes
        compute = (
            pairs * 2 * model.expert_params / (hw.peak_flops(dtype) * hw.gemm_flops_efficiency)
        )
        act_per_pair = dtype * (2 * model.hidden_size + 3 * model.moe_intermediate_size)
        num_bytes = touched * model.expert_params * dtype + pairs * act_per_pair
        memory = num_bytes / (hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency)
        return 2 * hw.gemm_latency_s + max(compute, memory)

    def gathered_bytes(self, tokens_per_rank: int) -> int:
        """Hidden states one MoE layer's all-gather assembles on every rank: every rank's
        (padded) tokens; the reduce-scatter moves as many back."""
        return self.dp * tokens_per_rank * self.model.hidden_size * self.model.dtype_bytes

    def dispatch_combine_s(self, tokens_per_rank: int) -> float:
        """All MoE layers' all-gather and reduce-scatter across the data-parallel ranks."""
        one = ring_gather_s(self.hardware, self.gathered_bytes(tokens_per_rank), self.dp)
        return self.model.num_layers * 2 * one

    def group_step(self, shapes: Sequence[StepShape]) -> GroupStep:
        """Each rank's terms for its ``shapes`` entry (an empty shape: a rank with nothing to
        run, which still takes part with a padded dummy batch), and the group's step."""
        tokens = max([1, *(s.num_batched_tokens + s.num_padding_tokens for s in shapes)])
        layers = self.model.num_layers
        own_experts = layers * self._own_experts_s(tokens)
        experts = layers * self._share_experts_s(self.dp * tokens)
        step_terms = (self.priced or self.roofline).step_terms
        comms = self.dispatch_combine_s(tokens)
        per_rank = []
        for shape in shapes:
            own = shape.num_batched_tokens + shape.num_padding_tokens
            padded = replace(shape, num_padding_tokens=shape.num_padding_tokens + tokens - own)
            terms = dict(zip(TERMS, step_terms(padded), strict=True))
            # A rank's own terms price the experts as its TP shard of all of them over its own
            # tokens; under data parallelism they are a 1 / (dp tp) share over all ranks'.
            terms["linear"] += experts - own_experts
            terms["experts"] = experts
            terms["dispatch_combine"] = comms
            device = sum(v for k, v in terms.items() if k not in ("overhead", "experts"))
            host = self.roofline.host  # the run's host set, as the roofline prices it
            terms["overhead"] = host.step_overhead_s(shape, self.roofline.block_size, device)
            per_rank.append(terms)
        duration = max(sum(v for k, v in terms.items() if k != "experts") for terms in per_rank)
        return GroupStep(tuple(per_rank), duration, tokens, self.gathered_bytes(tokens))


def check_data_parallel(model: ModelSpec, tp: int, dp: int) -> None:
    """Refuse a data-parallel size that cannot split the routed experts over dp x tp GPUs."""
    if dp < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {dp!r}")
    if model.is_moe and model.num_experts % (dp * tp):
        raise ValueError(
            f"{model.name}'s {model.num_experts} experts do not split over data_parallel_size "
            f"{dp} x tp {tp} = {dp * tp} GPUs"
        )
