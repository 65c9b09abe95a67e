"""The token budget and ``max_num_seqs`` that vLLM picks when they are not given (the batch
defaults of vLLM's ``EngineArgs``, read in a source from before v0.12 and in the later
``get_batch_defaults``, which keeps the same values): they depend on the GPU and on how vLLM is
used, so one fixed default cannot stand for "vLLM's defaults" everywhere.

- A GPU with 70 GiB or more whose name is not an A100's (H100, H200, B200, MI300X): the
  server (``vllm serve``) takes 8,192 tokens and 1,024 sequences, the offline ``LLM`` class
  16,384 and 1,024.
- Any other GPU (A100, L40S, RTX 4090 ...): the server 2,048 and 256, ``LLM`` 8,192 and 256.
  vLLM keeps A100s on the smaller budget on purpose: a larger one lowered their throughput.
- Without chunked prefill the budget is the model's ``max_model_len`` instead, and
  ``max_num_seqs`` never exceeds the budget.

vLLM reads the device's total memory as the driver reports it, a little under the nominal
size a preset holds; no preset here is near enough to 70 GiB for that to change its tier. The
CPU and TPU rows of vLLM's table are not modelled."""

from __future__ import annotations

from sim.specs.hardware import HardwareSpec

USAGES = ("serve", "offline")
"""``serve``: vLLM's OpenAI-compatible server (``vllm serve``); ``offline``: its ``LLM`` class."""

_LARGE_GPU_BYTES = 70 * 2**30
_BUDGETS = {("large", "serve"): 8192, ("large", "offline"): 16384}
_BUDGETS |= {("other", "serve"): 2048, ("other", "offline"): 8192}
_SEQS = {"large": 1024, "other": 256}


def gpu_tier(hardware: HardwareSpec) -> str:
    """``large`` for vLLM's larger defaults (70 GiB or more and not an A100), else ``other``."""
    big = hardware.hbm_capacity_bytes >= _LARGE_GPU_BYTES
    return "large" if big and "a100" not in hardware.name.lower() else "other"


def vllm_batch_defaults(
    hardware: HardwareSpec, usage: str, chunked_prefill: bool, max_model_len: int
) -> tuple[int, int]:
    """(``max_num_batched_tokens``, ``max_num_seqs``) as vLLM sets them when neither is given,
    for ``usage`` (one of USAGES) on ``hardware``."""
    if usage not in USAGES:
        raise ValueError(f"vLLM usage must be one of {USAGES}, got {usage!r}")
    tier = gpu_tier(hardware)
    budget = _BUDGETS[tier, usage] if chunked_prefill else max_model_len
    return budget, min(_SEQS[tier], budget)
