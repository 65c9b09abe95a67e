"""Presets and what a ``--model`` value names: case-insensitive names, a path before a preset,
errors that list the presets; reading any of them loads neither torch nor triton."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.model.hf_config import model_spec_from_hf_config
from core.model.presets import (
    PRESETS_DIR,
    get_model_preset,
    load_model_spec,
    model_presets,
    preset_names,
)

ROOT = Path(__file__).resolve().parents[3]


def test_lookup_is_case_insensitive_and_lists_names_on_error() -> None:
    assert get_model_preset("llama-2-7b").name == "Llama-2-7B"
    assert load_model_spec("TINY-LLAMA") == get_model_preset("tiny-llama")
    with pytest.raises(ValueError, match=r"unknown model 'gpt-9'.*Llama-2-7B.*tiny-llama"):
        get_model_preset("gpt-9")
    with pytest.raises(ValueError, match=r"'no-such-model': no such file.*tiny-llama"):
        load_model_spec("no-such-model")


def test_every_preset_is_its_file_read_by_the_one_reader() -> None:
    presets = model_presets()
    assert list(presets) == preset_names() == sorted(p.stem for p in PRESETS_DIR.glob("*.json"))
    for name, spec in presets.items():
        assert spec == model_spec_from_hf_config(PRESETS_DIR / f"{name}.json", name=name)


def test_a_path_is_read_before_a_preset_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = json.loads((PRESETS_DIR / "tiny-llama.json").read_text()) | {"num_hidden_layers": 2}
    (tmp_path / "tiny-llama").mkdir()
    (tmp_path / "tiny-llama" / "config.json").write_text(json.dumps(own))
    monkeypatch.chdir(tmp_path)
    assert load_model_spec("tiny-llama").num_layers == 2
    assert load_model_spec(tmp_path / "tiny-llama" / "config.json").num_layers == 2
    monkeypatch.chdir(ROOT)
    assert load_model_spec("tiny-llama").num_layers == 4


def test_reading_any_config_or_preset_loads_neither_torch_nor_triton(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((PRESETS_DIR / "Llama-3.1-8B.json").read_text())
    code = (
        "import sys\n"
        "from core.model.presets import load_model_spec, model_presets\n"
        "specs = list(model_presets().values())\n"
        f"specs.append(load_model_spec({str(tmp_path)!r}))\n"
        "assert len(specs) > 10 and specs[-1].max_model_len == 131072\n"
        "print(','.join(sorted(m for m in ('torch', 'triton') if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"loaded: {out.stdout.strip()}"
