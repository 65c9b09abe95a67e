"""Triton kernels for paged KV attention and cache ops, with pure-torch references.

KV cache layout: one K tensor and one V tensor per layer, each
``[num_blocks, block_size, num_kv_heads, head_dim]`` (fp16, bf16 or fp32; the last dim
contiguous). Separate tensors keep a layer's K and V independently strided and let copy and
store treat them alike; a slot is ``block_id * block_size + offset``. block_size is a power of
two (8..256 in use), head_dim a power of two in [16, 256] (64/128/256 for real models), and
num_q_heads a multiple of num_kv_heads (MHA, GQA, MQA).

Entry points (each wrapper checks shapes, dtypes, strides and devices, then launches):

- ``paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)``
- ``paged_prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
  context_lens, scale)``
- ``store_kv(k, v, k_cache, v_cache, slot_mapping)`` and ``copy_blocks(k_cache, v_cache, pairs)``
- ``<name>_ref``: the torch references (slow, the tests' oracle); ``resolve_backend(device,
  backend)``.
- ``kernels.torch_attention``: the vectorised torch attention that ``backend="torch"`` runs,
  with ``plan_decode``/``plan_prefill`` to build its gather plans once per step.

Attention metadata is built once per step and passed explicitly; nothing is module-global.
Prefill reads the chunk's own K/V from the cache, so a step runs store_kv before attention.
Optional keywords: decode ``max_seq_len``/``num_splits``/``tile_tokens``, prefill
``max_query_len`` (else one device sync) and ``tiles``. GPU sweep: ``python -m kernels.bench``.

Every wrapper takes ``backend="auto" | "triton" | "torch"``: "auto" runs Triton on CUDA and,
under ``TRITON_INTERPRET=1``, on CPU; otherwise torch (the vectorised attention, the reference
cache ops). ``import kernels`` loads neither torch nor triton: names resolve on first use, and
only the wrappers' modules import triton (the references, the torch path and
``resolve_backend`` need torch alone).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "paged_decode_attention": "kernels.paged_attention",
    "paged_prefill_attention": "kernels.prefill_attention",
    "store_kv": "kernels.cache_ops",
    "copy_blocks": "kernels.cache_ops",
    "paged_decode_attention_ref": "kernels.reference",
    "paged_prefill_attention_ref": "kernels.reference",
    "store_kv_ref": "kernels.reference",
    "copy_blocks_ref": "kernels.reference",
    "dense_attention": "kernels.reference",
    "gather_kv": "kernels.reference",
    "paged_decode_attention_torch": "kernels.torch_attention",
    "paged_prefill_attention_torch": "kernels.torch_attention",
    "plan_decode": "kernels.torch_attention",
    "plan_prefill": "kernels.torch_attention",
    "resolve_backend": "kernels.contracts",
    "CacheShape": "kernels.contracts",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    # PEP 562: import the defining module only when a name is first used.
    if name not in _HOMES:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
