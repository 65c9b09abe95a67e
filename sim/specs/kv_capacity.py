"""How many KV blocks vLLM finds room for on one rank (`vllm_kv_capacity`), term by term, as
its worker's memory profiling derives them; and Vidur's rule, to show where the two part."""

from __future__ import annotations

from dataclasses import dataclass

from core.model.spec import ModelSpec, check_tp
from sim.specs.hardware import HardwareSpec

GIB = 1 << 30
_LOGIT_BYTES = 4  # vLLM's sampler works on fp32 logits

# The sampler's peak during vLLM's profiling run: fp32 [max_num_seqs, vocab] logits and the
# working copies (temperature, top-k/top-p sort values and indices, softmax, log-softmax).
# 9.7 copies fits the "Peak activation memory" vLLM logged for five models on H100 at its
# serving default of 1,024 sequences (Llama-3.1-8B 4.76 GiB, Llama-3.3-70B TP2 4.84, Qwen3-0.6B
# 5.56, Qwen3-32B 5.64, gpt-oss-20b 7.38: 9.6-9.9 copies of 1024 x vocab x 4 bytes), as
# collected in llm-d-benchmark's config_explorer/empirical-vllm-memory-results.md.
SAMPLER_FP32_COPIES = 9.7
# "Non-torch memory" in the same logs (CUDA context and cuBLAS workspace outside PyTorch's
# allocator): 0.13-0.14 GiB at TP1, 0.55 GiB at TP2, where NCCL adds its buffers.
NON_TORCH_BYTES = int(0.13 * GIB)
NCCL_BYTES = int(0.42 * GIB)


class ModelDoesNotFitError(ValueError):
    """The weights and activation reserve leave no room for even one KV block."""


@dataclass(frozen=True, slots=True)
class KvCapacity:
    """vLLM's KV budget on one rank, in bytes, and the blocks it makes.

    `num_gpu_blocks` is vLLM's count (what it logs as "# GPU blocks"); its block pool keeps
    block 0 as the null block, so `num_usable_blocks` = num_gpu_blocks - 1 hold tokens.
    """

    budget_bytes: int  # total memory x gpu_memory_utilization
    weight_bytes: int  # this rank's shard of the weights
    forward_peak_bytes: int  # live activations of a max_num_batched_tokens forward pass
    sampler_peak_bytes: int  # the sampler's working set over max_num_seqs rows
    non_torch_bytes: int  # CUDA context, cuBLAS workspace, NCCL buffers
    cuda_graph_bytes: int  # subtracted only when given: the logged vLLM did not
    block_bytes: int
    num_gpu_blocks: int

    @property
    def activation_peak_bytes(self) -> int:
        """Profiling sees one peak: the forward's tensors are freed before sampling."""
        return max(self.forward_peak_bytes, self.sampler_peak_bytes)

    @property
    def kv_bytes(self) -> int:
        return (
            self.budget_bytes
            - self.weight_bytes
            - self.activation_peak_bytes
            - self.non_torch_bytes
            - self.cuda_graph_bytes
        )

    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    def describe(self, gpu_memory_utilization: float) -> str:
        """The rule's terms, in GiB: budget less weights, peak activation and memory outside
        PyTorch (and CUDA graphs when counted), over the bytes of one block."""
        total = self.budget_bytes / gpu_memory_utilization / GIB
        graphs = (
            f" - CUDA graphs {self.cuda_graph_bytes / GIB:.2f}" if self.cuda_graph_bytes else ""
        )
        return (
            f"{total:.2f} GiB x gpu_memory_utilization {gpu_memory_utilization:g} = "
            f"{self.budget_bytes / GIB:.2f} - weights {self.weight_bytes / GIB:.2f} - peak "
            f"activation {self.activation_peak_bytes / GIB:.2f} - outside PyTorch "
            f"{self.non_torch_bytes / GIB:.2f}{graphs} = {self.kv_bytes / GIB:.2f} GiB of "
            f"{self.block_bytes / 2**20:.2f} MiB blocks"
        )


def forward_peak_bytes(model: ModelSpec, tp: int, num_tokens: int) -> int:
    """The most activation bytes live at once in one decoder layer: the residual stream and
    the layer input, with either QKV and the attention output, or gate-up and its product."""
    q = model.q_size // tp
    kv = model.kv_heads_per_shard(tp) * model.head_dim
    inter = model.intermediate_size // tp
    attention = q + 2 * kv + q
    mlp = (3 if model.gated_mlp else 2) * inter
    return num_tokens * (2 * model.hidden_size + max(attention, mlp)) * model.dtype_bytes


def vllm_kv_capacity(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    cuda_graph_bytes: int = 0,
    weight_bytes: int | None = None,
) -> KvCapacity:
    """vLLM's rule: total x utilization - weights - peak activation of the profiling run -
    non-torch memory, in whole blocks. Raises ModelDoesNotFitError when no block fits.
    ``weight_bytes``: this GPU's weights, when not the model's TP shard (experts spread over
    data-parallel ranks too)."""
    check_tp(model, tp)
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
        )
    for name, value in (
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if cuda_graph_bytes < 0:
        raise ValueError(f"cuda_graph_bytes must be >= 0, got {cuda_graph_bytes!r}")
    block_bytes = model.kv_bytes_per_block(block_size, tp)
    partial = KvCapacity(
        budget_bytes=int(hardware.hbm_capacity_bytes * gpu_memory_utilization),
        weight_bytes=model.weight_bytes_per_shard(tp) if weight_bytes is None else weight_bytes,
        forward_peak_bytes=forward_peak_bytes(model, tp, max_num_batched_tokens),
        # Logits are gathered whole on every rank before sampling.
        sampler_peak_bytes=int(
            SAMPLER_FP32_COPIES * max_num_seqs * model.vocab_size * _LOGIT_BYTES
        ),
        non_torch_bytes=NON_TORCH_BYTES + (NCCL_BYTES if tp > 1 else 0),
        cuda_graph_bytes=cuda_graph_bytes,
        block_bytes=block_bytes,
        num_gpu_blocks=0,
    )
    if partial.kv_bytes < 2 * block_bytes:  # the null block and one to use
        raise ModelDoesNotFitError(
            f"{model.name} at tp={tp} does not fit on {hardware.name}: "
            f"{partial.weight_bytes / GIB:.1f} GiB of weights per GPU + "
            f"{partial.activation_peak_bytes / GIB:.1f} GiB peak activation + "
            f"{partial.non_torch_bytes / GIB:.2f} GiB outside PyTorch leave "
            f"{partial.kv_bytes / GIB:.1f} GiB of the {partial.budget_bytes / GIB:.1f} GiB "
            f"budget (gpu_memory_utilization={gpu_memory_utilization}), less than two "
            f"{block_bytes / 2**20:.1f} MiB KV blocks; raise tp or use a larger GPU"
        )
    return KvCapacity(
        partial.budget_bytes,
        partial.weight_bytes,
        partial.forward_peak_bytes,
        partial.sampler_peak_bytes,
        partial.non_torch_bytes,
        partial.cuda_graph_bytes,
        block_bytes,
        partial.kv_bytes // block_bytes,
    )


def vidur_num_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int,
    block_size: int,
    memory_margin_fraction: float = 0.1,
    max_request_tokens: int | None = None,
) -> int:
    """Vidur's rule (its memory planner and parameter counter): total x (1 - margin) less the
    decoder layers' weights (its count leaves out the embedding and the LM head), in whole
    `max_request_tokens` KV reservations, then in blocks. No activation, sampler or non-torch
    term."""
    check_tp(model, tp)
    tokens = max_request_tokens or model.max_model_len
    available = hardware.hbm_capacity_bytes * (1 - memory_margin_fraction)
    layer_weights = model.num_layers * model.params_per_layer // tp * model.dtype_bytes
    per_request = tokens * model.kv_bytes_per_token(tp)
    num_requests = int((available - layer_weights) // per_request)
    return num_requests * tokens // block_size


def default_activation_reserve_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Memory a real engine's profiling run sees besides weights and KV: vLLM's peak
    activation (forward pass or sampler, whichever is larger) plus memory outside PyTorch.
    The terms and their sources are in `sim.specs.kv_capacity`."""
    check_tp(model, tp)
    forward = forward_peak_bytes(model, tp, max_num_batched_tokens)
    sampler = int(SAMPLER_FP32_COPIES * max_num_seqs * model.vocab_size * 4)
    return max(forward, sampler) + NON_TORCH_BYTES + (NCCL_BYTES if tp > 1 else 0)


def derive_num_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float,
    activation_reserve_bytes: int | None = None,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    weight_bytes: int | None = None,
) -> int:
    """vLLM's `num_gpu_blocks` on one rank (`sim.specs.kv_capacity.vllm_kv_capacity`): its block
    pool keeps one of them as the null block. `activation_reserve_bytes`, when given, stands
    for the peak activation and the non-torch memory together.

    This is vLLM's ``num_gpu_blocks``, the null block included: a paged cache of this many
    blocks gives requests one fewer (``CacheConfig.num_usable_blocks``). Raises
    ModelDoesNotFitError (a ValueError) when not even one block besides the null block fits.
    """
    if activation_reserve_bytes is None:
        capacity = vllm_kv_capacity(
            model,
            hardware,
            tp,
            block_size,
            gpu_memory_utilization,
            max_num_batched_tokens,
            max_num_seqs,
            weight_bytes=weight_bytes,
        )
        return capacity.num_gpu_blocks
    if activation_reserve_bytes < 0:
        raise ValueError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
        )
    budget = int(hardware.hbm_capacity_bytes * gpu_memory_utilization)
    weights = model.weight_bytes_per_shard(tp) if weight_bytes is None else weight_bytes
    block_bytes = model.kv_bytes_per_block(block_size, tp)
    free = budget - weights - activation_reserve_bytes
    if free < 2 * block_bytes:  # the null block and one a request can use
        raise ModelDoesNotFitError(
            f"{model.name} at tp={tp} does not fit on {hardware.name}: "
            f"{weights / GIB:.1f} GiB of weights per GPU + {activation_reserve_bytes / GIB:.1f} "
            f"GiB activation reserve leave {free / GIB:.1f} GiB of the {budget / GIB:.1f} GiB "
            f"budget (gpu_memory_utilization={gpu_memory_utilization}), less than two "
            f"{block_bytes / 2**20:.1f} MiB KV blocks; raise tp or use a larger GPU"
        )
    return free // block_bytes
