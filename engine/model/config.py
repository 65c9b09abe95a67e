"""The decoder's shape and numerics (`ModelConfig`), read from a Hugging Face ``config.json``
(Llama-2/3/3.1, Mistral, Qwen2) or from a config bundled under ``engine/model/configs/``.

Standard library only: the simulator and tests may read a config without loading torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from core.model.config_json import read_config_json

# HF `architectures` entries and `model_type` values we can run, by our family name.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}
ROPE_TYPES = ("linear", "llama3")
DTYPES = ("float32", "float16", "bfloat16")
_DTYPE_ALIASES = {"float": "float32", "half": "float16", "fp32": "float32", "bf16": "bfloat16"}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling: ``linear`` divides every frequency by ``factor``; ``llama3``
    (Llama 3.1) divides only the low frequencies, blending smoothly between the two bands."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"RopeScaling.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}"
            )
        for field in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, field)
            if not _is_number(value) or value <= 0:
                raise ValueError(f"RopeScaling.{field} must be a positive number, got {value!r}")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"RopeScaling.high_freq_factor={self.high_freq_factor!r} must exceed "
                f"low_freq_factor={self.low_freq_factor!r}"
            )
        value = self.original_max_position_embeddings
        if not _is_int(value) or value <= 0:
            raise ValueError(
                "RopeScaling.original_max_position_embeddings must be a positive int, "
                f"got {value!r}"
            )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Llama-family decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

    ``sliding_window`` is kept but not applied: attention is always full, so ``max_model_len``
    stops sequences at the window, where full and sliding attention are still the same.
    ``torch_dtype`` is the checkpoint's dtype name (None when the config does not say).
    """

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    torch_dtype: str | None = None
    # End-of-sequence token ids (a config may name several, as Llama-3.1's does).
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in MODEL_TYPES.values():
            raise ValueError(
                f"ModelConfig.architecture must be one of {sorted(set(MODEL_TYPES.values()))}, "
                f"got {self.architecture!r}"
            )
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
            if not _is_int(value) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelConfig.num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads}"
            )
        for field in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, field)
            if not _is_number(value) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive number, got {value!r}")
        for field in ("qkv_bias", "o_bias", "mlp_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(
                    f"ModelConfig.{field} must be a bool, got {getattr(self, field)!r}"
                )
        window = self.sliding_window
        if window is not None and (not _is_int(window) or window <= 0):
            raise ValueError(f"ModelConfig.sliding_window must be a positive int, got {window!r}")
        if self.torch_dtype is not None and self.torch_dtype not in DTYPES:
            raise ValueError(
                f"ModelConfig.torch_dtype must be one of {DTYPES}, got {self.torch_dtype!r}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def max_model_len(self) -> int:
        """The longest sequence the model runs exactly (positions, and the sliding window)."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


class _Fields:
    """Reads fields of one config, naming the source and the field in every error."""

    def __init__(self, config: dict[str, Any], source: str) -> None:
        self.config = config
        self.source = source

    def error(self, field: str, message: str) -> ValueError:
        return ValueError(f"{self.source}: field {field!r}: {message}")

    def required(self, field: str) -> Any:
        value = self.config.get(field)
        if value is None:
            raise self.error(field, "missing (a Llama-family config.json has it)")
        return value

    def positive_int(self, field: str) -> int:
        value = self.required(field)
        if not _is_int(value) or value <= 0:
            raise self.error(field, f"must be a positive int, got {value!r}")
        return int(value)

    def optional(self, field: str, default: Any) -> Any:
        value = self.config.get(field)
        return default if value is None else value


def _architecture(fields: _Fields) -> str:
    names = fields.config.get("architectures")
    if names:
        if not isinstance(names, list) or names[0] not in ARCHITECTURES:
            raise fields.error(
                "architectures",
                f"unsupported architecture {names!r}; supported: {', '.join(ARCHITECTURES)}",
            )
        return ARCHITECTURES[names[0]]
    model_type = fields.config.get("model_type")
    if model_type is None:
        raise fields.error("architectures", "missing, and no 'model_type' either")
    if model_type not in MODEL_TYPES:
        raise fields.error(
            "model_type",
            f"unsupported model type {model_type!r}; supported: {', '.join(MODEL_TYPES)}",
        )
    return MODEL_TYPES[model_type]


def _rope(fields: _Fields) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from the HF v4 keys (`rope_theta`, `rope_scaling`) or the
    v5 ones (`rope_parameters` holding both)."""
    field = "rope_parameters" if "rope_parameters" in fields.config else "rope_scaling"
    params = fields.config.get(field) or {}
    if not isinstance(params, dict):
        raise fields.error(field, f"must be an object, got {params!r}")
    theta = params.get("rope_theta", fields.optional("rope_theta", 10000.0))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise fields.error(f"{field}.partial_rotary_factor", "only 1.0 (full rotary) is supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_TYPES:
        raise fields.error(
            f"{field}.rope_type",
            f"unsupported RoPE scaling {rope_type!r}; supported: default, {', '.join(ROPE_TYPES)}",
        )
    needed = _LLAMA3_KEYS if rope_type == "llama3" else ("factor",)
    for key in needed:
        if params.get(key) is None:
            raise fields.error(f"{field}.{key}", f"missing (RoPE scaling {rope_type!r} needs it)")
    try:
        return theta, RopeScaling(rope_type, **{key: params[key] for key in needed})
    except ValueError as error:
        raise fields.error(field, str(error)) from error


def _dtype_name(fields: _Fields) -> str | None:
    # Recent transformers write "dtype" and older ones "torch_dtype"; where a config has both,
    # "dtype" is the newer and wins (as in sim.specs.hf_config).
    field = "dtype" if fields.config.get("dtype") is not None else "torch_dtype"
    value = fields.config.get(field)
    if value is None:
        return None
    name = _DTYPE_ALIASES.get(str(value), str(value))
    if name not in DTYPES:
        raise fields.error(field, f"unsupported dtype {value!r}; supported: {', '.join(DTYPES)}")
    return name


def _eos_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    values: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(ids) != len(values):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")
    return tuple(ids)


def model_config_from_hf(
    config: dict[str, Any] | str | Path, name: str | None = None
) -> ModelConfig:
    """A `ModelConfig` from a parsed ``config.json``, or from its path (a file or a directory
    holding one). Errors name the file and the field."""
    if isinstance(config, dict):
        source = name or "config"
        raw = config
    else:
        path, raw = read_config_json(config)
        source = str(path)
        name = name or path.parent.name
    fields = _Fields(raw, source)
    architecture = _architecture(fields)
    activation = fields.optional("hidden_act", "silu")
    if activation != "silu":
        raise fields.error("hidden_act", f"only 'silu' (SwiGLU) is supported, got {activation!r}")
    hidden = fields.positive_int("hidden_size")
    num_heads = fields.positive_int("num_attention_heads")
    head_dim = raw.get("head_dim")
    if head_dim is None:
        if hidden % num_heads:
            raise fields.error(
                "head_dim", "missing, and hidden_size / num_attention_heads is not whole"
            )
        head_dim = hidden // num_heads
    theta, scaling = _rope(fields)
    attention_bias = fields.optional("attention_bias", False)
    # Qwen2 configs carry a sliding_window that applies only with use_sliding_window.
    uses_window = architecture == "mistral" or bool(raw.get("use_sliding_window"))
    window = raw.get("sliding_window") if uses_window else None
    try:
        return ModelConfig(
            name=str(name or raw.get("_name_or_path") or architecture),
            architecture=architecture,
            num_layers=fields.required("num_hidden_layers"),
            hidden_size=hidden,
            num_heads=num_heads,
            num_kv_heads=fields.optional("num_key_value_heads", num_heads),
            head_dim=head_dim,
            intermediate_size=fields.required("intermediate_size"),
            vocab_size=fields.required("vocab_size"),
            max_position_embeddings=fields.required("max_position_embeddings"),
            rms_norm_eps=fields.required("rms_norm_eps"),
            rope_theta=theta,
            rope_scaling=scaling,
            # Qwen2 always has q/k/v biases and no output bias; Llama's flag covers all four.
            qkv_bias=True if architecture == "qwen2" else attention_bias,
            o_bias=False if architecture == "qwen2" else attention_bias,
            mlp_bias=fields.optional("mlp_bias", False),
            tie_word_embeddings=fields.optional("tie_word_embeddings", False),
            sliding_window=window,
            torch_dtype=_dtype_name(fields),
            eos_token_ids=_eos_ids(fields.config.get("eos_token_id")),
        )
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from error


def bundled_config_names() -> list[str]:
    """Names of the configs shipped in ``engine/model/configs/`` (``tiny-llama``, ...)."""
    folder = resources.files("engine.model") / "configs"
    return sorted(
        item.name[: -len(".json")] for item in folder.iterdir() if item.name.endswith(".json")
    )


def load_model_config(name_or_dir: str | Path) -> ModelConfig:
    """A bundled config by name (case-insensitive), else a directory holding ``config.json``,
    else a path to a ``config.json`` file."""
    path = Path(name_or_dir)
    if path.exists():
        return model_config_from_hf(path, name=path.name if path.is_dir() else None)
    for bundled in bundled_config_names():
        if bundled.lower() == str(name_or_dir).lower():
            text = (resources.files("engine.model") / "configs" / f"{bundled}.json").read_text()
            return model_config_from_hf(json.loads(text), name=bundled)
    raise ValueError(
        f"model {str(name_or_dir)!r} is neither a directory nor a file, nor a bundled config "
        f"({', '.join(bundled_config_names())})"
    )
