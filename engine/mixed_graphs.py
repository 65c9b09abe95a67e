"""Mixed and prefill steps on piecewise CUDA graphs, as vLLM V1 runs them by default: the
forward is cut at each layer's attention into ``num_layers + 1`` pieces (``piece``), and each
piece is captured once per padded token count (``mixed_token_sizes``). A step that the decode
graphs do not take (a prompt chunk in it, or more decodes than they hold) and that has at most
the largest size's tokens replays its size's pieces, with each layer's attention run eagerly
between them on the step's real rows (``piece_attention``): the attention is the only work
whose launches depend on the step's sequences. So a step of a 32-layer model costs 33 graph
replays and 32 attentions' launches (one or two each) instead of about 12 launches a layer.

The pieces read and write only ``PieceBuffers`` (fixed addresses) and the KV cache they were
captured on: each piece stores its layer's new K/V at the buffers' slots, where the padding
rows (the size less the step's tokens) have slot -1 and store nothing. Padding rows run
through the pieces on stale ids and positions that were once real, so they stay finite;
attention reads the real rows only, and their logits are never taken.

Off by default (``EngineConfig.mixed_graphs``) until a GPU has measured it.
``MixedGraphs(replay=False)`` runs the same padded pieces eagerly, so the cut, the padding
and the stores are tested on CPU.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.decode_split import padded_batch_size
from engine.attention import AttentionMetadata, attend
from engine.cuda_graphs import GraphStats
from engine.model.llama import LlamaForCausalLM, StepOps, step_ops

MIXED_GRAPH_MODES = ("off", "piecewise")
# vLLM's default largest capture size: a larger step's GPU time hides its launches anyway.
MIXED_MAX_TOKENS = 512

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def check_mixed_graphs(mode: str) -> str:
    if mode not in MIXED_GRAPH_MODES:
        raise ValueError(f"mixed_graphs must be one of {MIXED_GRAPH_MODES}, got {mode!r}")
    return mode


def mixed_token_sizes(
    max_num_batched_tokens: int, largest: int = MIXED_MAX_TOKENS
) -> tuple[int, ...]:
    """The token counts the pieces are captured at: 1, 2, 4, 8, 16, then steps of 16 to 256
    and of 32 to ``largest``, capped by the step budget (the cap itself is a size)."""
    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
    cap = min(largest, max_num_batched_tokens)
    grid = (1, 2, 4, 8, *range(16, 257, 16), *range(288, largest + 1, 32))
    return (*(size for size in grid if size < cap), cap)


@dataclass(frozen=True, slots=True)
class PieceBuffers:
    """Fixed-address activations [max_tokens, ...] that carry a step between the pieces of a
    piecewise forward (``piece``): a CUDA graph reads and writes only these."""

    input_ids: torch.Tensor  # [max_tokens] int64
    positions: torch.Tensor  # [max_tokens] int64
    slot_mapping: torch.Tensor  # [max_tokens] int64: the real rows' slots, then -1
    residual: torch.Tensor  # [max_tokens, hidden]: the residual stream
    hidden: torch.Tensor  # [max_tokens, hidden]: the last layer's MLP output
    qkv: torch.Tensor  # [max_tokens, q_size + 2 kv_size]: a layer's projection
    attn_out: torch.Tensor  # [max_tokens, q_size]: a layer's attention output


def _buffers(bufs: PieceBuffers) -> tuple[torch.Tensor, ...]:
    return tuple(getattr(bufs, name) for name in PieceBuffers.__slots__)


def piece_buffers(model: LlamaForCausalLM, max_tokens: int) -> PieceBuffers:
    """The activations that carry a step of up to ``max_tokens`` rows between pieces."""
    config, device, dtype = model.config, model.device, model.dtype

    def zeros(width: int, kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.zeros((max_tokens, width), dtype=kind, device=device)

    ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
    return PieceBuffers(
        input_ids=ids,
        positions=torch.zeros_like(ids),
        slot_mapping=torch.full_like(ids, -1),
        residual=zeros(config.hidden_size),
        hidden=zeros(config.hidden_size),
        qkv=zeros(config.q_size + 2 * config.kv_size),
        attn_out=zeros(config.q_size),
    )


def piece(
    model: LlamaForCausalLM,
    index: int,
    size: int,
    ops: StepOps,
    bufs: PieceBuffers,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    backend: str,
) -> QKV | None:
    """Piece ``index`` (0..num_layers) of the forward over the first ``size`` rows of
    ``bufs``: every op between two attentions. Piece 0 embeds and runs layer 0 up to its
    q/k/v; piece i finishes layer i - 1 from ``bufs.attn_out`` and runs layer i up to its
    q/k/v (returned, the projection in ``bufs.qkv``, the K/V stored into its cache at
    ``bufs.slot_mapping``); the last piece finishes the last layer into ``bufs.hidden``. The
    residual stream stays in ``bufs.residual``."""
    layers = model.decoder_layers()
    residual = bufs.residual[:size]
    if index == 0:
        residual.copy_(F.embedding(bufs.input_ids[:size], model.embed_tokens))
        h = ops.rms_norm(residual, layers[0].input_layernorm)
    else:
        before = layers[index - 1]
        attended = before.self_attn.output(bufs.attn_out[:size])
        x, residual = before.leave(attended, residual, ops)
        if index == len(layers):
            bufs.hidden[:size].copy_(x)
            return None
        h, residual = layers[index].enter(x, residual, ops)
    q, k, v = layers[index].self_attn.project(h, ops, bufs.qkv[:size])
    _store(k, v, kv_caches[index], bufs.slot_mapping[:size], backend)
    return q, k, v


def _store(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,
    backend: str,
) -> None:
    if backend == "torch":
        from kernels.reference import store_kv_ref

        store_kv_ref(k, v, kv_cache[0], kv_cache[1], slot_mapping)
        return
    # Imported here: triton's @jit reads TRITON_INTERPRET as the module loads.
    from kernels.cache_ops import plan_store_kv, run_store_kv

    launch = plan_store_kv(kv_cache[0], kv_cache[1], slot_mapping, backend=backend)
    run_store_kv(launch, k, v, kv_cache[0], kv_cache[1])


def piece_attention(
    model: LlamaForCausalLM,
    index: int,
    qkv: QKV,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    bufs: PieceBuffers,
) -> None:
    """Layer ``index``'s attention between its pieces, eager, on the step's real rows
    (``meta.num_tokens`` of the padded q/k/v, their K/V stored by the piece): writes
    ``bufs.attn_out``."""
    num_rows = meta.num_tokens
    attn = model.decoder_layers()[index].self_attn
    q, k, v = (part[:num_rows] for part in qkv)
    out = bufs.attn_out[:num_rows].view(num_rows, attn.num_heads, attn.head_dim)
    attend(q, k, v, kv_cache[0], kv_cache[1], meta, attn.scale, out, store=False)


class MixedGraphs:
    """The piecewise graphs of one model on one KV cache (``kv_caches``, a pair per layer):
    ``num_layers + 1`` pieces per size in ``sizes`` (ascending), captured into one memory pool
    over one set of ``PieceBuffers`` (the largest size's rows). Only one size replays at a
    time, and a piece's temporaries are dead before the next piece runs, so every graph
    shares the pool."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        sizes: tuple[int, ...],
        backend: str,
        replay: bool,
    ) -> None:
        if replay and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {model.device}")
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"sizes must be ascending positive token counts, got {sizes}")
        if len(kv_caches) != model.config.num_layers:
            raise ValueError(
                f"kv_caches has {len(kv_caches)} layers, the model {model.config.num_layers}"
            )
        self.model, self.kv_caches, self.sizes = model, kv_caches, sizes
        self.backend, self.replay = backend, replay
        self.bufs = piece_buffers(model, sizes[-1])
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self._qkv: dict[int, list[QKV | None]] = {}
        self._ops: dict[int, StepOps] = {}

    @property
    def num_pieces(self) -> int:
        return self.model.config.num_layers + 1

    def size_for(self, num_tokens: int) -> int | None:
        """The smallest size that holds a step of ``num_tokens`` rows, None if none does."""
        return padded_batch_size(self.sizes, num_tokens)

    def capture(self) -> GraphStats:
        """Capture every size's pieces, largest first (after one eager pass that compiles
        the kernels), and measure the device memory they took, their buffers included."""
        if not self.replay:
            raise ValueError("capture needs replay=True")
        device = self.model.device
        gc.collect()  # as DecodeGraphs.capture: memory a dropped engine held is not counted
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info(device)[0]
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for size in reversed(self.sizes):
                ops = self._ops[size] = self._step_ops(size)
                for index in range(self.num_pieces):  # (every slot -1: nothing stored)
                    self._piece(index, size, ops)
                graphs, outputs = [], []
                for index in range(self.num_pieces):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        outputs.append(self._piece(index, size, ops))
                    graphs.append(graph)
                self._graphs[size], self._qkv[size] = graphs, outputs
        torch.cuda.synchronize(device)
        used = free_before - torch.cuda.mem_get_info(device)[0] + self.buffer_bytes
        return GraphStats(len(self.sizes) * self.num_pieces, time.perf_counter() - start, used)

    @property
    def buffer_bytes(self) -> int:
        """The ``PieceBuffers``' device bytes (allocated before the capture measures)."""
        return sum(t.numel() * t.element_size() for t in _buffers(self.bufs))

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """The model's forward (same arguments, same logits) through the pieces of the size
        that holds the step: its ids, positions and slots are copied into the buffers (the
        padding's slots set to -1), each piece replays (or, with ``replay=False``, runs on
        the same padded buffers), and each layer's attention runs between them on the real
        rows. ``kv_caches`` must be the cache the pieces were built on."""
        num_tokens = int(input_ids.shape[0])
        size = self.size_for(num_tokens)
        if size is None:
            raise ValueError(f"a step of {num_tokens} tokens fits no size of {self.sizes}")
        if meta.num_tokens != num_tokens:
            raise ValueError(f"meta has {meta.num_tokens} rows but input_ids {num_tokens}")
        if kv_caches is not self.kv_caches:
            raise ValueError("the pieces store into the KV cache they were built on, not this one")
        bufs, model = self.bufs, self.model
        bufs.input_ids[:num_tokens].copy_(input_ids)
        bufs.positions[:num_tokens].copy_(positions)
        bufs.slot_mapping[:num_tokens].copy_(meta.slot_mapping)
        bufs.slot_mapping[num_tokens:size].fill_(-1)
        ops = self._ops[size] if self.replay else self._step_ops(size)
        for index in range(self.num_pieces):
            if self.replay:
                self._graphs[size][index].replay()
                qkv = self._qkv[size][index]
            else:
                qkv = self._piece(index, size, ops)
            if qkv is not None:
                piece_attention(model, index, qkv, kv_caches[index], meta, bufs)
        return model.logits(bufs.hidden[:size], bufs.residual[:size], ops, logits_indices)

    def _piece(self, index: int, size: int, ops: StepOps) -> QKV | None:
        return piece(self.model, index, size, ops, self.bufs, self.kv_caches, self.backend)

    def _step_ops(self, size: int) -> StepOps:
        return step_ops(self.bufs.positions[:size], self.model.cos_sin_cache, self.backend)
