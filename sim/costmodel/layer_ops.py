"""The kernels of one decoder layer on one tensor-parallel rank, each priced by
`sim.costmodel.kernel_costs`: the four linear layers, the elementwise ops and the embedding,
under the names Vidur's `mlp.csv` gives them, so the roofline and `costmodel check` share one
model."""

from __future__ import annotations

from collections.abc import Callable

from core.model.spec import ModelSpec, check_tp
from sim.costmodel.kernel_costs import embedding_s, gemm_s, row_kernel_s, streaming_s
from sim.specs.hardware import HardwareSpec

LINEAR_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_rope",
    "post_attention_layernorm",
    "mlp_act",
    "add",
    "attn_qk_norm",
)
"""Per layer; `add` (the residual add) runs twice a layer, after attention and after the MLP.
`attn_qk_norm` (Qwen3's RMSNorm over each head of Q and K) is not one of Vidur's names; it
costs nothing for models without it."""
MOE_OPS: tuple[str, ...] = ("mlp_router", "mlp_experts")
"""A mixture-of-experts layer's MLP besides its shared experts (which take `mlp_up_proj` and
`mlp_down_proj`): the router GEMM and the routed experts (`LayerOps.experts_s`)."""
ELEMENTWISE_CALLS: dict[str, int] = {op: 2 if op == "add" else 1 for op in ELEMENTWISE_OPS}


def experts_touched(model: ModelSpec, num_tokens: float) -> float:
    """Distinct routed experts ``num_tokens`` tokens use, per layer, in expectation when each
    token picks k of E experts uniformly: E (1 - (1 - k/E)^T)."""
    experts, k = model.num_experts, model.num_experts_per_token
    if not experts or num_tokens <= 0:
        return 0.0
    return float(experts * (1.0 - (1.0 - k / experts) ** num_tokens))


class LayerOps:
    """Seconds per op for `num_tokens` tokens, per layer and rank (`emb`: once per step)."""

    def __init__(
        self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1, *, fused: bool = False
    ) -> None:
        """``fused``: a layer's elementwise work is servesim's fused kernels
        (`fused_elementwise_s`), not vLLM's row kernels and adds after Vidur's tables."""
        check_tp(model, tp)
        self.model, self.hardware, self.tp = model, hardware, tp
        self.fused = fused
        hidden, dtype = model.hidden_size, model.dtype_bytes
        q_size = model.q_size // tp
        kv_size = model.kv_heads_per_shard(tp) * model.head_dim
        # A MoE model's dense GEMMs are its shared experts (none: width 0) and the router
        # (replicated on every rank, as vLLM's); its routed experts are priced by `experts_s`.
        dense = model.shared_expert_intermediate_size if model.is_moe else model.intermediate_size
        inter = dense // tp
        up_out = (2 if model.gated_mlp else 1) * inter
        # (n, k) of each GEMM: output columns on this rank, and the reduced dimension.
        self._gemms = {
            "attn_pre_proj": (q_size + 2 * kv_size, hidden),
            "attn_post_proj": (hidden, q_size),
            "mlp_up_proj": (up_out, hidden),
            "mlp_down_proj": (hidden, inter),
        }
        if model.is_moe:
            self._gemms["mlp_router"] = (model.num_experts, hidden)
        # Routed experts on this rank: TP shards every expert over the ranks; EP over the same
        # ranks (one data-parallel rank, as here) places E/tp whole experts on each, which
        # touches the same bytes per rank in expectation.
        expert_inter = model.moe_intermediate_size / tp
        self._expert_flops_per_pair = 2 * model.expert_params / tp
        self._expert_bytes = model.expert_params * dtype / tp
        # Per (token, expert) pair: the token read by gate-up, gate-up's output, the activation's
        # output read by down, and down's output written.
        self._expert_act_bytes_per_pair = dtype * (2 * hidden + 3 * expert_inter)
        # The activation runs over the token's whole MLP width: shared and routed experts.
        act_inter = model.mlp_active_intermediate // tp
        act_up_out = (2 if model.gated_mlp else 1) * act_inter
        # HBM bytes per token of each row kernel, and the row one thread block walks. RMSNorm
        # reads its row twice (sum of squares, then scale) and writes it once; rotary reads and
        # writes Q and K; SiLU-and-mul reads gate and up and writes one.
        rope = 2 * (q_size + kv_size) * dtype if model.uses_rope else 0
        qk_norm = 3 * (q_size + kv_size) * dtype if model.qk_norm else 0
        self._row_kernels = {
            "input_layernorm": (3 * hidden * dtype, hidden),
            "post_attention_layernorm": (3 * hidden * dtype, hidden),
            "attn_rope": (rope, (q_size + kv_size) // 2),
            "attn_qk_norm": (qk_norm, model.head_dim),
            "mlp_act": ((act_up_out + act_inter) * dtype, act_inter),
        }
        # The embedding gather fetches rows by id, then the vocab-parallel mask reads and
        # writes them twice more (index mask, zeroing multiply): bytes per token, row width.
        self._embedding = (6 * hidden * dtype, hidden)
        # A vectorised PyTorch kernel: the residual add reads two rows and writes one.
        self._streaming_bytes_per_token = {"add": 3 * hidden * dtype}
        # servesim's fused kernels, HBM bytes per token each: two add+RMSNorms (read the
        # output and the residual, write both), rotary in place (read and write Q and K), the
        # QK norm in place where the model has one, SiLU-and-mul (read gate and up, write one).
        kernels = [4 * hidden * dtype, 4 * hidden * dtype, (act_up_out + act_inter) * dtype]
        kernels += [rope] if rope else []
        kernels += [2 * (q_size + kv_size) * dtype] if model.qk_norm else []
        self._fused_bytes_per_token = tuple(kernels)

    def op_s(self, op: str, num_tokens: int) -> float:
        """One call of `op` (a name from LINEAR_OPS, ELEMENTWISE_OPS or `emb`)."""
        if op == "mlp_experts":
            return self.experts_s(num_tokens)
        if op in self._gemms:
            n, k = self._gemms[op]
            if n <= 0 or k <= 0:
                return 0.0
            return gemm_s(self.hardware, num_tokens, n, k, self.model.dtype_bytes)
        if op == "emb":
            num_bytes, row = self._embedding
            return embedding_s(self.hardware, num_tokens, num_tokens * num_bytes, row)
        if op in self._row_kernels:
            num_bytes, row = self._row_kernels[op]
            if not num_bytes:
                return 0.0
            # Rotary pairs element i of each head with element i + head_dim / 2: two strided,
            # unvectorised loads per pair, so it streams below the other row kernels.
            efficiency = self.hardware.rotary_bandwidth_efficiency if op == "attn_rope" else None
            return row_kernel_s(self.hardware, num_tokens * num_bytes, row, efficiency)
        if op in self._streaming_bytes_per_token:
            return streaming_s(
                self.hardware,
                num_tokens * self._streaming_bytes_per_token[op],
                self.hardware.streaming_bandwidth_efficiency,
            )
        raise ValueError(f"unknown layer op {op!r}")

    def expected_experts_touched(self, num_tokens: int) -> float:
        """``experts_touched`` of this layer's model."""
        return experts_touched(self.model, num_tokens)

    def expert_weight_bytes(self, num_tokens: int) -> float:
        """Routed-expert weights one rank reads in one layer: each touched expert once,
        whatever the number of its tokens."""
        return self.expected_experts_touched(num_tokens) * self._expert_bytes

    def experts_s(self, num_tokens: int) -> float:
        """The routed experts of one layer, as a fused MoE kernel (two grouped GEMMs): FLOPs of
        the k experts each token uses, bytes of the experts the step touches."""
        if not self.model.is_moe or num_tokens <= 0:
            return 0.0
        hw = self.hardware
        pairs = num_tokens * self.model.num_experts_per_token
        flops_per_s = hw.peak_flops(self.model.dtype_bytes) * hw.gemm_flops_efficiency
        compute = pairs * self._expert_flops_per_pair / flops_per_s
        num_bytes = self.expert_weight_bytes(num_tokens) + pairs * self._expert_act_bytes_per_pair
        memory = num_bytes / (hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency)
        return 2 * hw.gemm_latency_s + max(compute, memory)

    def linear_s(self, num_tokens: int) -> float:
        """The four linear layers of one layer (a MoE model's router and routed experts too)."""
        ops = LINEAR_OPS + MOE_OPS if self.model.is_moe else LINEAR_OPS
        return sum(self.op_s(op, num_tokens) for op in ops)

    def elementwise_s(self, num_tokens: int) -> float:
        """The streaming ops of one layer (norms, rotary, activation, two residual adds):
        vLLM's kernels, or servesim's fused ones (``fused``)."""
        if num_tokens <= 0:
            return 0.0
        if self.fused:
            return self.fused_elementwise_s(num_tokens)
        op_s: Callable[[str, int], float] = self.op_s
        return sum(calls * op_s(op, num_tokens) for op, calls in ELEMENTWISE_CALLS.items())

    def fused_elementwise_s(self, num_tokens: int) -> float:
        """servesim's fused kernels of one layer, one Triton program a row held whole: each
        its fixed cost (`fused_row_latency_s`) plus its bytes at `fused_row_bandwidth_efficiency`.
        A fixed cost added, not a floor: the kernels' tables grow with their bytes from the first
        tokens on (H200: 13.3 us a layer at 2-16 tokens, 98 us at 2,048)."""
        if num_tokens <= 0:
            return 0.0
        hw = self.hardware
        rate = hw.hbm_bandwidth_bytes_per_s * hw.fused_row_bandwidth_efficiency
        num_bytes = num_tokens * self.fused_bytes_per_token
        return self.num_fused_kernels * hw.fused_row_latency_s + num_bytes / rate

    @property
    def num_fused_kernels(self) -> int:
        """servesim's fused row kernels a layer runs."""
        return len(self._fused_bytes_per_token)

    @property
    def fused_bytes_per_token(self) -> int:
        """HBM bytes a token of them moves, all together."""
        return sum(self._fused_bytes_per_token)
