"""The one description of a decoder-only transformer (`ModelSpec`): the shapes the simulator's
cost model prices and the numerics the engine's torch model runs, with its RoPE scaling
(`RopeScaling`) and the dtype table. ``core.model.hf_config`` reads one from a ``config.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

# Bytes per value of each dtype a checkpoint may name, and the other spellings of those names.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "bf16": "bfloat16"}
# An unstated dtype is priced as 16-bit, the width every published checkpoint we model uses.
DEFAULT_DTYPE_BYTES = 2

# RoPE scalings whose max_position_embeddings already is the scaled context (vLLM's rule);
# the others multiply their original context by `factor`.
SCALED_ALREADY = ("llama3", "longrope", "su", "dynamic", "mrope")
# The keys each scaling cannot do without (Hugging Face's rope validation asks the same).
_ROPE_NEEDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """A RoPE frequency scaling. ``linear`` divides every frequency by ``factor``; ``llama3``
    (Llama 3.1) divides only the low ones, blending between two bands; ``yarn`` and others are
    read for the context they give (`context_length`), not run by the engine."""

    rope_type: str
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rope_type, str) or self.rope_type in ("", "default"):
            raise ValueError(
                f"RopeScaling.rope_type must name a scaling (not 'default'), got {self.rope_type!r}"
            )
        for field in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, field)
            if value is not None and (not is_number(value) or value <= 0):
                raise ValueError(f"RopeScaling.{field} must be a positive number, got {value!r}")
        original = self.original_max_position_embeddings
        if original is not None and (not is_int(original) or original <= 0):
            raise ValueError(
                "RopeScaling.original_max_position_embeddings must be a positive int, "
                f"got {original!r}"
            )
        for field in _ROPE_NEEDS.get(self.rope_type, ()):
            if getattr(self, field) is None:
                raise ValueError(
                    f"RopeScaling.{field} is missing (RoPE scaling {self.rope_type!r} needs it)"
                )
        low, high = self.low_freq_factor, self.high_freq_factor
        if self.rope_type == "llama3" and high is not None and low is not None and high <= low:
            raise ValueError(
                f"RopeScaling.high_freq_factor={high!r} must exceed low_freq_factor={low!r}"
            )
        if not self.counted_in_positions and self.factor is not None and self.factor < 1:
            raise ValueError(
                f"RopeScaling.factor must be >= 1 for a {self.rope_type!r} scaling, which "
                f"multiplies the context, got {self.factor!r}"
            )

    @property
    def counted_in_positions(self) -> bool:
        """Whether max_position_embeddings already is the scaled context."""
        return self.rope_type in SCALED_ALREADY or self.factor is None

    def context_length(self, max_position_embeddings: int) -> int:
        """The scaled context, as vLLM derives it: yarn multiplies its original length (the
        positions when it names none), linear and the like multiply the positions."""
        if self.counted_in_positions or self.factor is None:
            return max_position_embeddings
        base = max_position_embeddings
        if self.rope_type == "yarn" and self.original_max_position_embeddings is not None:
            base = self.original_max_position_embeddings
        return int(base * self.factor)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer: dense or mixture-of-experts shapes, and the numerics of a
    Llama-family model (RMSNorm, RoPE, GQA attention, SwiGLU MLP) for the engine.

    Biases and norm weights are left out of the parameter count: they are under 0.1% of the
    weights for every preset and cost nothing measurable per step. ``sliding_window`` is kept
    but applied by neither executor (see `full_attention_len`).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str | None = None  # the checkpoint's (a DTYPE_BYTES key); None: the config is silent
    architecture: str = ""  # Hugging Face's class, e.g. "LlamaForCausalLM"; "": not named
    model_type: str = ""  # Hugging Face's model_type, e.g. "llama"; "": not named
    gated_mlp: bool = True  # SwiGLU (gate + up + down); False: OPT-style fc1 + fc2
    tie_word_embeddings: bool = False
    uses_rope: bool = True  # False: learned absolute positions (OPT), no rotary work per step
    qk_norm: bool = False  # RMSNorm over each head of Q and K before RoPE (Qwen3)
    rope_scaling: RopeScaling | None = None
    # Mixture of experts in every layer (Mixtral, Qwen3-MoE); 0 experts: a dense MLP of
    # intermediate_size. Each token goes to num_experts_per_token routed experts of
    # moe_intermediate_size, plus always-on shared experts of shared_expert_intermediate_size
    # in all (Qwen2-MoE, DeepSeek).
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    # Numerics the cost model does not price; the engine's torch model runs them.
    hidden_act: str = "silu"
    rms_norm_eps: float | None = None  # None: the config does not say (OPT: LayerNorm)
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # a config may name several, as Llama-3.1's does

    def __post_init__(self) -> None:
        self._check_shapes()
        self._check_moe()
        self._check_numerics()

    def _check_shapes(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            if not is_int(value) or value <= 0:
                raise ValueError(f"ModelSpec.{field} must be a positive int, got {value!r}")
        if self.dtype is not None and self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"ModelSpec.dtype must be one of {sorted(DTYPE_BYTES)} or None, got {self.dtype!r}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelSpec.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        for field in ("gated_mlp", "tie_word_embeddings", "uses_rope", "qk_norm"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"ModelSpec.{field} must be a bool, got {getattr(self, field)!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(
                f"ModelSpec.rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}"
            )

    def _check_moe(self) -> None:
        for field in (
            "num_experts",
            "num_experts_per_token",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        ):
            value = getattr(self, field)
            if not is_int(value) or value < 0:
                raise ValueError(f"ModelSpec.{field} must be an int >= 0, got {value!r}")
        if self.num_experts == 0:
            for field in (
                "num_experts_per_token",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
            ):
                if getattr(self, field):
                    raise ValueError(
                        f"ModelSpec.{field}={getattr(self, field)!r} needs num_experts > 0"
                    )
            return
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"ModelSpec.num_experts_per_token must be in [1, num_experts={self.num_experts}]"
                f", got {self.num_experts_per_token!r}"
            )
        if self.moe_intermediate_size <= 0:
            raise ValueError(
                "ModelSpec.moe_intermediate_size must be positive for a mixture of experts, "
                f"got {self.moe_intermediate_size!r}"
            )
        if not self.gated_mlp:
            raise ValueError("ModelSpec.gated_mlp must be True for a mixture of experts")

    def _check_numerics(self) -> None:
        eps = self.rms_norm_eps
        if eps is not None and (not is_number(eps) or eps <= 0):
            raise ValueError(f"ModelSpec.rms_norm_eps must be a positive number, got {eps!r}")
        if not is_number(self.rope_theta) or self.rope_theta <= 0:
            raise ValueError(
                f"ModelSpec.rope_theta must be a positive number, got {self.rope_theta!r}"
            )
        rotary = self.partial_rotary_factor
        if not is_number(rotary) or not 0 < rotary <= 1:
            raise ValueError(f"ModelSpec.partial_rotary_factor must be in (0, 1], got {rotary!r}")
        for field in ("qkv_bias", "o_bias", "mlp_bias"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"ModelSpec.{field} must be a bool, got {getattr(self, field)!r}")
        window = self.sliding_window
        if window is not None and (not is_int(window) or window <= 0):
            raise ValueError(f"ModelSpec.sliding_window must be a positive int, got {window!r}")
        if not isinstance(self.eos_token_ids, tuple) or not all(
            is_int(i) for i in self.eos_token_ids
        ):
            raise ValueError(
                f"ModelSpec.eos_token_ids must be a tuple of ints, got {self.eos_token_ids!r}"
            )
        for field in ("hidden_act", "architecture", "model_type"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(f"ModelSpec.{field} must be a str, got {getattr(self, field)!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] if self.dtype is not None else DEFAULT_DTYPE_BYTES

    @property
    def max_model_len(self) -> int:
        """The context the model serves: its positions, scaled as `RopeScaling.context_length`
        says (vLLM's rule)."""
        if self.rope_scaling is None:
            return self.max_position_embeddings
        return self.rope_scaling.context_length(self.max_position_embeddings)

    @property
    def full_attention_len(self) -> int:
        """The longest sequence that full attention runs exactly: `max_model_len`, capped at a
        sliding window (the engine attends to the whole sequence; where the window would cut,
        the two differ)."""
        if self.sliding_window is None:
            return self.max_model_len
        return min(self.max_model_len, self.sliding_window)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """Q, K, V and output projections of one layer."""
        return self.hidden_size * (2 * self.q_size + 2 * self.kv_size)

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up, down); 0 for a dense model."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def always_on_mlp_params_per_layer(self) -> int:
        """MLP weights every token uses: the dense MLP, or the router and shared experts."""
        if not self.is_moe:
            return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        router = self.hidden_size * self.num_experts
        return router + 3 * self.hidden_size * self.shared_expert_intermediate_size

    @property
    def mlp_active_intermediate(self) -> int:
        """MLP width one token passes through: intermediate_size, or its routed experts' and
        the shared experts' widths together."""
        if not self.is_moe:
            return self.intermediate_size
        routed = self.num_experts_per_token * self.moe_intermediate_size
        return routed + self.shared_expert_intermediate_size

    @property
    def params_per_layer(self) -> int:
        """Weights of the linear layers of one decoder layer (attention projections + MLP,
        all experts included)."""
        experts = self.num_experts * self.expert_params
        return self.attention_params_per_layer + self.always_on_mlp_params_per_layer + experts

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token multiplies by in one layer: only its routed experts count."""
        routed = self.num_experts_per_token * self.expert_params
        return self.attention_params_per_layer + self.always_on_mlp_params_per_layer + routed

    @property
    def embedding_params(self) -> int:
        """Token embedding, LM head unless tied, and learned positions when there is no RoPE."""
        tokens = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else tokens
        positions = 0 if self.uses_rope else self.max_model_len * self.hidden_size
        return tokens + lm_head + positions

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.embedding_params

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def kv_heads_per_shard(self, tp: int) -> int:
        """KV heads one tensor-parallel rank holds; replicated when there are fewer than ranks."""
        check_tp(self, tp)
        return max(1, self.num_kv_heads // tp)

    def weight_bytes_per_shard(self, tp: int) -> int:
        """Weights one rank holds: linear layers and the vocab-parallel embeddings split by tp."""
        check_tp(self, tp)
        return -(-self.weight_bytes // tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """K and V bytes of one token over all layers, for one rank (tp=1: the whole model)."""
        per_rank = self.num_layers * 2 * self.kv_heads_per_shard(tp) * self.head_dim
        return per_rank * self.dtype_bytes

    def kv_bytes_per_block(self, block_size: int, tp: int = 1) -> int:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size!r}")
        return block_size * self.kv_bytes_per_token(tp)


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise ValueError unless `tp` shards the model's heads evenly (as Megatron-style TP needs)."""
    if not isinstance(tp, int) or tp <= 0:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    if model.num_heads % tp != 0:
        raise ValueError(f"tp={tp} must divide {model.name}'s num_heads={model.num_heads}")
    if model.num_kv_heads % tp != 0 and tp % model.num_kv_heads != 0:
        raise ValueError(
            f"tp={tp} and {model.name}'s num_kv_heads={model.num_kv_heads}: one must divide the "
            "other"
        )
