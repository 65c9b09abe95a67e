"""The Llama-family decoder in torch: RMSNorm, RoPE (plain, linear, llama3), GQA attention
through ``engine.attention.attend`` on the paged KV cache, SwiGLU MLP, and an LM head run only
on the rows that sample.

Q/K/V and gate/up projections are fused (one matmul each); `weight_targets` maps every Hugging
Face tensor name onto the slice of our parameter it fills.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from core.model.spec import ModelSpec, RopeScaling
from engine.attention import AttentionMetadata, attend
from engine.model.support import RUNNABLE_DTYPES, rms_norm_eps

# The torch dtype of each checkpoint dtype the engine runs (torch names them alike).
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in RUNNABLE_DTYPES}


class Linear(nn.Module):
    """y = x Wᵀ + b, with parameters left uninitialised (the loader or the seeded init fills
    them), so building an 8B model costs no random draws."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype)
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, the statistics taken in fp32 whatever the model dtype."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = self.weight.shape
        if x.dtype == torch.float32:
            return F.rms_norm(x, shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), shape, eps=self.eps).to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """The head_dim / 2 rotary frequencies (fp32), after linear or llama3 scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    factor = scaling.factor
    assert factor is not None, "RopeScaling requires a factor for linear and llama3"
    if scaling.rope_type == "linear":
        return inv_freq / factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    original_len = scaling.original_max_position_embeddings
    assert low is not None and high is not None and original_len is not None  # llama3's keys
    # llama3: wavelengths longer than original_len / low_freq_factor are slowed by `factor`,
    # shorter than original_len / high_freq_factor kept, and the band between interpolated.
    wavelength = 2 * math.pi / inv_freq
    band = (original_len / wavelength - low) / (high - low)
    blended = (1 - band) * inv_freq / factor + band * inv_freq
    is_low = wavelength > original_len / low
    is_high = wavelength < original_len / high
    return torch.where(is_low, inv_freq / factor, torch.where(is_high, inv_freq, blended))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by the angles of cos/sin [T, D/2] (halves layout, as in HF)."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        qkv_size = config.q_size + 2 * config.kv_size
        self.qkv_proj = Linear(config.hidden_size, qkv_size, config.qkv_bias, device, dtype)
        self.o_proj = Linear(config.q_size, config.hidden_size, config.o_bias, device, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        num_heads, num_kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        # q and k sit side by side in qkv, so one rotation covers both.
        qk_heads = num_heads + num_kv_heads
        qk = qkv[:, : qk_heads * head_dim].view(num_tokens, qk_heads, head_dim)
        qk = apply_rope(qk, cos, sin)
        q, k = qk[:, :num_heads], qk[:, num_heads:]
        v = qkv[:, qk_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
        out = attend(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        projected: torch.Tensor = self.o_proj(out.reshape(num_tokens, num_heads * head_dim))
        return projected


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(hidden, 2 * inter, config.mlp_bias, device, dtype)
        self.down_proj = Linear(inter, hidden, config.mlp_bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        eps, hidden = rms_norm_eps(config), config.hidden_size
        self.input_layernorm = RMSNorm(hidden, eps, device, dtype)
        self.self_attn = Attention(config, device, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, device, dtype)
        self.mlp = MLP(config, device, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaForCausalLM(nn.Module):
    """The decoder over one step's flattened rows (decodes first, then prefill chunks)."""

    cos_table: torch.Tensor
    sin_table: torch.Tensor

    def __init__(self, config: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Parameter(
            torch.empty(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, device, dtype) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, rms_norm_eps(config), device, dtype)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else nn.Parameter(
                torch.empty(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
            )
        )
        # cos/sin of every position the model allows, built once: a step only indexes them.
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        positions = torch.arange(config.max_model_len, dtype=torch.int64)
        angles = positions.float()[:, None] * inv_freq[None, :]
        self.register_buffer("cos_table", angles.cos().to(device, dtype), persistent=False)
        self.register_buffer("sin_table", angles.sin().to(device, dtype), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def make_kv_caches(
        self, num_blocks: int, block_size: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One (k_cache, v_cache) per layer, each [num_blocks, block_size, kv_heads, D], left
        uninitialised: every attention path reads only slots a sequence has written (the
        kernel tests poison the rest with NaN), and zeroing a CPU cache of a GiB cost seconds
        of page faults before the first step."""
        for field, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        shape = (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        return [
            (
                torch.empty(shape, device=self.device, dtype=self.dtype),
                torch.empty(shape, device=self.device, dtype=self.dtype),
            )
            for _ in range(self.config.num_layers)
        ]

    def weight_targets(self) -> dict[str, torch.Tensor]:
        """Every Hugging Face tensor name the model needs, mapped to the (view of the)
        parameter it fills; fused projections give one row slice per source tensor."""
        config = self.config
        targets: dict[str, torch.Tensor] = {"model.embed_tokens.weight": self.embed_tokens.data}
        if not config.tie_word_embeddings:
            targets["lm_head.weight"] = self.lm_head.data
        targets["model.norm.weight"] = self.norm.weight.data
        q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
        for idx, layer in enumerate(self.decoder_layers()):
            prefix = f"model.layers.{idx}."
            targets[prefix + "input_layernorm.weight"] = layer.input_layernorm.weight.data
            targets[prefix + "post_attention_layernorm.weight"] = (
                layer.post_attention_layernorm.weight.data
            )
            attn, mlp = layer.self_attn, layer.mlp
            fused = (
                (
                    "self_attn.",
                    attn.qkv_proj,
                    (("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)),
                ),
                ("self_attn.", attn.o_proj, (("o_proj", 0, config.hidden_size),)),
                ("mlp.", mlp.gate_up_proj, (("gate_proj", 0, inter), ("up_proj", inter, inter))),
                ("mlp.", mlp.down_proj, (("down_proj", 0, config.hidden_size),)),
            )
            for group, linear, parts in fused:
                for part, start, rows in parts:
                    name = f"{prefix}{group}{part}"
                    targets[name + ".weight"] = linear.weight.data[start : start + rows]
                    if linear.bias is not None:
                        targets[name + ".bias"] = linear.bias.data[start : start + rows]
        return targets

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] in fp32 for the step's rows ``logits_indices``.

        input_ids and positions are [num_tokens] int64; the step's K/V are written into
        ``kv_caches`` (one pair per layer) at ``meta.slot_mapping``.
        """
        self._check_inputs(input_ids, positions, kv_caches, meta, logits_indices)
        cos, sin = self.cos_table[positions], self.sin_table[positions]
        x = F.embedding(input_ids, self.embed_tokens)
        for layer, kv_cache in zip(self.decoder_layers(), kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta)
        x = self.norm(x[logits_indices])
        return F.linear(x, self.lm_head).float()

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> None:
        for name, tensor in (
            ("input_ids", input_ids),
            ("positions", positions),
            ("logits_indices", logits_indices),
        ):
            if tensor.dim() != 1 or tensor.dtype != torch.int64:
                raise ValueError(
                    f"{name} must be a 1-D int64 tensor, got {tensor.dtype} {tuple(tensor.shape)}"
                )
        if positions.shape != input_ids.shape:
            raise ValueError(
                f"positions has {positions.shape[0]} rows but input_ids has {input_ids.shape[0]}"
            )
        if meta.num_tokens != input_ids.shape[0]:
            raise ValueError(
                f"meta.slot_mapping has {meta.num_tokens} rows but input_ids has "
                f"{input_ids.shape[0]}"
            )
        if len(kv_caches) != self.config.num_layers:
            raise ValueError(
                f"kv_caches has {len(kv_caches)} layers, the model {self.config.num_layers}"
            )


def resolve_dtype(
    config: ModelSpec, device: torch.device, dtype: torch.dtype | None
) -> torch.dtype:
    """None: fp32 on CPU; on CUDA the config's fp16/bf16, else bf16."""
    if dtype is not None:
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of {list(DTYPES.values())}, got {dtype!r}")
        return dtype
    if device.type != "cuda":
        return torch.float32
    if config.dtype in ("float16", "bfloat16"):
        return DTYPES[config.dtype]
    return torch.bfloat16
