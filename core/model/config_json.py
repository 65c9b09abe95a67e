"""Reading a Hugging Face ``config.json``: the one reader behind the engine's `ModelConfig`
(engine/model/config.py) and the simulator's `ModelSpec` (sim/hf_config.py). Standard library
only (``core.text_files`` is too), so neither side loads torch to read a config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.text_files import read_text


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
