"""The batched sampler against the per-row reference it replaced (the same token for every
row, bit for bit, whatever else is in the batch), and the engine's greedy and seeded tokens
against those recorded before the persistent batch and the batched sampler."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine import LLM, SamplingParams  # noqa: E402
from engine.sampling import SampleSpec, draw_seed, filtered_probs, sample  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parent / "data" / "tokens_before_persistent_batch.json"


def sample_row_ref(logits: torch.Tensor, spec: SampleSpec) -> int:
    """The sampler as it was, one row at a time: argmax, or the filtered probabilities over
    exponential noise from the row's own generator."""
    row = logits[spec.row]
    if spec.params.greedy:
        return int(torch.argmax(row).item())
    probs = filtered_probs(row, spec.params)
    generator = torch.Generator(device=probs.device)
    generator.manual_seed(draw_seed(spec.seed, spec.sample_idx, spec.position))
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / noise).item())


def random_params(rng: random.Random) -> SamplingParams:
    kind = rng.randrange(5)
    if kind == 0:
        return SamplingParams()
    return SamplingParams(
        temperature=rng.choice([0.3, 0.8, 1.0, 1.7]),
        top_k=rng.choice([-1, 1, 5, 50]) if kind in (2, 4) else -1,
        top_p=rng.choice([0.5, 0.9, 0.99]) if kind in (3, 4) else 1.0,
    )


def _check_batched_sampling(seed: int, device: str) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_rows, vocab = 12, 300
    logits = (torch.randn(num_rows, vocab, generator=gen) * rng.choice([1.0, 4.0])).to(device)
    specs = [
        SampleSpec(
            rng.randrange(num_rows), random_params(rng), rng.randrange(99), s, rng.randrange(9)
        )
        for s in range(20)
    ]
    assert sum(not s.params.greedy for s in specs) >= 10
    assert sample(logits, specs) == [sample_row_ref(logits, s) for s in specs]
    # Alone, or in another order among other rows, each spec draws the same token.
    order = list(range(len(specs)))
    rng.shuffle(order)
    shuffled = sample(logits, [specs[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(specs))] == sample(logits, specs)
    assert [sample(logits, [s])[0] for s in specs[:5]] == sample(logits, specs)[:5]


@pytest.mark.parametrize("seed", range(4))
def test_batched_sampling_equals_the_per_row_reference(seed: int) -> None:
    _check_batched_sampling(seed, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", range(4))
def test_batched_sampling_equals_the_per_row_reference_on_gpu(seed: int) -> None:
    _check_batched_sampling(seed, "cuda")


def test_sampling_nothing_returns_nothing() -> None:
    assert sample(torch.zeros(0, 8), []) == []


def test_top_k_and_top_p_keep_only_their_tokens() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 2)
    params = [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0, top_p=0.5)]
    drawn = {
        token
        for seed in range(200)
        for token in sample(logits, [SampleSpec(i, p, seed, 0, 0) for i, p in enumerate(params)])
    }
    assert drawn <= {0, 1}, "top-k 2 and top-p 0.5 (the top token holds 64%) keep tokens 0, 1"


def _generate(case: dict[str, object], prompts: list[list[int]]) -> list[list[list[int]]]:
    params = [
        SamplingParams(max_tokens=10, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.8, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=1.0, top_k=20, seed=5, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=1.3, top_p=0.7, seed=4, ignore_eos=True),
        SamplingParams(
            max_tokens=10, temperature=0.7, top_k=50, top_p=0.9, n=3, seed=9, ignore_eos=True
        ),
        SamplingParams(max_tokens=10, n=2, ignore_eos=True),
    ]
    # The torch kernels, as when the tokens were recorded (whatever TRITON_INTERPRET says).
    llm = LLM(model="tiny-llama", weights="random", block_size=4, seed=1, backend="torch", **case)  # type: ignore[arg-type]
    return [[s.token_ids for s in r.outputs] for r in llm.generate(prompts, params)]


def test_greedy_and_seeded_tokens_are_those_recorded_before() -> None:
    """Recorded at 8d1f2ca (per-row sampler, inputs rebuilt every step), for a chunked run
    and a continuous run with swap preemption: the same tokens now. n > 1 then forked its
    samples copy-on-write, so the cases ask for the fork (vLLM v1's fan-out, the default
    since, gives each child a seed of its own and so other tokens)."""
    recorded = json.loads(RECORDED.read_text())
    prompts = recorded["prompts"]
    cases = {
        "chunked": dict(
            policy="chunked", max_num_seqs=32, max_num_batched_tokens=32, parallel_sampling="fork"
        ),
        "continuous-swap": dict(
            policy="continuous",
            num_blocks=40,
            preemption_mode="swap",
            swap_space_gib=0.01,
            parallel_sampling="fork",
        ),
    }
    for name, case in cases.items():
        assert _generate(case, prompts) == recorded[name], name


def test_unseeded_sampling_is_the_same_in_every_process() -> None:
    code = (
        "from engine import LLM, SamplingParams\n"
        "llm = LLM(model='tiny-llama', weights='random', seed=2)\n"
        "out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=1.0))\n"
        "print(out[0].outputs[0].token_ids)\n"
    )
    outputs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.add(done.stdout.strip())
    assert len(outputs) == 1, outputs
