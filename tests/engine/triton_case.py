"""Run by test_triton_backend.py in a fresh process with TRITON_INTERPRET=1: the same mixed
batches through the Triton kernels (interpreted on CPU) and through the torch references must
give the same logits, the kernels checked and planned once per step and launched per layer.
Prints "ok" and the largest difference."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Must precede the first triton import: triton.jit reads it when a kernel is decorated.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from engine.model.weights import load_model
from tests.engine.paged_steps import PagedSteps

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
SCHEDULE = [
    ([], [(0, 11), (1, 6)]),
    ([1], [(0, 7), (2, 13)]),
    ([0, 1], [(2, 4), (3, 9)]),
    ([0, 1, 2, 3], []),
]


def count_calls(calls: Counter[str]) -> None:
    """Count the kernels' plan and run calls (``engine.attention`` looks them up per call)."""
    import kernels.cache_ops
    import kernels.paged_attention
    import kernels.prefill_attention

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module in (kernels.cache_ops, kernels.paged_attention, kernels.prefill_attention):
        for name in dir(module):
            if name.startswith(("plan_", "run_")) and name != "plan_splits":
                setattr(module, name, counted(name, getattr(module, name)))


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "config.json").write_text(json.dumps(CONFIG))
        model = load_model(directory, weights="random", seed=3)
    with torch.no_grad():  # wider than the timing init, so the logits are O(1)
        for param in model.parameters():
            param.mul_(6.0)
    gen = torch.Generator().manual_seed(5)
    tokens = {i: torch.randint(0, 256, (30,), generator=gen).tolist() for i in range(4)}
    runs = {
        backend: PagedSteps(model, tokens, block_size=8, num_blocks=24, seed=7, backend=backend)
        for backend in ("triton", "torch")
    }
    worst = 0.0
    calls: Counter[str] = Counter()
    count_calls(calls)
    for decodes, chunks in SCHEDULE:
        calls.clear()
        triton_logits, rows = runs["triton"].step(decodes, chunks)
        layers = CONFIG["num_hidden_layers"]
        want = {"plan_store_kv": 1, "run_store_kv": layers}
        if decodes:
            want |= {"plan_paged_decode": 1, "run_paged_decode": layers}
        if chunks:
            want |= {"plan_paged_prefill": 1, "run_paged_prefill": layers}
        assert dict(calls) == want, (dict(calls), want)
        torch_logits, torch_rows = runs["torch"].step(decodes, chunks)
        assert rows == torch_rows
        assert torch_logits.abs().mean() > 0.3, torch_logits.abs().mean()
        torch.testing.assert_close(triton_logits, torch_logits, atol=1e-4, rtol=0)
        worst = max(worst, (triton_logits - torch_logits).abs().max().item())
    print(f"max abs difference {worst:.3g}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
