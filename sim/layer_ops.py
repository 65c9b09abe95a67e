"""The kernels of one decoder layer on one tensor-parallel rank, each priced by
`sim.kernel_costs`: the four linear layers, the elementwise ops and the embedding, under the
names Vidur's `mlp.csv` gives them, so the roofline and `costmodel check` share one model."""

from __future__ import annotations

from collections.abc import Callable

from sim.hardware_spec import HardwareSpec
from sim.kernel_costs import gemm_s, row_kernel_s, streaming_s
from sim.model_spec import ModelSpec, check_tp

LINEAR_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_rope",
    "post_attention_layernorm",
    "mlp_act",
    "add",
)
"""Per layer; `add` (the residual add) runs twice a layer, after attention and after the MLP."""
ELEMENTWISE_CALLS: dict[str, int] = {op: 2 if op == "add" else 1 for op in ELEMENTWISE_OPS}


class LayerOps:
    """Seconds per op for `num_tokens` tokens, per layer and rank (`emb`: once per step)."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1) -> None:
        check_tp(model, tp)
        self.model, self.hardware, self.tp = model, hardware, tp
        hidden, dtype = model.hidden_size, model.dtype_bytes
        q_size = model.q_size // tp
        kv_size = model.kv_heads_per_shard(tp) * model.head_dim
        inter = model.intermediate_size // tp
        up_out = (2 if model.gated_mlp else 1) * inter
        # (n, k) of each GEMM: output columns on this rank, and the reduced dimension.
        self._gemms = {
            "attn_pre_proj": (q_size + 2 * kv_size, hidden),
            "attn_post_proj": (hidden, q_size),
            "mlp_up_proj": (up_out, hidden),
            "mlp_down_proj": (hidden, inter),
        }
        # HBM bytes per token of each row kernel, and the row one thread block walks. RMSNorm
        # reads its row twice (sum of squares, then scale) and writes it once; rotary reads and
        # writes Q and K; SiLU-and-mul reads gate and up and writes one.
        rope = 2 * (q_size + kv_size) * dtype if model.uses_rope else 0
        self._row_kernels = {
            "input_layernorm": (3 * hidden * dtype, hidden),
            "post_attention_layernorm": (3 * hidden * dtype, hidden),
            "attn_rope": (rope, (q_size + kv_size) // 2),
            "mlp_act": ((up_out + inter) * dtype, inter),
            # The embedding gather fetches rows by id, then the vocab-parallel mask reads and
            # writes them twice more (index mask, zeroing multiply).
            "emb": (6 * hidden * dtype, hidden),
        }
        # A vectorised PyTorch kernel: the residual add reads two rows and writes one.
        self._streaming_bytes_per_token = {"add": 3 * hidden * dtype}

    def op_s(self, op: str, num_tokens: int) -> float:
        """One call of `op` (a name from LINEAR_OPS, ELEMENTWISE_OPS or `emb`)."""
        if op in self._gemms:
            n, k = self._gemms[op]
            return gemm_s(self.hardware, num_tokens, n, k, self.model.dtype_bytes)
        if op in self._row_kernels:
            num_bytes, row = self._row_kernels[op]
            return row_kernel_s(self.hardware, num_tokens * num_bytes, row) if num_bytes else 0.0
        if op in self._streaming_bytes_per_token:
            return streaming_s(self.hardware, num_tokens * self._streaming_bytes_per_token[op])
        raise ValueError(f"unknown layer op {op!r}")

    def linear_s(self, num_tokens: int) -> float:
        """The four linear layers of one layer."""
        return sum(self.op_s(op, num_tokens) for op in LINEAR_OPS)

    def elementwise_s(self, num_tokens: int) -> float:
        """The streaming ops of one layer (norms, rotary, activation, two residual adds)."""
        if num_tokens <= 0:
            return 0.0
        op_s: Callable[[str, int], float] = self.op_s
        return sum(calls * op_s(op, num_tokens) for op, calls in ELEMENTWISE_CALLS.items())
