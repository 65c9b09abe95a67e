"""The one reader of a Hugging Face ``config.json`` into a `ModelSpec` (Llama 2/3/3.1, Mistral,
Qwen2/2.5, Qwen3, OPT, and the mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE): the
simulator and the engine both read through it. Standard library only; errors name the file and
the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.model.spec import DTYPE_ALIASES, DTYPE_BYTES, ModelSpec, RopeScaling, is_int
from core.text_files import read_text

# Hugging Face classes by the model_type they implement: a config's `architectures` entry
# decides its family where the two disagree (as the class is what transformers builds).
ARCHITECTURE_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "OPTForCausalLM": "opt",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")


def config_json_path(path: str | Path) -> Path:
    """``path`` itself, or the ``config.json`` inside it when it is a directory."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def read_config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(the file read, its top-level object) for a ``config.json`` or a directory holding one;
    a gzip-compressed file is read as is. Errors name the file."""
    path = config_json_path(path)
    try:
        config = json.loads(read_text(path, "model config"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a JSON config ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return path, config


class _Keys:
    """One config's keys, each error naming the source and the key."""

    def __init__(self, config: dict[str, Any], source: str) -> None:
        self.config = config
        self.source = source
        self.unknown_architecture = ""  # set when `architectures` names a class we do not know

    def error(self, key: str, message: str) -> ValueError:
        return ValueError(f"{self.source}: field {key!r}: {message}")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    def required(self, key: str, field: str) -> Any:
        value = self.config.get(key)
        if value is None and self.unknown_architecture:
            # Another family's keys (GPT-2's n_embd, ...): its class is the better answer.
            raise self.error(
                "architectures",
                f"unsupported architecture {self.unknown_architecture!r}: its config has no "
                f"{key!r} (known: {', '.join(ARCHITECTURE_TYPES)})",
            )
        if value is None:
            raise self.error(key, f"missing (ModelSpec.{field} needs it)")
        return value


def _architecture(keys: _Keys) -> str:
    names = keys.get("architectures", [])
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise keys.error("architectures", f"must be a list of class names, got {names!r}")
    return names[0] if names else ""


def _head_dim(keys: _Keys, hidden: Any, heads: Any) -> Any:
    """`head_dim` when given (Qwen3's is not hidden / heads), else hidden / heads, which must
    be whole (a remainder is an error, not rounded away)."""
    head_dim = keys.get("head_dim")
    if head_dim is not None:
        return head_dim
    if not (is_int(hidden) and is_int(heads) and heads > 0):
        return None  # ModelSpec's checks then name the bad hidden_size or num_heads
    if hidden % heads:
        raise keys.error(
            "head_dim",
            f"missing, and hidden_size={hidden} / num_attention_heads={heads} is not whole",
        )
    return hidden // heads


def _rope(keys: _Keys) -> tuple[Any, Any, RopeScaling | None]:
    """(rope_theta, partial_rotary_factor, scaling) from the v4 keys (`rope_theta`,
    `rope_scaling`) or the v5 one (`rope_parameters`, holding all three)."""
    key = "rope_parameters" if "rope_parameters" in keys.config else "rope_scaling"
    params = keys.get(key, {})
    if not isinstance(params, dict):
        raise keys.error(key, f"must be an object or null, got {params!r}")
    theta = params.get("rope_theta", keys.get("rope_theta", 10000.0))
    rotary = params.get("partial_rotary_factor", keys.get("partial_rotary_factor", 1.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, rotary, None
    try:
        scaling = RopeScaling(
            str(rope_type),
            params.get("factor"),
            params.get("low_freq_factor"),
            params.get("high_freq_factor"),
            params.get("original_max_position_embeddings"),
        )
    except ValueError as error:
        raise keys.error(key, str(error)) from error
    return theta, rotary, scaling


def _dtype(keys: _Keys) -> str | None:
    # Recent transformers write "dtype" and older ones "torch_dtype"; where a config has both,
    # "dtype" is the newer and wins.
    key = "dtype" if keys.get("dtype") is not None else "torch_dtype"
    value = keys.get(key)
    if value is None:
        return None
    name = DTYPE_ALIASES.get(str(value), str(value))
    if name not in DTYPE_BYTES:
        raise keys.error(key, f"unknown dtype {value!r}; known: {', '.join(DTYPE_BYTES)}")
    return name


def _moe_fields(keys: _Keys, family: str) -> dict[str, Any]:
    """The MoE keywords of ModelSpec; empty for a dense model."""
    num_experts = keys.get("num_experts") or keys.get("num_local_experts") or 0
    if not num_experts:
        return {}
    if keys.get("mlp_only_layers") or keys.get("decoder_sparse_step", 1) != 1:
        raise keys.error(
            "mlp_only_layers",
            "dense layers between MoE layers (mlp_only_layers, decoder_sparse_step) are not "
            "modelled; only configs with experts in every layer are",
        )
    # Mixtral gives its expert width as intermediate_size.
    width_key = "intermediate_size" if family == "mixtral" else "moe_intermediate_size"
    return {
        "num_experts": num_experts,
        "num_experts_per_token": keys.required("num_experts_per_tok", "num_experts_per_token"),
        "moe_intermediate_size": keys.required(width_key, "moe_intermediate_size"),
        "shared_expert_intermediate_size": keys.get("shared_expert_intermediate_size", 0),
    }


def _eos_ids(keys: _Keys) -> tuple[int, ...]:
    value = keys.get("eos_token_id")
    if value is None:
        return ()
    values: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    if not all(is_int(v) for v in values):
        raise keys.error("eos_token_id", f"must be an int or a list of ints, got {value!r}")
    return tuple(v for v in values if is_int(v))


def _shapes(keys: _Keys, family: str) -> dict[str, Any]:
    """The fields the cost model prices: sizes, MLP kind, position scheme, experts."""
    is_opt = family == "opt" or "ffn_dim" in keys.config
    hidden = keys.required("hidden_size", "hidden_size")
    heads = keys.required("num_attention_heads", "num_heads")
    inter_key = "ffn_dim" if is_opt else "intermediate_size"
    moe = _moe_fields(keys, family)
    inter = keys.get(inter_key) if moe else keys.required(inter_key, "intermediate_size")
    return {
        "num_layers": keys.required("num_hidden_layers", "num_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": keys.get("num_key_value_heads", heads),
        "head_dim": _head_dim(keys, hidden, heads),
        "intermediate_size": inter or moe["moe_intermediate_size"],
        "vocab_size": keys.required("vocab_size", "vocab_size"),
        "max_position_embeddings": keys.required("max_position_embeddings", "max_model_len"),
        "dtype": _dtype(keys),
        "gated_mlp": not is_opt,
        # OPT ties its LM head to the token embedding unless the config says otherwise.
        "tie_word_embeddings": keys.get("tie_word_embeddings", is_opt),
        "uses_rope": not is_opt,
        "qk_norm": family in _QK_NORM_TYPES,
        **moe,
    }


def _numerics(keys: _Keys, family: str) -> dict[str, Any]:
    """The fields only the engine's model runs: activation, norms, RoPE, biases, window."""
    theta, rotary, scaling = _rope(keys)
    bias = keys.get("attention_bias", False)
    # Qwen2 configs carry a sliding_window that applies only with use_sliding_window.
    uses_window = family == "mistral" or bool(keys.get("use_sliding_window"))
    return {
        # OPT names its activation activation_function.
        "hidden_act": keys.get("hidden_act", keys.get("activation_function", "silu")),
        "rms_norm_eps": keys.get("rms_norm_eps"),
        "rope_theta": theta,
        "partial_rotary_factor": rotary,
        "rope_scaling": scaling,
        # Qwen2 always has q/k/v biases and no output bias; Llama's flag covers all four.
        "qkv_bias": True if family == "qwen2" else bias,
        "o_bias": False if family == "qwen2" else bias,
        "mlp_bias": keys.get("mlp_bias", False),
        "sliding_window": keys.get("sliding_window") if uses_window else None,
        "eos_token_ids": _eos_ids(keys),
    }


def model_spec_from_hf_config(
    config: str | Path | dict[str, Any], name: str | None = None
) -> ModelSpec:
    """A `ModelSpec` from a ``config.json`` (a file, or a directory holding one) or its parsed
    object. The name is ``name``, else the config's ``_name_or_path``, else the folder's name.

    Llama, Mistral, Qwen2/3 use `intermediate_size` and a gated SiLU MLP; OPT is detected by
    its family or an `ffn_dim` key. Errors name the file and the key.
    """
    if isinstance(config, dict):
        source, raw, folder = name or "config", config, ""
    else:
        path, raw = read_config_json(config)
        source, folder = str(path), path.parent.name
    keys = _Keys(raw, source)
    architecture = _architecture(keys)
    if architecture and architecture not in ARCHITECTURE_TYPES:
        keys.unknown_architecture = architecture
    model_type = str(keys.get("model_type", ""))
    family = ARCHITECTURE_TYPES.get(architecture, model_type)
    fields = _shapes(keys, family) | _numerics(keys, family)
    try:
        return ModelSpec(
            name=name or str(keys.get("_name_or_path") or folder or "hf-model"),
            architecture=architecture,
            model_type=model_type,
            **fields,
        )
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from error
