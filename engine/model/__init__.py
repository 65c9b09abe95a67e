"""A Llama-family decoder (Llama-2/3/3.1, Mistral, Qwen2) on the paged KV cache of ``kernels/``.

``load_model(name_or_dir, device, dtype, weights, seed)`` builds a `LlamaForCausalLM` from a
bundled config (``tiny-llama``) or a Hugging Face directory, with its safetensors weights
(``weights="auto"``) or seeded random ones (``weights="random"``). Names resolve on first use,
so ``engine.model.config`` can be read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "ModelConfig": "engine.model.config",
    "RopeScaling": "engine.model.config",
    "model_config_from_hf": "engine.model.config",
    "load_model_config": "engine.model.config",
    "bundled_config_names": "engine.model.config",
    "LlamaForCausalLM": "engine.model.llama",
    "load_model": "engine.model.llama",
    "load_weights": "engine.model.weights",
    "init_random_weights": "engine.model.weights",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    # PEP 562: import the defining module only when a name is first used.
    if name not in _HOMES:
        raise AttributeError(f"module 'engine.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
