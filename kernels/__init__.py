"""Triton kernels for paged KV attention, cache ops and the fused elementwise ops (add+RMSNorm,
SiLU×mul, rotary), with pure-torch references.

KV cache layout: one K tensor and one V tensor per layer, each
``[num_blocks, block_size, num_kv_heads, head_dim]`` (fp16, bf16 or fp32; the last dim
contiguous). Separate tensors keep a layer's K and V independently strided and let copy and
store treat them alike; a slot is ``block_id * block_size + offset``. block_size is a power of
two (8..256 in use), head_dim a power of two in [16, 256] (64/128/256 for real models), and
num_q_heads a multiple of num_kv_heads (MHA, GQA, MQA).

Modules (each wrapper checks shapes, dtypes, strides and devices, then launches):

- ``paged_attention.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)``
- ``prefill_attention.paged_prefill_attention(q, k_cache, v_cache, block_tables,
  query_start_loc, seq_lens, context_lens, scale)``
- ``cache_ops.store_kv(k, v, k_cache, v_cache, slot_mapping)``,
  ``cache_ops.copy_blocks(k_cache, v_cache, pairs)`` and ``copy_blocks_all_layers`` (every
  layer of a stacked cache in one launch)
- ``plan_store_kv``/``run_store_kv``, ``plan_paged_decode``/``run_paged_decode``,
  ``plan_paged_prefill``/``run_paged_prefill``: the same kernels checked and planned once per
  step (split plan and scratch included), then launched per layer without checks
- the fused elementwise kernels, each with its torch reference ``<name>_ref`` beside it:
  ``rms_norm.rms_norm(x, weight, eps)`` and ``rms_norm.fused_add_rms_norm(x, residual, weight,
  eps)`` (in place, as vLLM's), ``activation.silu_and_mul(gate_up)``, and
  ``rotary.rotary_embedding(positions, q, k, cos_sin_cache)`` (q and k in place, one launch)
- ``reference``: the attention and cache references ``<name>_ref`` (slow, the tests' oracle);
  ``contracts``: ``resolve_backend(device, backend)`` and the shape checks.
- ``torch_attention``: the vectorised torch attention that ``backend="torch"`` runs, with
  ``plan_decode``/``plan_prefill`` to build its gather plans once per step.

Attention metadata is built once per step and passed explicitly; nothing is module-global.
Prefill reads the chunk's own K/V from the cache, so a step runs store_kv before attention.
Optional keywords: decode ``max_seq_len``/``num_splits``/``tile_tokens``, prefill
``max_query_len`` (else one device sync) and ``tiles``. GPU sweep: ``python -m kernels.bench``
(small shapes also inside CUDA graphs: ``bench_graph``).

Every wrapper takes ``backend="auto" | "triton" | "torch"``: "auto" runs Triton on CUDA and,
under ``TRITON_INTERPRET=1``, on CPU; otherwise torch (the vectorised attention, the reference
cache ops, the fused ops' references). Only the kernel modules import triton (not
``contracts``, ``reference``, ``torch_attention``), and triton's ``@jit`` reads
``TRITON_INTERPRET`` as they load: set it before importing them.
"""
