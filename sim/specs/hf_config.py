"""Read a Hugging Face `config.json` into a `ModelSpec`: Llama 2/3/3.1-3.3, Mistral, Qwen2/2.5,
Qwen3, OPT, and the mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.model.config_json import read_config_json
from sim.specs.model import ModelSpec

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")
# RoPE scalings whose max_position_embeddings already is the scaled context (vLLM's rule).
_SCALED_ALREADY = ("llama3", "longrope", "su", "dynamic", "default", "mrope")


def _require(config: dict[str, Any], key: str, path: Path, field: str) -> Any:
    if key not in config:
        raise ValueError(f"{path}: missing key {key!r} (needed for ModelSpec.{field})")
    return config[key]


def _dtype_bytes(config: dict[str, Any], path: Path) -> int:
    # Recent transformers write "dtype"; older ones "torch_dtype".
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float16")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{path}: unknown torch_dtype {dtype!r}; pass dtype_bytes")
    return _DTYPE_BYTES[dtype]


def context_length(config: dict[str, Any], path: Path) -> tuple[int, str | None]:
    """(max_model_len, RoPE scaling type) as vLLM derives them: llama3 and longrope scalings
    are already counted in `max_position_embeddings`; others (yarn, linear) multiply the
    original length by their factor."""
    positions = _require(config, "max_position_embeddings", path, "max_model_len")
    scaling = config.get("rope_scaling")
    if not scaling:
        return positions, None
    if not isinstance(scaling, dict):
        raise ValueError(f"{path}: rope_scaling must be an object or null, got {scaling!r}")
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default")
    factor = scaling.get("factor")
    if kind in _SCALED_ALREADY or factor is None:
        return positions, kind
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
        raise ValueError(f"{path}: rope_scaling.factor must be a number >= 1, got {factor!r}")
    base = (
        scaling.get("original_max_position_embeddings", positions) if kind == "yarn" else positions
    )
    return int(base * factor), kind


def _moe_fields(config: dict[str, Any], path: Path, model_type: str) -> dict[str, int]:
    """The MoE keywords of ModelSpec; empty for a dense model."""
    num_experts = config.get("num_experts") or config.get("num_local_experts") or 0
    if not num_experts:
        return {}
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise ValueError(
            f"{path}: dense layers between MoE layers (mlp_only_layers, decoder_sparse_step) "
            "are not modelled; only configs with experts in every layer are"
        )
    # Mixtral gives its expert width as intermediate_size.
    width_key = "intermediate_size" if model_type == "mixtral" else "moe_intermediate_size"
    return {
        "num_experts": num_experts,
        "num_experts_per_token": _require(config, "num_experts_per_tok", path, "num_experts"),
        "moe_intermediate_size": _require(config, width_key, path, "moe_intermediate_size"),
        "shared_expert_intermediate_size": config.get("shared_expert_intermediate_size") or 0,
    }


def _whole_head_dim(hidden: int, heads: int, path: Path) -> int:
    """hidden_size / num_attention_heads, for a config without `head_dim` (as the engine's
    reader: a remainder is an error, not rounded away)."""
    if hidden % heads:
        raise ValueError(
            f"{path}: head_dim is missing, and hidden_size={hidden} / "
            f"num_attention_heads={heads} is not whole"
        )
    return hidden // heads


def model_spec_from_hf_config(
    path: str | Path, name: str | None = None, dtype_bytes: int | None = None
) -> ModelSpec:
    """Read a Hugging Face `config.json` (a file, or a directory holding one).

    Llama, Mistral, Qwen2/3 use `intermediate_size` and a gated SiLU MLP; OPT is detected by
    `model_type == "opt"` or an `ffn_dim` key. `head_dim` is taken when given (Qwen3's is not
    hidden / heads). `dtype_bytes` overrides the config's dtype. Errors name the file and key.
    """
    path, config = read_config_json(path)
    model_type = str(config.get("model_type", ""))
    is_opt = model_type == "opt" or "ffn_dim" in config
    hidden = _require(config, "hidden_size", path, "hidden_size")
    heads = _require(config, "num_attention_heads", path, "num_heads")
    max_model_len, rope_scaling_type = context_length(config, path)
    inter_key = "ffn_dim" if is_opt else "intermediate_size"
    moe = _moe_fields(config, path, model_type)
    inter = config.get(inter_key) if moe else _require(config, inter_key, path, "intermediate_size")
    try:
        return ModelSpec(
            name=name or str(config.get("_name_or_path") or path.parent.name or "hf-model"),
            num_layers=_require(config, "num_hidden_layers", path, "num_layers"),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or _whole_head_dim(hidden, heads, path),
            intermediate_size=inter or moe["moe_intermediate_size"],
            vocab_size=_require(config, "vocab_size", path, "vocab_size"),
            dtype_bytes=dtype_bytes if dtype_bytes is not None else _dtype_bytes(config, path),
            max_model_len=max_model_len,
            gated_mlp=not is_opt,
            # OPT ties its LM head to the token embedding unless the config says otherwise.
            tie_word_embeddings=bool(config.get("tie_word_embeddings", is_opt)),
            uses_rope=not is_opt,
            qk_norm=model_type in _QK_NORM_TYPES,
            rope_scaling_type=rope_scaling_type,
            **moe,
        )
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error
