"""The one ``config.json`` reader (engine/model/config_json.py) behind the engine's
`ModelConfig` and the simulator's `ModelSpec`: both read the same files the same way, and a
file that cannot be read fails alike on both sides, naming the file."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.model.config_json import config_json_path, read_config_json
from engine.model.config import model_config_from_hf
from sim.specs.hf_config import model_spec_from_hf_config

QWEN2_SMALL: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

READERS: dict[str, Callable[[Path], object]] = {
    "engine": model_config_from_hf,
    "sim": model_spec_from_hf_config,
}


def test_a_directory_means_its_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_SMALL))
    assert config_json_path(tmp_path) == tmp_path / "config.json"
    assert config_json_path(tmp_path / "config.json") == tmp_path / "config.json"
    assert read_config_json(tmp_path) == (tmp_path / "config.json", QWEN2_SMALL)


def test_both_sides_read_a_gzip_config_to_the_same_shapes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(gzip.compress(json.dumps(QWEN2_SMALL).encode()))
    config = model_config_from_hf(tmp_path)
    spec = model_spec_from_hf_config(tmp_path)
    assert (config.num_layers, config.hidden_size, config.head_dim) == (24, 896, 64)
    assert (spec.num_layers, spec.hidden_size, spec.head_dim) == (24, 896, 64)
    assert (config.num_heads, config.num_kv_heads) == (spec.num_heads, spec.num_kv_heads) == (14, 2)
    assert config.vocab_size == spec.vocab_size == 151936
    assert config.tie_word_embeddings and spec.tie_word_embeddings


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"config\.json: cannot read a JSON config \("),
        (b"[1, 2]", r"config\.json: expected a JSON object at the top level"),
        (b"\x00\x01binary", r"config\.json: model config is a binary file"),
        (b'{"a": "\xff\xfe"}', r"config\.json: model config is not UTF-8 text"),
    ],
)
@pytest.mark.parametrize("side", sorted(READERS))
def test_unreadable_files_fail_alike_naming_the_file(
    tmp_path: Path, side: str, content: bytes, message: str
) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        READERS[side](tmp_path)
    assert str(tmp_path / "config.json") in str(error.value)


@pytest.mark.parametrize("side", sorted(READERS))
def test_a_missing_file_is_named(tmp_path: Path, side: str) -> None:
    with pytest.raises(ValueError, match=r"nope\.json: cannot read a JSON config"):
        READERS[side](tmp_path / "nope.json")
