"""Loading checkpoints (single file, sharded by index) and their errors; seeded random weights;
the model's KV caches and input checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from engine.model.weights import RANDOM_STD, load_model  # noqa: E402
from tests.engine.paged_steps import PagedSteps  # noqa: E402
from tests.engine.test_model import make_hf_model, sequences  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny Qwen2 (it has biases, so more tensor names) saved as one safetensors file."""
    directory = tmp_path_factory.mktemp("qwen2")
    make_hf_model("qwen2").save_pretrained(directory, safe_serialization=True)
    assert (directory / "model.safetensors").exists()
    return directory


def copy_checkpoint(saved: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(saved, target)
    return target


def edit_tensors(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    edit(tensors)
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})


def test_sharded_checkpoint_loads_the_same_weights(saved: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    make_hf_model("qwen2").save_pretrained(sharded, safe_serialization=True, max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    # A stray file the index does not name is not read.
    (sharded / "stray.safetensors").write_bytes(b"not a safetensors file")
    single, split = load_model(str(saved)), load_model(str(sharded))
    for (name, a), (_, b) in zip(single.named_parameters(), split.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_missing_tensor_is_named(saved: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved, tmp_path)
    edit_tensors(directory, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(
        ValueError, match=r"ckpt: tensor 'model\.layers\.1\.self_attn\.k_proj\.bias'"
    ):
        load_model(str(directory))


def test_shape_mismatch_is_named_with_its_file(saved: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved, tmp_path)

    def shrink(tensors):
        tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][
            :-1
        ]

    edit_tensors(directory, shrink)
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.up_proj\.weight' has shape "
        r"\(95, 64\), the config needs \(96, 64\)",
    ):
        load_model(str(directory))


def test_unexpected_tensor_is_named(saved: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved, tmp_path)
    edit_tensors(
        directory, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(64)})
    )
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: unexpected tensor 'model\.layers\.0\.self_attn\.o_proj\.bias'",
    ):
        load_model(str(directory))


def test_ignorable_extras_are_skipped(saved: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved, tmp_path)
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    edit_tensors(directory, lambda t: t.update(extra))
    reference = load_model(str(saved))
    loaded = load_model(str(directory))
    assert torch.equal(loaded.embed_tokens, reference.embed_tokens)


def test_index_and_directory_errors(saved: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved, tmp_path)
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "model-00002.safetensors"}}))
    with pytest.raises(ValueError, match=r"index\.json: names shard 'model-00002\.safetensors'"):
        load_model(str(directory))
    index.write_text("[]")
    with pytest.raises(ValueError, match=r"index\.json: not a safetensors index"):
        load_model(str(directory))
    index.unlink()
    (directory / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match=r"model\.safetensors: cannot read safetensors"):
        load_model(str(directory))
    (directory / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"ckpt: no \*\.safetensors weights"):
        load_model(str(directory))
    with pytest.raises(ValueError, match="--weights random"):
        load_model("tiny-llama")
    with pytest.raises(ValueError, match="weights must be one of"):
        load_model("tiny-llama", weights="zeros")


def test_unsupported_architecture_names_file_and_field(tmp_path: Path) -> None:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ValueError, match=r"config\.json: field 'architectures': unsupported"):
        load_model(str(tmp_path))


def test_random_weights_are_seeded_and_sane() -> None:
    a = load_model("tiny-llama", weights="random", seed=1)
    b = load_model("tiny-llama", weights="random", seed=1)
    c = load_model("tiny-llama", weights="random", seed=2)
    assert a.dtype == torch.float32
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.embed_tokens, c.embed_tokens)
    weight = a.layers[0].self_attn.qkv_proj.weight
    assert weight.std().item() == pytest.approx(RANDOM_STD, rel=0.05)
    assert torch.all(a.norm.weight == 1)
    tokens = sequences(0, [40, 3])
    run = PagedSteps(a, tokens, block_size=16, num_blocks=8)
    logits, _ = run.step([], [(0, 40), (1, 3)], sampling_rows_only=True)
    assert logits.shape == (2, 8192) and torch.isfinite(logits).all()
    assert 0.01 < logits.std().item() < 10


def test_kv_caches_and_input_checks() -> None:
    model = load_model("tiny-llama", weights="random", dtype=torch.bfloat16)
    caches = model.make_kv_caches(num_blocks=5, block_size=16)
    assert len(caches) == 4
    assert all(k.shape == v.shape == (5, 16, 2, 32) for k, v in caches)
    assert all(k.dtype == torch.bfloat16 and k.data_ptr() != v.data_ptr() for k, v in caches)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        model.make_kv_caches(4, 0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model("tiny-llama", weights="random", dtype=torch.int8)
    run = PagedSteps(model, sequences(0, [4]), block_size=16, num_blocks=5)
    from engine.attention import build_metadata

    meta = build_metadata([], [], [(0, 4)], [[3]], 16, "cpu", backend="torch")
    ids = torch.tensor([1, 2, 3, 4])
    rows = torch.tensor([3])
    with pytest.raises(ValueError, match="positions must be a 1-D int64"):
        model(ids, torch.arange(4, dtype=torch.int32), run.caches, meta, rows)
    with pytest.raises(ValueError, match=r"meta\.slot_mapping has 4 rows but input_ids has 3"):
        model(ids[:3], torch.arange(3), run.caches, meta, rows)
    with pytest.raises(ValueError, match="kv_caches has 3 layers"):
        model(ids, torch.arange(4), run.caches[:3], meta, rows)
    assert model(ids, torch.arange(4), run.caches, meta, rows).dtype == torch.float32
