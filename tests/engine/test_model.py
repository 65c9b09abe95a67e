"""The decoder against Hugging Face `transformers` in fp32: whole prefills, chunked prefills,
decodes and mixed batches over shuffled paged block tables give the same logits (atol 1e-4)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from engine.model.weights import load_model  # noqa: E402
from tests.engine.paged_steps import PagedSteps  # noqa: E402

ATOL = 1e-4
VOCAB = 256
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    attn_implementation="eager",
)
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    # llama3 RoPE scaling, and a head_dim wider than hidden_size / heads.
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
        ),
    ),
    # MHA with every bias Llama allows, and linear RoPE scaling.
    "llama-linear-bias": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_key_value_heads=4,
            attention_bias=True,
            mlp_bias=True,
            rope_scaling=dict(rope_type="linear", factor=2.0),
        ),
    ),
    "mistral-mqa": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=1)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "qwen2-tied": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(num_key_value_heads=2, tie_word_embeddings=True),
    ),
}


def make_hf_model(kind: str, seed: int = 0):  # -> transformers.PreTrainedModel
    config_cls, model_cls, extra = CONFIGS[kind]
    config = getattr(transformers, config_cls)(**TINY, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    # Larger than HF's init (std 0.02) so that logits are O(1) and a 1e-4 match means something.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.15)
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(HF model, our model) with the same weights, read back from one saved directory."""
    hf_model = make_hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(directory, safe_serialization=True)
    return hf_model, load_model(str(directory))


def sequences(seed: int, lengths: list[int]) -> dict[int, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return {
        seq_id: torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        for seq_id, length in enumerate(lengths)
    }


def hf_logits(hf_model, tokens: dict[int, list[int]]) -> dict[int, torch.Tensor]:
    with torch.no_grad():
        return {
            seq_id: hf_model(torch.tensor([ids])).logits[0].float()
            for seq_id, ids in tokens.items()
        }


def check_rows(logits, rows, reference) -> None:
    assert logits.dtype == torch.float32
    assert logits.shape == (len(rows), VOCAB)
    expected = torch.stack([reference[seq_id][pos] for seq_id, pos in rows])
    # The reference is not near zero, so a match is informative.
    assert expected.abs().mean() > 0.3
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_whole_prefill(pair) -> None:
    hf_model, model = pair
    tokens = sequences(1, [23])
    run = PagedSteps(model, tokens)
    logits, rows = run.step([], [(0, 23)])
    check_rows(logits, rows, hf_logits(hf_model, tokens))


def test_prefill_chunked_over_steps(pair) -> None:
    hf_model, model = pair
    tokens = sequences(2, [30])
    reference = hf_logits(hf_model, tokens)
    run = PagedSteps(model, tokens, seed=2)
    for num_new in (7, 5, 1, 17):
        logits, rows = run.step([], [(0, num_new)])
        check_rows(logits, rows, reference)


def test_decodes_after_prefill(pair) -> None:
    hf_model, model = pair
    tokens = sequences(3, [13 + 6])
    reference = hf_logits(hf_model, tokens)
    run = PagedSteps(model, tokens, seed=3)
    run.step([], [(0, 13)])
    for _ in range(6):
        logits, rows = run.step([0], [])
        check_rows(logits, rows, reference)


@pytest.mark.parametrize("sampling_rows_only", [False, True])
def test_mixed_batches(pair, sampling_rows_only: bool) -> None:
    hf_model, model = pair
    tokens = sequences(4, [23, 13, 28, 8])
    reference = hf_logits(hf_model, tokens)
    run = PagedSteps(model, tokens, seed=4)
    schedule = [
        ([], [(0, 10), (1, 9)]),
        ([1], [(0, 9), (2, 8)]),
        ([0, 1], [(2, 12), (3, 5)]),
        ([0, 1, 3], [(2, 6)]),
        ([0, 1, 2, 3], []),
        ([3, 2, 0], []),
    ]
    for decodes, chunks in schedule:
        logits, rows = run.step(decodes, chunks, sampling_rows_only)
        if sampling_rows_only:
            assert len(rows) == len(decodes) + len(chunks)
        check_rows(logits, rows, reference)
    assert run.num_computed == {seq_id: len(ids) for seq_id, ids in tokens.items()}
