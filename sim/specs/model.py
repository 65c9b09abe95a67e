"""Transformer shapes the cost model needs (`ModelSpec`: dense or mixture-of-experts) and named
presets; `sim.specs.hf_config` reads a Hugging Face `config.json` into one."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, as far as per-step cost and KV memory are concerned.

    Biases and norm weights are left out of the parameter count: they are under 0.1% of the
    weights for every preset and cost nothing measurable per step.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    max_model_len: int = 4096
    gated_mlp: bool = True  # SwiGLU (gate + up + down); False: OPT-style fc1 + fc2
    tie_word_embeddings: bool = False
    uses_rope: bool = True  # False: learned absolute positions (OPT), no rotary work per step
    qk_norm: bool = False  # RMSNorm over each head of Q and K before RoPE (Qwen3)
    rope_scaling_type: str | None = None  # e.g. "llama3", "yarn"; max_model_len already counts it
    # Mixture of experts in every layer (Mixtral, Qwen3-MoE); 0 experts: a dense MLP of
    # intermediate_size. Each token goes to num_experts_per_token routed experts of
    # moe_intermediate_size, plus always-on shared experts of shared_expert_intermediate_size
    # in all (Qwen2-MoE, DeepSeek).
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_model_len",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelSpec.{field} must be a positive int, got {value!r}")
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"ModelSpec.dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelSpec.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        self._check_moe()

    def _check_moe(self) -> None:
        for field in (
            "num_experts",
            "num_experts_per_token",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
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


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    inter: int,
    vocab: int,
    max_len: int,
) -> ModelSpec:
    return ModelSpec(
        name, layers, hidden, heads, kv_heads, hidden // heads, inter, vocab, max_model_len=max_len
    )


def _long_context_presets() -> list[ModelSpec]:
    """Llama-3.1 (128K through llama3 RoPE scaling) and Qwen3 (explicit head_dim 128, QK norm,
    40960 positions), shapes from their config.json files on the Hugging Face hub."""

    def llama31(name: str, layers: int, hidden: int, heads: int, inter: int) -> ModelSpec:
        return ModelSpec(
            name, layers, hidden, heads, 8, 128, inter, 128256, 2, 131072,
            rope_scaling_type="llama3",
        )  # fmt: skip

    def qwen3(
        name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int
    ) -> ModelSpec:
        return ModelSpec(
            name, layers, hidden, heads, kv_heads, 128, inter, 151936, 2, 40960, qk_norm=True
        )

    return [
        llama31("Llama-3.1-8B", 32, 4096, 32, 14336),
        llama31("Llama-3.1-70B", 80, 8192, 64, 28672),
        qwen3("Qwen3-8B", 36, 4096, 32, 8, 12288),
        qwen3("Qwen3-32B", 64, 5120, 64, 8, 25600),
        # 128 experts of width 768, 8 per token, no shared expert; intermediate_size (6144) is
        # the config's, unused since every layer is a MoE layer.
        replace(
            qwen3("Qwen3-30B-A3B", 48, 2048, 32, 4, 6144),
            num_experts=128,
            num_experts_per_token=8,
            moe_intermediate_size=768,
        ),
    ]


def _model_presets() -> dict[str, ModelSpec]:
    # Shapes copied from each model's published config.json on the Hugging Face hub.
    presets = [
        _llama("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192),
        # Sliding-window attention (4096) is not modelled: it only caps decode reads past 4k.
        _llama("Mistral-7B", 32, 4096, 32, 8, 14336, 32000, 32768),
        # 32k is the native context; the 128k in the base config.json needs YaRN scaling.
        _llama("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, 32768),
        *_long_context_presets(),
        # The engine's bundled engine/model/configs/tiny-llama.json (fp32), for CPU runs.
        ModelSpec("tiny-llama", 4, 256, 8, 2, 32, 688, 8192, dtype_bytes=4, max_model_len=4096),
        ModelSpec(
            "OPT-13B",
            40,
            5120,
            40,
            40,
            128,
            20480,
            50272,
            max_model_len=2048,
            gated_mlp=False,
            tie_word_embeddings=True,
            uses_rope=False,
        ),
    ]
    return {spec.name: spec for spec in presets}


MODEL_PRESETS: dict[str, ModelSpec] = _model_presets()


def get_model_preset(name: str) -> ModelSpec:
    """Look up a preset by name, ignoring case; the error lists the valid names."""
    for key, spec in MODEL_PRESETS.items():
        if key.lower() == name.lower():
            return spec
    raise ValueError(f"unknown model {name!r}; presets are: {', '.join(sorted(MODEL_PRESETS))}")
