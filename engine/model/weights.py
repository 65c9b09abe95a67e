"""Weights for `LlamaForCausalLM`: read a local Hugging Face directory's safetensors (one file,
several, or shards listed in ``model.safetensors.index.json``) by tensor name, or draw seeded
random ones. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.llama import LlamaForCausalLM, resolve_dtype
from engine.model.support import engine_model_spec

WEIGHT_MODES = ("auto", "random")

INDEX_FILE = "model.safetensors.index.json"
RANDOM_STD = 0.02  # keeps activations of a deep random model near unit scale


def _ignorable(name: str, model: LlamaForCausalLM) -> bool:
    # Old checkpoints store RoPE's inv_freq buffer; tied models may still carry the LM head.
    if name.endswith("rotary_emb.inv_freq"):
        return True
    return name == "lm_head.weight" and model.config.tie_word_embeddings


def weight_files(directory: Path) -> list[Path]:
    """A checkpoint's safetensors files: those its index names, else every ``*.safetensors``."""
    index = directory / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"{index}: not a safetensors index with a 'weight_map' ({error})"
            ) from error
        files = [directory / name for name in names]
        for path in files:
            if not path.is_file():
                raise ValueError(f"{index}: names shard {path.name!r}, which is not in {directory}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{directory}: no *.safetensors weights (for seeded random ones: --weights random, "
            "or weights='random' in Python)"
        )
    return files


def load_weights(model: LlamaForCausalLM, directory: Path) -> None:
    """Fill every parameter of `model` from the checkpoint in `directory`.

    A tensor the model does not know, one of the wrong shape, one given twice, or one the
    model needs and no file holds, raises ValueError naming the tensor and the file.
    """
    targets = model.weight_targets()
    loaded: dict[str, Path] = {}
    for path in weight_files(directory):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                    if name not in targets:
                        if _ignorable(name, model):
                            continue
                        raise ValueError(
                            f"{path}: unexpected tensor {name!r} (not part of a "
                            f"{model.config.architecture} model with this config)"
                        )
                    if name in loaded:
                        raise ValueError(f"{path}: tensor {name!r} also in {loaded[name]}")
                    target = targets[name]
                    shape = tuple(handle.get_slice(name).get_shape())
                    if shape != tuple(target.shape):
                        raise ValueError(
                            f"{path}: tensor {name!r} has shape {shape}, the config needs "
                            f"{tuple(target.shape)}"
                        )
                    target.copy_(handle.get_tensor(name))
                    loaded[name] = path
        except ValueError:
            raise
        except Exception as error:  # safetensors raises its own error type for a bad header
            raise ValueError(f"{path}: cannot read safetensors ({error})") from error
    missing = [name for name in targets if name not in loaded]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(f"{directory}: tensor {missing[0]!r}{more} missing from the checkpoint")


@torch.no_grad()
def init_random_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Seeded weights for timing runs: norms 1, matrices and biases normal(0, RANDOM_STD).

    Drawn on the model's device, in parameter order, so a seed gives the same model on every
    run on that device.
    """
    generator = torch.Generator(device=model.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, RANDOM_STD, generator=generator)


def load_model(
    name_or_dir: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    weights: str = "auto",
    seed: int = 0,
) -> LlamaForCausalLM:
    """Build the model of a preset or a Hugging Face directory, in eval mode.

    ``weights="auto"`` loads the directory's safetensors (an error when there are none);
    ``"random"`` draws seeded weights (for timing, or a preset, which has no checkpoint).
    """
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
    config = engine_model_spec(name_or_dir)
    device = torch.device(device)
    model = LlamaForCausalLM(config, device, resolve_dtype(config, device, dtype))
    if weights == "random":
        init_random_weights(model, seed)
    elif Path(name_or_dir).is_dir():
        load_weights(model, Path(name_or_dir))
    else:
        raise ValueError(
            f"model {str(name_or_dir)!r} is not a directory, so it has no weights to load; "
            "for seeded random weights give --weights random (weights='random' in Python)"
        )
    model.requires_grad_(False)
    return model.eval()
