"""The engine's memory before it allocates: the memory-profiling pass (``profile_batch``, its
shape, and ``run_profiling_pass``), an estimate of what an engine needs (``estimate_memory``:
weights, KV cache, activations), what the host has available, and the refusal when the need
exceeds it (``check_memory``)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from core.model.spec import ModelSpec
from engine.model.llama import LlamaForCausalLM, resolve_dtype
from engine.model.support import engine_model_spec

GIB = 1 << 30
MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What the sampler keeps per logit row and vocabulary entry beyond the LM head's own output:
# the fp32 copy of the logits and about two fp32 temporaries (probabilities, noise).
SAMPLER_FP32_COPIES = 3


PARTS = ("weights", "KV cache", "activations", "swap space")  # a MemoryNeed's, as named


class EngineSettings(Protocol):
    """The fields of ``engine.llm_engine.EngineConfig`` that size an engine."""

    @property
    def model(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_gpu_blocks(self) -> int | None: ...
    @property
    def cpu_kv_cache_gib(self) -> float: ...
    @property
    def swap_space_gib(self) -> float: ...
    @property
    def preemption_mode(self) -> str: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_model_len(self) -> int | None: ...


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


def run_profiling_pass(
    model: LlamaForCausalLM, seq_lens: Sequence[int], block_size: int, backend: str
) -> None:
    """One forward of fresh prompts of ``seq_lens`` tokens (``profile_batch``), each sampling
    its last row, over a scratch KV cache of just their blocks, freed on return."""
    from engine.attention import build_metadata

    device = model.device
    chunks: list[tuple[int, int]] = []
    tables: list[list[int]] = []
    positions: list[int] = []
    last: list[int] = []
    first_block = 0
    for seq_len in seq_lens:
        num_blocks = -(-seq_len // block_size)
        chunks.append((0, seq_len))
        tables.append(list(range(first_block, first_block + num_blocks)))
        first_block += num_blocks
        positions.extend(range(seq_len))
        last.append(len(positions) - 1)
    layers = model.make_kv_caches(first_block, block_size)
    meta = build_metadata([], [], chunks, tables, block_size, device, backend)
    ids = torch.zeros(len(positions), dtype=torch.int64, device=device)
    with torch.inference_mode():
        model(
            ids,
            torch.tensor(positions, dtype=torch.int64, device=device),
            layers,
            meta,
            torch.tensor(last, dtype=torch.int64, device=device),
        )


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """What an engine will allocate, in bytes: its weights, its KV cache on the device (0
    when the cache is sized from what is left, as on CUDA), the largest step's activations,
    and the host swap space (pinned on CUDA)."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    swap_bytes: int

    def _by_name(self) -> dict[str, int]:
        return {
            "weights": self.weights_bytes,
            "KV cache": self.kv_cache_bytes,
            "activations": self.activation_bytes,
            "swap space": self.swap_bytes,
        }

    def total(self, parts: tuple[str, ...]) -> int:
        """The bytes of ``parts`` (names as ``describe`` writes them)."""
        return sum(self._by_name()[name] for name in parts)

    def describe(self, parts: tuple[str, ...]) -> str:
        named = self._by_name()
        return ", ".join(f"{name} {_gib(named[name])}" for name in parts if named[name])


def num_parameters(model: ModelSpec) -> int:
    """Parameters of the model as ``LlamaForCausalLM`` builds it (fused projections)."""
    h, q, kv, inter = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    layer = h * (q + 2 * kv) + q * h + h * 2 * inter + inter * h + 2 * h
    layer += (q + 2 * kv) * model.qkv_bias + h * model.o_bias + 3 * inter * model.mlp_bias
    heads = 1 if model.tie_word_embeddings else 2
    return model.num_layers * layer + heads * model.vocab_size * h + h


def activation_bytes(model: ModelSpec, num_tokens: int, num_rows: int, element: int) -> int:
    """The largest step's activations: one layer's live tensors at ``num_tokens`` tokens (the
    hidden state and residual, the norm's fp32 copy, Q/K/V, the attention output, gate/up and
    SiLU x up) and the logits of ``num_rows`` rows with the sampler's fp32 work on them."""
    h, q, kv, inter = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    per_token = element * (3 * h + (q + 2 * kv) + q + 3 * inter) + 4 * 2 * h
    per_row = model.vocab_size * (element + 4 * SAMPLER_FP32_COPIES)
    return num_tokens * per_token + num_rows * per_row


def estimate_memory(
    config: EngineSettings, model: ModelSpec, element: int, max_model_len: int
) -> MemoryNeed:
    """What ``config``'s engine needs, with ``element`` bytes per weight and KV value."""
    rope_tables = 2 * model.max_model_len * (model.head_dim // 2) * element
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


@dataclass(frozen=True, slots=True)
class _Place:
    """Where part of the need must fit: the parts it counts and what is available there."""

    where: str
    parts: tuple[str, ...]
    available: Callable[[], tuple[int | None, str]]


def check_memory(config: EngineSettings) -> MemoryNeed:
    """Refuse ``config`` with ``InsufficientMemoryError`` when the engine it builds would not
    fit: on CPU all it needs against the host's available memory, on CUDA the weights,
    activations (and a fixed cache) against the device's free memory and the swap space
    against the host's. Runs before anything is allocated; returns the estimate."""
    model = engine_model_spec(config.model)
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + (
            "" if torch.version.cuda else ", built without CUDA"
        )
        raise ValueError(f"device {config.device}: no CUDA device here ({build})")
    dtype = resolve_dtype(model, device, getattr(torch, config.dtype) if config.dtype else None)
    element = torch.empty((), dtype=dtype).element_size()
    max_len = min(config.max_model_len or model.full_attention_len, model.full_attention_len)
    need = estimate_memory(config, model, element, max_len)
    if device.type == "cuda":
        places = [
            _Place(str(device), PARTS[:3], lambda: _free_device_bytes(device)),
            _Place("the host", PARTS[3:], available_host_bytes),
        ]
    else:
        places = [_Place("the host", PARTS, available_host_bytes)]
    for place in places:
        wanted = need.total(place.parts)
        available, source = place.available()
        if not wanted or available is None or wanted <= available:
            continue
        gc.collect()  # engines the caller dropped in a reference cycle still hold memory
        available, source = place.available()
        if available is not None and wanted > available:
            raise InsufficientMemoryError(
                f"model {config.model} ({dtype_name(dtype)}) needs about {_gib(wanted)} on "
                f"{place.where} ({need.describe(place.parts)}), but only {_gib(available)} is "
                f"available ({source}); a smaller model or dtype, fewer KV blocks, a smaller "
                "token budget or less swap space would need less"
            )
    return need


def _free_device_bytes(device: torch.device) -> tuple[int | None, str]:
    """The device's free memory plus what torch's caching allocator holds unused (a dropped
    engine's cache goes there, and this process can reuse it)."""
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached), "free device memory, with what torch holds unused"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.1f} GiB"
