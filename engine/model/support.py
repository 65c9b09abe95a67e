"""Which model descriptions the engine's torch model can run (the Llama family: Llama-2/3/3.1,
Mistral, Qwen2), and its refusal of the others, naming the config field it cannot run, before
any weights are built."""

from __future__ import annotations

from pathlib import Path

from core.model.hf_config import config_json_path
from core.model.presets import load_model_spec
from core.model.spec import ModelSpec

# Hugging Face classes and model types the engine implements (`engine.model.llama`).
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MODEL_TYPES = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("linear", "llama3")
RUNNABLE_DTYPES = ("float32", "float16", "bfloat16")


class UnsupportedModelError(ValueError):
    """A model the engine cannot run; the message names the config field that says so."""


def _family_problem(spec: ModelSpec) -> tuple[str, str] | None:
    if spec.architecture:
        if spec.architecture in ARCHITECTURES:
            return None
        return "architectures", (
            f"unsupported architecture {spec.architecture!r}; the engine runs "
            f"{', '.join(ARCHITECTURES)}"
        )
    if not spec.model_type:
        return "architectures", "missing, and no 'model_type' either"
    if spec.model_type in MODEL_TYPES:
        return None
    return "model_type", (
        f"unsupported model type {spec.model_type!r}; the engine runs {', '.join(MODEL_TYPES)}"
    )


def unsupported_field(spec: ModelSpec) -> tuple[str, str] | None:
    """(config field, why) for the first thing in `spec` the engine cannot run; None when it
    can run all of it."""
    family = _family_problem(spec)
    if family is not None:
        return family
    if spec.is_moe:
        return "num_experts", "a mixture of experts; the engine runs dense MLPs only"
    if spec.hidden_act != "silu":
        return "hidden_act", f"only 'silu' (SwiGLU) is supported, got {spec.hidden_act!r}"
    if spec.rms_norm_eps is None:
        return "rms_norm_eps", "missing (a Llama-family config.json has it)"
    scaling = spec.rope_scaling
    if scaling is not None and scaling.rope_type not in ROPE_TYPES:
        supported = ", ".join(("default", *ROPE_TYPES))
        return "rope_scaling.rope_type", (
            f"unsupported RoPE scaling {scaling.rope_type!r}; supported: {supported}"
        )
    if spec.partial_rotary_factor != 1.0:
        return "partial_rotary_factor", "only 1.0 (full rotary) is supported"
    if spec.dtype is not None and spec.dtype not in RUNNABLE_DTYPES:
        supported = ", ".join(RUNNABLE_DTYPES)
        return "torch_dtype", f"unsupported dtype {spec.dtype!r}; supported: {supported}"
    return None


def rms_norm_eps(spec: ModelSpec) -> float:
    """The RMSNorm epsilon the engine's model needs (a config without one is refused)."""
    if spec.rms_norm_eps is None:
        raise UnsupportedModelError(f"{spec.name}: field 'rms_norm_eps': missing")
    return spec.rms_norm_eps


def engine_model_spec(name_or_dir: str | Path) -> ModelSpec:
    """The description ``--model`` names (`core.model.presets.load_model_spec`, as the
    simulator reads it), refused with `UnsupportedModelError` if the engine cannot run it."""
    spec = load_model_spec(name_or_dir)
    problem = unsupported_field(spec)
    if problem is None:
        return spec
    path = Path(name_or_dir)
    source = str(config_json_path(path)) if path.exists() else f"model preset {spec.name!r}"
    field, why = problem
    raise UnsupportedModelError(f"{source}: field {field!r}: {why}")
