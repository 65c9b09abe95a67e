"""Transformer shapes the cost model needs (`ModelSpec`), named presets, and a reader for a
Hugging Face `config.json` (Llama/Mistral/Qwen2 and OPT key styles)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traces.text_files import read_text

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of the linear layers of one decoder layer (attention projections + MLP)."""
        attention = self.hidden_size * (2 * self.q_size + 2 * self.kv_size)
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return attention + mlp

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


def _require(config: dict[str, Any], key: str, path: Path, field: str) -> Any:
    if key not in config:
        raise ValueError(f"{path}: missing key {key!r} (needed for ModelSpec.{field})")
    return config[key]


def model_spec_from_hf_config(
    path: str | Path, name: str | None = None, dtype_bytes: int | None = None
) -> ModelSpec:
    """Read a Hugging Face `config.json` (a file, or a directory holding one).

    Llama, Mistral and Qwen2 use `intermediate_size` and a gated SiLU MLP; OPT is detected by
    `model_type == "opt"` or an `ffn_dim` key. `dtype_bytes` overrides `torch_dtype`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(read_text(path, "model config"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a JSON config ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    is_opt = config.get("model_type") == "opt" or "ffn_dim" in config
    hidden = _require(config, "hidden_size", path, "hidden_size")
    heads = _require(config, "num_attention_heads", path, "num_heads")
    if dtype_bytes is None:
        dtype = str(config.get("torch_dtype", "float16"))
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"{path}: unknown torch_dtype {dtype!r}; pass dtype_bytes")
        dtype_bytes = _DTYPE_BYTES[dtype]
    inter_key = "ffn_dim" if is_opt else "intermediate_size"
    return ModelSpec(
        name=name or str(config.get("_name_or_path") or path.parent.name or "hf-model"),
        num_layers=_require(config, "num_hidden_layers", path, "num_layers"),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        intermediate_size=_require(config, inter_key, path, "intermediate_size"),
        vocab_size=_require(config, "vocab_size", path, "vocab_size"),
        dtype_bytes=dtype_bytes,
        max_model_len=_require(config, "max_position_embeddings", path, "max_model_len"),
        gated_mlp=not is_opt,
        # OPT ties its LM head to the token embedding unless the config says otherwise.
        tie_word_embeddings=bool(config.get("tie_word_embeddings", is_opt)),
        uses_rope=not is_opt,
    )
