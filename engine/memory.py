"""The engine's memory before it allocates: the shape of the memory-profiling pass
(``profile_batch``), an estimate of what an engine needs (``estimate_memory``: weights, KV cache,
activations), what the host has available, and the refusal when the need exceeds it."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.model.config import ModelConfig, load_model_config
from engine.model.llama import resolve_dtype

if TYPE_CHECKING:
    from engine.llm_engine import EngineConfig

GIB = 1 << 30
MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What the sampler keeps per logit row and vocabulary entry beyond the LM head's own output:
# the fp32 copy of the logits and about two fp32 temporaries (probabilities, noise).
SAMPLER_FP32_COPIES = 3


class InsufficientMemoryError(ValueError):
    """The engine would not fit in the memory the machine has (raised before allocating)."""


def profile_batch(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int
) -> tuple[int, ...]:
    """The prompt lengths of the largest step the scheduler can form, as the memory-profiling
    pass runs it (vLLM's dummy run): the token budget, or as much of it as ``max_num_seqs``
    sequences of ``max_model_len`` tokens hold, split as evenly as possible over
    ``min(tokens, max_num_seqs)`` sequences, so that the LM head has the most rows a step can
    sample. Every length is at most ``max_model_len``: a position past the model's length
    would read past its rotary table (a device-side assert on CUDA)."""
    for name, value in (
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
        ("max_model_len", max_model_len),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    num_tokens = min(max_num_batched_tokens, max_num_seqs * max_model_len)
    num_seqs = min(num_tokens, max_num_seqs)
    base, extra = divmod(num_tokens, num_seqs)
    return tuple(base + (1 if i < extra else 0) for i in range(num_seqs))


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """What an engine will allocate, in bytes: its weights, its KV cache on the device (0
    when the cache is sized from what is left, as on CUDA), the largest step's activations,
    and the host swap space (pinned on CUDA)."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    swap_bytes: int

    def describe(self, parts: tuple[str, ...]) -> str:
        names = {
            "weights": self.weights_bytes,
            "KV cache": self.kv_cache_bytes,
            "activations": self.activation_bytes,
            "swap space": self.swap_bytes,
        }
        return ", ".join(f"{name} {_gib(names[name])}" for name in parts if names[name])


def num_parameters(model: ModelConfig) -> int:
    """Parameters of the model as ``LlamaForCausalLM`` builds it (fused projections)."""
    h, q, kv, inter = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    layer = h * (q + 2 * kv) + q * h + h * 2 * inter + inter * h + 2 * h
    layer += (q + 2 * kv) * model.qkv_bias + h * model.o_bias + 3 * inter * model.mlp_bias
    heads = 1 if model.tie_word_embeddings else 2
    return model.num_layers * layer + heads * model.vocab_size * h + h


def activation_bytes(model: ModelConfig, num_tokens: int, num_rows: int, element: int) -> int:
    """The largest step's activations: one layer's live tensors at ``num_tokens`` tokens (the
    hidden state and residual, the norm's fp32 copy, Q/K/V, the attention output, gate/up and
    SiLU x up) and the logits of ``num_rows`` rows with the sampler's fp32 work on them."""
    h, q, kv, inter = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    per_token = element * (3 * h + (q + 2 * kv) + q + 3 * inter) + 4 * 2 * h
    per_row = model.vocab_size * (element + 4 * SAMPLER_FP32_COPIES)
    return num_tokens * per_token + num_rows * per_row


def estimate_memory(
    config: EngineConfig, model: ModelConfig, element: int, max_model_len: int
) -> MemoryNeed:
    """What ``config``'s engine needs, with ``element`` bytes per weight and KV value."""
    rope_tables = 2 * model.max_position_embeddings * (model.head_dim // 2) * element
    weights = num_parameters(model) * element + rope_tables
    block = 2 * model.num_layers * config.block_size * model.num_kv_heads * model.head_dim
    block *= element
    if config.num_gpu_blocks is not None:
        cache = config.num_gpu_blocks * block
    elif torch.device(config.device).type == "cuda":
        cache = 0  # sized from what the profiling pass leaves
    else:
        cache = max(1, int(config.cpu_kv_cache_gib * GIB // block)) * block
    swap = int(config.swap_space_gib * GIB) if config.preemption_mode == "swap" else 0
    lens = profile_batch(config.max_num_batched_tokens, config.max_num_seqs, max_model_len)
    return MemoryNeed(weights, cache, activation_bytes(model, sum(lens), len(lens), element), swap)


def available_host_bytes(
    meminfo: Path | None = None, cgroup_root: Path | None = None
) -> tuple[int | None, str]:
    """Host memory available to this process and where the figure comes from: the least of
    ``MemAvailable`` (``MEMINFO``) and the cgroup's limit less its usage (v2, else v1, under
    ``CGROUP_ROOT``). None where neither can be read (not Linux)."""
    meminfo = MEMINFO if meminfo is None else meminfo
    cgroup_root = CGROUP_ROOT if cgroup_root is None else cgroup_root
    found: list[tuple[int, str]] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except (OSError, ValueError, IndexError):
        pass
    for limit_name, usage_name in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            limit = (cgroup_root / limit_name).read_text().strip()
            usage = int((cgroup_root / usage_name).read_text().strip())
        except (OSError, ValueError):
            continue
        # v2 says "max" and v1 a huge number when there is no limit.
        if limit != "max" and int(limit) < 1 << 60:
            found.append((max(0, int(limit) - usage), f"cgroup limit {_gib(int(limit))}"))
        break
    if not found:
        return None, "unknown"
    return min(found)


def check_memory(config: EngineConfig) -> MemoryNeed:
    """Refuse ``config`` with ``InsufficientMemoryError`` when the engine it builds would not
    fit: on CPU all it needs against the host's available memory, on CUDA the weights,
    activations (and a fixed cache) against the device's free memory and the swap space
    against the host's. Runs before anything is allocated; returns the estimate."""
    model = load_model_config(config.model)
    device = torch.device(config.device)
    dtype = resolve_dtype(model, device, getattr(torch, config.dtype) if config.dtype else None)
    element = torch.empty((), dtype=dtype).element_size()
    max_len = min(config.max_model_len or model.max_model_len, model.max_model_len)
    need = estimate_memory(config, model, element, max_len)
    everything = ("weights", "KV cache", "activations", "swap space")
    if device.type == "cuda":
        device_need = need.weights_bytes + need.kv_cache_bytes + need.activation_bytes
        checks = [(device_need, lambda: _free_device_bytes(device), everything[:3], str(device))]
        checks.append((need.swap_bytes, available_host_bytes, everything[3:], "the host"))
    else:
        total = need.weights_bytes + need.kv_cache_bytes + need.activation_bytes
        checks = [(total + need.swap_bytes, available_host_bytes, everything, "the host")]
    for wanted, measure, parts, where in checks:
        available, source = measure()
        if not wanted or available is None or wanted <= available:
            continue
        gc.collect()  # engines the caller dropped in a reference cycle still hold memory
        available, source = measure()
        if wanted > available:
            raise InsufficientMemoryError(
                f"model {config.model} ({dtype_name(dtype)}) needs about {_gib(wanted)} on "
                f"{where} ({need.describe(parts)}), but only {_gib(available)} is available "
                f"({source}); a smaller model or dtype, fewer KV blocks, a smaller token budget "
                "or less swap space would need less"
            )
    return need


def _free_device_bytes(device: torch.device) -> tuple[int, str]:
    free, _total = torch.cuda.mem_get_info(device)
    return int(free), "free device memory"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.1f} GiB"
