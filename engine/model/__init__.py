"""A Llama-family decoder (Llama-2/3/3.1, Mistral, Qwen2) on the paged KV cache of ``kernels/``.

Interface (what the model runner calls)::

    model = load_model(name_or_dir, device="cpu", dtype=None, weights="auto", seed=0)
    kv_caches = model.make_kv_caches(num_blocks, block_size)
    logits = model(input_ids, positions, kv_caches, meta, logits_indices)

- ``name_or_dir``: a preset (``tiny-llama``, see ``core/model/presets/``) or a local Hugging
  Face directory (``config.json`` + ``*.safetensors``, sharded or not), read as the simulator
  reads it (``core.model``). ``model.config`` is its `core.model.spec.ModelSpec`; a model
  outside the Llama family (OPT, Qwen3, mixtures of experts) is refused by
  ``engine.model.support`` with the config field the engine cannot run.
- ``dtype=None``: fp32 on CPU; on CUDA the config's fp16/bf16, else bf16.
- ``weights="auto"`` loads the directory's safetensors (ValueError if there are none, or if a
  tensor is missing, unexpected or mis-shaped); ``"random"`` draws seeded normal(0, 0.02)
  weights, for timing runs and for presets, which have no checkpoint.
- ``make_kv_caches``: one uninitialised ``(k_cache, v_cache)`` per layer, each
  ``[num_blocks, block_size, num_kv_heads, head_dim]`` in the model's dtype.
- ``forward``: ``input_ids`` and ``positions`` are the step's ``[T]`` int64 rows, decodes first
  then prefill chunks, matching ``meta`` (`engine.attention.AttentionMetadata`, whose
  ``backend`` picks Triton or the vectorised torch path of ``kernels.torch_attention``). The
  step's K/V go into ``kv_caches`` at ``meta.slot_mapping``; the final norm and LM head run
  only on the rows ``logits_indices``, giving ``[len(logits_indices), vocab_size]`` fp32 logits.
"""
