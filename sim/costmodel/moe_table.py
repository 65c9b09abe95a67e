"""A mixture of experts' routed experts priced from a measured table (a profile's ``experts``
op: one MoE layer's time on one GPU holding every expert, by the tokens entering it and the
distinct experts they activate; LLMServingSim's ``moe.csv``), on one GPU or on one GPU's share
of the experts under data and expert parallelism.

The table's own steps were timed with a chosen number of activated experts. A served step's is
not chosen: its tokens' routes decide it. Each token picks ``k`` of ``E`` experts; routed
independently and uniformly (``layer_ops.experts_touched``, which the roofline uses too), ``T``
tokens touch ``E (1 - (1 - k/E)^T)`` distinct experts on average.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.costmodel.layer_ops import experts_touched
from sim.costmodel.profile import Profile, Table2D

if TYPE_CHECKING:
    from core.model.spec import ModelSpec
    from sim.costmodel.roofline import RooflineCostModel


def experts_from_table(
    table: Table2D, model: ModelSpec, num_tokens: float, num_gpus: int = 1
) -> float:
    """One MoE layer's routed experts on one GPU of ``num_gpus`` that split the experts evenly
    between them, for ``num_tokens`` tokens (gathered from every rank under data parallelism).
    The GPU's share is ``1 / num_gpus`` of the (token, expert) pairs in expectation, over as
    many distinct experts of its own: the table's time at the token count with that many pairs
    (``num_tokens / num_gpus``) and that many activated experts. Below the table's first token
    count, its first row's."""
    if num_tokens <= 0:
        return 0.0
    tokens = max(num_tokens / num_gpus, table.xs[0])
    return table(tokens, experts_touched(model, num_tokens) / num_gpus)


def moe_layer_s(profile: Profile, roofline: RooflineCostModel, num_tokens: float) -> float:
    """One MoE layer (router and routed experts) on one GPU holding every expert, for
    ``num_tokens`` tokens: from ``profile``'s ``experts`` table where it has one
    (``experts_from_table``), else the roofline's router GEMM and experts (a share of the
    experts over several GPUs is ``ExpertParallelCost``'s)."""
    table = profile.ops.get("experts")
    if isinstance(table, Table2D):
        return experts_from_table(table, roofline.model, num_tokens)
    tokens = int(num_tokens)
    return roofline.layer_ops.op_s("mlp_router", tokens) + roofline.layer_ops.experts_s(tokens)
