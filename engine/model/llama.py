"""The Llama-family decoder in torch: RMSNorm, RoPE (plain, linear, llama3), GQA attention
through ``engine.attention.attend`` on the paged KV cache, SwiGLU MLP, and an LM head run only
on the rows that sample.

Q/K/V and gate/up projections are fused (one matmul each); `weight_targets` maps every Hugging
Face tensor name onto the slice of our parameter it fills. On the Triton backend the elementwise
work runs as fused kernels (add+RMSNorm, SiLU×mul, rotary from one cos_sin cache), chosen once
per step (``step_ops``).
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
from kernels.contracts import resolve_backend

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

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x Wᵀ + b written into ``out`` (the same GEMM as ``forward``, to a fixed address)."""
        if self.bias is None:
            return torch.mm(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)


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


def cos_sin_cache(
    inv_freq: torch.Tensor, max_positions: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """[max_positions, 2 * len(inv_freq)], the layout ``kernels.rotary`` reads: row p holds
    cos(p * inv_freq), then sin(p * inv_freq), taken in fp32 and stored in the model's dtype
    (as Hugging Face rounds its cos/sin)."""
    positions = torch.arange(max_positions, dtype=torch.int64)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by the angles of cos/sin [T, D/2] (halves layout, as in HF)."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class TorchStepOps:
    """A step's elementwise work in torch (the CPU path; the same math as Hugging Face's), with
    the step's cos/sin rows gathered once for every layer."""

    __slots__ = ("cos", "sin")

    def __init__(self, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
        self.cos, self.sin = cos_sin_cache[positions].chunk(2, dim=-1)

    def rms_norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        out: torch.Tensor = norm(x)
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), the sum written into residual."""
        residual.add_(x)
        return norm(residual), residual

    def rotate(self, qk: torch.Tensor, num_q_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, k) rotated to their positions, from qk [T, q_heads + kv_heads, D]."""
        qk = apply_rope(qk, self.cos, self.sin)  # q and k side by side: one rotation
        return qk[:, :num_q_heads], qk[:, num_q_heads:]

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class TritonStepOps:
    """The same work as fused Triton kernels, one launch each, through their bare launchers:
    the model's tensors are right by construction, so the wrappers' checks are not paid per
    layer (STYLE §7: plan once per step, run per layer). In-place where vLLM's ops are."""

    __slots__ = ("_norm", "_rotary", "_silu", "cos_sin_cache", "positions")

    def __init__(self, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
        # Imported here: triton's @jit reads TRITON_INTERPRET as the modules load.
        from kernels.activation import launch_silu_and_mul
        from kernels.rms_norm import launch_rms_norm
        from kernels.rotary import launch_rotary_embedding

        self.positions, self.cos_sin_cache = positions, cos_sin_cache
        self._norm, self._rotary, self._silu = (
            launch_rms_norm,
            launch_rotary_embedding,
            launch_silu_and_mul,
        )

    def rms_norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        out = torch.empty_like(x)
        self._norm(x, None, norm.weight, out, norm.eps)
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one pass, written into x and residual."""
        self._norm(x, residual, norm.weight, x, norm.eps)
        return x, residual

    def rotate(self, qk: torch.Tensor, num_q_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated in place (views of qk [T, q_heads + kv_heads, D])."""
        q, k = qk[:, :num_q_heads], qk[:, num_q_heads:]
        self._rotary(self.positions, q, k, self.cos_sin_cache)
        return q, k

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))
        self._silu(gate_up, out)
        return out


StepOps = TorchStepOps | TritonStepOps


def step_ops(positions: torch.Tensor, cos_sin_cache: torch.Tensor, backend: str) -> StepOps:
    """How this step's layers run their elementwise work, chosen once per step."""
    if resolve_backend(positions.device, backend) == "triton":
        return TritonStepOps(positions, cos_sin_cache)
    return TorchStepOps(positions, cos_sin_cache)


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
        ops: StepOps,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.project(x, ops)
        out = attend(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.output(out)

    def project(
        self, x: torch.Tensor, ops: StepOps, qkv_out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D] rotated, k and v [T, kv_heads, D] of x [T, hidden]; with ``qkv_out``
        [T, q_size + 2 kv_size] the projection is written there (a piecewise graph's buffer)."""
        num_tokens = x.shape[0]
        num_heads, num_kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x) if qkv_out is None else self.qkv_proj.into(x, qkv_out)
        qk_heads = num_heads + num_kv_heads
        qk = qkv[:, : qk_heads * head_dim].view(num_tokens, qk_heads, head_dim)
        q, k = ops.rotate(qk, num_heads)
        v = qkv[:, qk_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
        return q, k, v

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The output projection of the attention's out [T, heads, D] (or [T, heads x D])."""
        projected: torch.Tensor = self.o_proj(
            out.reshape(out.shape[0], self.num_heads * self.head_dim)
        )
        return projected


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(hidden, 2 * inter, config.mlp_bias, device, dtype)
        self.down_proj = Linear(inter, hidden, config.mlp_bias, device, dtype)

    def forward(self, x: torch.Tensor, ops: StepOps) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))
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
        residual: torch.Tensor | None,
        ops: StepOps,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it), as vLLM carries them: the
        add of each sublayer's output is fused into the norm that follows it."""
        h, residual = self.enter(x, residual, ops)
        h = self.self_attn(h, ops, kv_cache, meta)
        return self.leave(h, residual, ops)

    def enter(
        self, x: torch.Tensor, residual: torch.Tensor | None, ops: StepOps
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the attention's input, the residual stream): the input norm, with the previous
        layer's add (none in the first layer, whose x is the embedding)."""
        if residual is None:
            return ops.rms_norm(x, self.input_layernorm), x
        return ops.add_rms_norm(x, residual, self.input_layernorm)

    def leave(
        self, attended: torch.Tensor, residual: torch.Tensor, ops: StepOps
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP's output, the residual stream) after the attention's projected output."""
        h, residual = ops.add_rms_norm(attended, residual, self.post_attention_layernorm)
        return self.mlp(h, ops), residual


class LlamaForCausalLM(nn.Module):
    """The decoder over one step's flattened rows (decodes first, then prefill chunks)."""

    cos_sin_cache: torch.Tensor

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
        cache = cos_sin_cache(inv_freq, config.max_model_len, device, dtype)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

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
        ops = step_ops(positions, self.cos_sin_cache, meta.backend)
        x = F.embedding(input_ids, self.embed_tokens)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.decoder_layers(), kv_caches, strict=True):
            x, residual = layer(x, residual, ops, kv_cache, meta)
        assert residual is not None  # a model has at least one layer
        return self.logits(x, residual, ops, logits_indices)

    def logits(
        self, x: torch.Tensor, residual: torch.Tensor, ops: StepOps, logits_indices: torch.Tensor
    ) -> torch.Tensor:
        """The last residual add, the final norm and the LM head, on the sampling rows only."""
        x, _ = ops.add_rms_norm(x[logits_indices], residual[logits_indices], self.norm)
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
