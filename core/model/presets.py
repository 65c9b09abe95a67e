"""Named models, and what a ``--model`` value means to both executors: a path to a
``config.json`` (or a directory holding one), else a preset, one ``config.json`` per model in
``core/model/presets/`` (the published files, trimmed; the folder's README says where from)."""

from __future__ import annotations

from pathlib import Path

from core.model.hf_config import model_spec_from_hf_config
from core.model.spec import ModelSpec

PRESETS_DIR = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    """Every preset's name (its file's name without ``.json``), sorted."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.json"))


def preset_for_model_id(model_id: str | None) -> str | None:
    """The preset a Hugging Face model id names (meta-llama/Llama-3.1-8B): its last path part,
    any case; for a release of a preset (Qwen3-30B-A3B-Instruct-2507), the longest preset that
    part starts with followed by a dash, as a release keeps its base model's shapes."""
    if not model_id:
        return None
    tail = model_id.rstrip("/").rsplit("/", 1)[-1].lower()
    names = preset_names()
    exact = next((name for name in names if name.lower() == tail), None)
    if exact is not None:
        return exact
    return max((n for n in names if tail.startswith(n.lower() + "-")), key=len, default=None)


def _preset_file(name: str) -> Path | None:
    return next(
        (
            PRESETS_DIR / f"{preset}.json"
            for preset in preset_names()
            if preset.lower() == name.lower()
        ),
        None,
    )


def get_model_preset(name: str) -> ModelSpec:
    """A preset by name, ignoring case; the error lists the valid names."""
    path = _preset_file(name)
    if path is None:
        raise ValueError(f"unknown model {name!r}; presets are: {', '.join(preset_names())}")
    return model_spec_from_hf_config(path, name=path.stem)


def model_presets() -> dict[str, ModelSpec]:
    """Every preset by name (reads every file: for listings and tests, not per run)."""
    return {name: get_model_preset(name) for name in preset_names()}


def load_model_spec(name_or_path: str | Path) -> ModelSpec:
    """What ``--model`` names, the same for the simulator and the engine: an existing path (a
    ``config.json``, gzip or not, or a directory holding one), else a preset (ignoring case)."""
    if Path(name_or_path).exists():
        return model_spec_from_hf_config(name_or_path)
    name = str(name_or_path)
    if _preset_file(name) is None:
        raise ValueError(
            f"unknown model {name!r}: no such file or directory, and no preset of that name "
            f"(presets: {', '.join(preset_names())})"
        )
    return get_model_preset(name)
