"""What ``python -m kernels.bench`` times inside CUDA graphs, where launch overhead is gone as in
the engine's captured decode step: small paged decode attention, the decode split of a graph
planned for a long model (one long context among short ones, under each split mode of
``core.decode_split``), and the fused elementwise kernels (add+RMSNorm, SiLU×mul, rotary) next
to the unfused torch ops they replace."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernels.bench_setup import (
    DECODE_MEDIUM_TOKENS,
    ELEMENT_BYTES,
    HEAD_DIM,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    TARGETS,
    Row,
    paged_cache,
    time_us,
)

if TYPE_CHECKING:
    import torch

HIDDEN, INTERMEDIATE, MAX_POSITIONS = 4096, 14336, 8192  # Llama-3-8B
RMS_EPS = 1e-5
# A graph replays the same call many times; rotating through this many bytes of KV (more than
# an H100's 50 MiB or an H200's 60 MiB of L2) keeps the reads cold, as between a real step's
# layers. The fused ops' inputs stay warm: in a step the matmul before them has just written them.
COLD_KV_BYTES = 256 << 20
MAX_KV_COPIES = 1024  # 256 MiB at batch 1, context 128
FUSED_OPS = ("add_rms_norm", "silu_and_mul", "rotary")


def graph_decode_shapes(quick: bool) -> list[dict[str, Any]]:
    """Small decode (batch 1-16, short contexts, under the eager sweep's "medium" token count):
    the shapes the 20 us target is for."""
    batches = [1, 4, 16] if quick else [1, 2, 4, 8, 16]
    contexts = [512, 1024] if quick else [128, 512, 1024, 2048]
    return [
        {"batch": b, "context": c, "block_size": 16}
        for b in batches
        for c in contexts
        if b * c < DECODE_MEDIUM_TOKENS
    ]


SPLIT_PLAN_LEN = 8192  # a decode graph plans its splits for the model's length (Llama-3-8B)
SPLIT_SHORT = 128


def split_shapes(quick: bool) -> list[dict[str, Any]]:
    """A decode graph's batch planned for ``SPLIT_PLAN_LEN`` tokens: one context of ``long``
    tokens among ``batch - 1`` of ``SPLIT_SHORT``, the skew where the split modes differ most
    (on the H200's engine runs, batches 5-16 lost 18-19% of a decode step to the fixed split's
    walk, by ``benchmarks/decode_walk.py``'s fit)."""
    batches = [1, 8] if quick else [1, 4, 8, 16, 32]
    longs = [2048] if quick else [1024, 2048, 4096]
    return [
        {"batch": b, "long": n, "short": SPLIT_SHORT, "plan_len": SPLIT_PLAN_LEN, "block_size": 16}
        for b in batches
        for n in longs
    ]


def split_calls(
    shape: dict[str, Any], device: str = "cuda", dtype: torch.dtype | None = None
) -> dict[str, Callable[[], torch.Tensor]]:
    """The decode of ``shape`` under each split mode, on one cache: the long context first,
    every call planned for ``plan_len`` tokens, as the engine's decode graph is."""
    import torch

    from core.decode_split import SPLIT_MODES
    from kernels.paged_attention import paged_decode_attention

    batch, long, block_size = shape["batch"], shape["long"], shape["block_size"]
    k_cache, v_cache, tables = paged_cache(batch, long, block_size, device, dtype)
    lens = [long] + [min(shape["short"], long)] * (batch - 1)
    seq_lens = torch.tensor(lens, device=device, dtype=torch.int32)
    # Every row's table is as wide as the plan (the graph's buffers are): unused entries 0.
    width = -(-shape["plan_len"] // block_size)
    padded = torch.zeros((batch, width), device=device, dtype=torch.int32)
    padded[:, : tables.shape[1]] = tables
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, device=device, dtype=k_cache.dtype)
    scale = HEAD_DIM**-0.5

    def call(mode: str) -> Callable[[], torch.Tensor]:
        return lambda: paged_decode_attention(
            q, k_cache, v_cache, padded, seq_lens, scale,
            max_seq_len=shape["plan_len"], split_mode=mode,
        )  # fmt: skip

    return {mode: call(mode) for mode in SPLIT_MODES}


def bench_split(shape: dict[str, Any]) -> Row:
    """Both split modes of ``shape`` in a CUDA graph: the row's times are "per_sequence"'s,
    ``baseline_graph_us`` the "fixed" split's; the verdict asks per_sequence to be no slower."""
    calls = split_calls(shape)
    graph_us = graph_time_us(calls["per_sequence"])
    row = Row("decode_split", shape, time_us(calls["per_sequence"]), graph_us=graph_us)
    row.baseline_graph_us = graph_time_us(calls["fixed"])
    row.verdicts["per_sequence<=fixed in graph"] = graph_us <= 1.02 * row.baseline_graph_us
    return row


def fused_shapes(quick: bool) -> list[dict[str, Any]]:
    """Each fused op at decode-sized and prefill-sized token counts."""
    tokens = [1, 64, 2048] if quick else [1, 8, 64, 256, 2048, 8192]
    return [{"op": op, "tokens": t} for t in tokens for op in FUSED_OPS]


def kv_copies(batch: int, context: int) -> int:
    """How many distinct block tables the graph cycles through so its KV reads stay cold."""
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * ELEMENT_BYTES
    return max(1, min(MAX_KV_COPIES, math.ceil(COLD_KV_BYTES / kv_bytes)))


def fused_bytes(op: str, tokens: int) -> int:
    """HBM bytes one call of the fused kernel must move (bf16): its reads plus its writes."""
    if op == "add_rms_norm":  # read x and residual, write both; the weight once
        return (4 * tokens * HIDDEN + HIDDEN) * ELEMENT_BYTES
    if op == "silu_and_mul":  # read gate and up, write their product
        return 3 * tokens * INTERMEDIATE * ELEMENT_BYTES
    if op == "rotary":  # read and write q and k; one cache row per token
        heads = NUM_Q_HEADS + NUM_KV_HEADS
        return (2 * tokens * heads * HEAD_DIM + tokens * HEAD_DIM) * ELEMENT_BYTES
    raise ValueError(f"unknown fused op {op!r}; expected one of {FUSED_OPS}")


def graph_time_us(fn: Callable[[], Any]) -> float:
    """Median us per call of `fn` captured many times over in one CUDA graph (triton's
    do_bench_cudagraph: runs fn once eagerly first, so Triton compiles before the capture)."""
    import torch
    from triton.testing import do_bench_cudagraph

    torch.cuda.synchronize()  # the inputs, made on the default stream, are ready
    return 1000.0 * float(do_bench_cudagraph(fn, rep=50, return_mode="median"))


def decode_graph_call(
    shape: dict[str, Any],
    copies: int,
    device: str = "cuda",
    dtype: torch.dtype | None = None,
) -> Callable[[], torch.Tensor]:
    """Paged decode of `shape` whose every call reads the next of `copies` disjoint sets of
    blocks (the choice is made when the call is captured, so a graph holds them all)."""
    import torch

    from kernels.paged_attention import paged_decode_attention

    batch, context, block_size = shape["batch"], shape["context"], shape["block_size"]
    k_cache, v_cache, tables = paged_cache(batch * copies, context, block_size, device, dtype)
    table_copies = tables.view(copies, batch, -1).unbind(0)
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, device=device, dtype=k_cache.dtype)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    calls = [0]

    def run() -> torch.Tensor:
        table = table_copies[calls[0] % copies]
        calls[0] += 1
        return paged_decode_attention(
            q, k_cache, v_cache, table, seq_lens, scale, max_seq_len=context
        )

    return run


def bench_decode_graph(shape: dict[str, Any]) -> Row:
    batch, context = shape["batch"], shape["context"]
    run = decode_graph_call(shape, kv_copies(batch, context))
    graph_us = graph_time_us(run)
    row = Row("decode_graph", shape, time_us(run), graph_us=graph_us)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * ELEMENT_BYTES
    row.bandwidth_gbs = kv_bytes / graph_us / 1e3
    row.verdicts["<=20us in graph"] = graph_us <= TARGETS["decode_small_us"]
    return row


def fused_calls(
    op: str, tokens: int, device: str = "cuda", dtype: torch.dtype | None = None
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """(the fused kernel, the unfused torch ops the model's torch path runs), each returning
    its result, on one set of inputs (bf16 unless told)."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or torch.bfloat16

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    if op == "add_rms_norm":
        from kernels.rms_norm import fused_add_rms_norm

        x, residual, weight = rand(tokens, HIDDEN), rand(tokens, HIDDEN), rand(HIDDEN)

        def fused_norm() -> torch.Tensor:
            return fused_add_rms_norm(x, residual, weight, RMS_EPS)[0]

        def unfused_norm() -> torch.Tensor:
            residual.add_(x)
            return weight * F.rms_norm(residual.float(), (HIDDEN,), eps=RMS_EPS).to(dtype)

        return fused_norm, unfused_norm
    if op == "silu_and_mul":
        from kernels.activation import silu_and_mul

        gate_up = rand(tokens, 2 * INTERMEDIATE)

        def unfused_silu() -> torch.Tensor:
            gate, up = gate_up.chunk(2, dim=-1)
            return F.silu(gate) * up

        return lambda: silu_and_mul(gate_up), unfused_silu
    if op != "rotary":
        raise ValueError(f"unknown fused op {op!r}; expected one of {FUSED_OPS}")
    from kernels.rotary import rotary_embedding

    qk = rand(tokens, NUM_Q_HEADS + NUM_KV_HEADS, HEAD_DIM)
    cos_sin = rand(MAX_POSITIONS, HEAD_DIM).clamp(-1, 1)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), device=device)

    def fused_rotary() -> torch.Tensor:
        rotary_embedding(positions, qk[:, :NUM_Q_HEADS], qk[:, NUM_Q_HEADS:], cos_sin)
        return qk

    def unfused_rotary() -> torch.Tensor:
        cos, sin = (half[:, None, :] for half in cos_sin[positions].chunk(2, dim=-1))
        first, second = qk.chunk(2, dim=-1)
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    return fused_rotary, unfused_rotary


def bench_fused(shape: dict[str, Any]) -> Row:
    op, tokens = shape["op"], shape["tokens"]
    fused, unfused = fused_calls(op, tokens)
    graph_us = graph_time_us(fused)
    row = Row(op, {"tokens": tokens}, time_us(fused), graph_us=graph_us)
    row.torch_us, row.torch_graph_us = time_us(unfused), graph_time_us(unfused)
    row.bandwidth_gbs = fused_bytes(op, tokens) / graph_us / 1e3
    row.verdicts["fused<=torch in graph"] = graph_us <= row.torch_graph_us
    return row
