"""What the engine sets up on CUDA only: the KV cache's size from GPU memory, and the CUDA
graphs it captures at start-up.

The order on CUDA, as vLLM's: the graphs are captured once on a one-block scratch cache to
measure their memory (``graph_memory``) and released; a profiling pass of the largest step
gives the peak; the KV cache gets ``gpu_memory_utilization`` of total memory less both
(``gpu_blocks``); then the graphs are captured for good on the real cache
(``capture_graphs``). Nothing here runs on CPU, so its tests stand fakes in for the graphs and
the CUDA calls (tests/engine/test_cuda_setup.py); the real capture is checked on a GPU
(tests/engine/test_gpu_graphs.py).
"""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING, Protocol

import torch

from core.config import GIB, CacheConfig, SchedulerConfig
from engine.cuda_graphs import DecodeGraphs, GraphStats, graph_batch_sizes
from engine.input_batch import StepBuffers
from engine.kv_cache import KVCache
from engine.memory import profile_batch, run_profiling_pass
from engine.mixed_graphs import MixedGraphs, mixed_token_sizes
from kernels.contracts import resolve_backend

if TYPE_CHECKING:
    from engine.model.llama import LlamaForCausalLM
    from engine.model_runner import ModelRunner


class SetupSettings(Protocol):
    """The fields of ``engine.llm_engine.EngineConfig`` the set-up reads (a protocol: the
    engine's module imports this one)."""

    @property
    def cache(self) -> CacheConfig: ...
    @property
    def scheduler(self) -> SchedulerConfig: ...
    @property
    def backend(self) -> str: ...
    @property
    def enforce_eager(self) -> bool: ...
    @property
    def decode_split(self) -> str: ...
    @property
    def mixed_graphs(self) -> str: ...


def uses_graphs(config: SetupSettings, device: torch.device) -> bool:
    """Decode on CUDA graphs: on CUDA, with the Triton kernels, unless ``enforce_eager``."""
    return (
        device.type == "cuda"
        and not config.enforce_eager
        and resolve_backend(device, config.backend) == "triton"
    )


def decode_graphs(
    model: LlamaForCausalLM,
    config: SetupSettings,
    kv_cache: KVCache,
    buffers: StepBuffers,
    max_len: int,
) -> DecodeGraphs:
    """The decode graphs for ``config``'s batch sizes on ``kv_cache``, not yet captured."""
    return DecodeGraphs(
        model,
        kv_cache,
        buffers,
        graph_batch_sizes(config.scheduler.max_num_seqs),
        max_len,
        "triton",
        replay=True,
        decode_split=config.decode_split,
    )


def mixed_graphs(
    model: LlamaForCausalLM, config: SetupSettings, kv_cache: KVCache
) -> MixedGraphs | None:
    """The piecewise graphs for ``config``'s step budget on ``kv_cache``, not yet captured;
    None when ``mixed_graphs`` is off."""
    if config.mixed_graphs == "off":
        return None
    sizes = mixed_token_sizes(config.scheduler.max_num_batched_tokens)
    return MixedGraphs(model, kv_cache.layers, sizes, "triton", replay=True)


def capture_graphs(
    model: LlamaForCausalLM, config: SetupSettings, runner: ModelRunner, max_len: int
) -> GraphStats:
    """Capture the decode graphs on the runner's cache, and the piecewise graphs where they
    are on; hand them to the runner and print what they cost, once."""
    graphs = decode_graphs(model, config, runner.kv_cache, runner.buffers, max_len)
    stats = graphs.capture()
    runner.graphs = graphs
    sizes = graphs.sizes
    print(
        f"engine: captured {stats.num_graphs} CUDA graphs for decode batches of "
        f"{sizes[0]}..{sizes[-1]} in {stats.capture_s:.1f} s, "
        f"{stats.memory_bytes / GIB:.2f} GiB (enforce_eager turns them off)",
        file=sys.stderr,
    )
    mixed = mixed_graphs(model, config, runner.kv_cache)
    if mixed is None:
        return stats
    pieces = mixed.capture()
    runner.mixed_graphs = mixed
    print(
        f"engine: captured {pieces.num_graphs} piecewise CUDA graphs ({mixed.num_pieces} "
        f"pieces at each of {len(mixed.sizes)} token counts {mixed.sizes[0]}.."
        f"{mixed.sizes[-1]}) in {pieces.capture_s:.1f} s, "
        f"{pieces.memory_bytes / GIB:.2f} GiB",
        file=sys.stderr,
    )
    return GraphStats(
        stats.num_graphs + pieces.num_graphs,
        stats.capture_s + pieces.capture_s,
        stats.memory_bytes + pieces.memory_bytes,
    )


def graph_memory(
    model: LlamaForCausalLM, config: SetupSettings, dtype: torch.dtype, max_len: int
) -> int:
    """The device memory the CUDA graphs take, measured before the KV cache is sized by
    capturing them once on a one-block scratch cache (every captured row is padding, so no
    block is read, and the pieces' capture stores nothing: every slot -1) and releasing them."""
    cfg = model.config
    block_size = config.cache.block_size
    scratch = KVCache.allocate(
        cfg.num_layers, 1, block_size, cfg.num_kv_heads, cfg.head_dim,
        dtype, model.device, backend=config.backend,
    )  # fmt: skip
    buffers = StepBuffers(-(-max_len // block_size), model.device)
    graph_bytes = decode_graphs(model, config, scratch, buffers, max_len).capture().memory_bytes
    mixed = mixed_graphs(model, config, scratch)
    if mixed is not None:
        graph_bytes += mixed.capture().memory_bytes
        del mixed
    del scratch, buffers
    torch.cuda.empty_cache()
    return graph_bytes


def gpu_blocks(
    model: LlamaForCausalLM, config: SetupSettings, block_bytes: int, reserved_bytes: int = 0
) -> int:
    """vLLM's rule: run the largest step once, then give the KV cache
    ``gpu_memory_utilization`` of total memory less the peak the pass reached and less
    ``reserved_bytes`` (the CUDA graphs), in blocks of ``block_bytes``."""
    if reserved_bytes < 0:
        raise ValueError(
            f"CUDA graphs measured at {reserved_bytes / GIB:.1f} GiB: memory was freed "
            "while they were captured, so the KV cache cannot be sized from it"
        )
    device = model.device
    # An engine its caller dropped may still hold its cache through a reference cycle:
    # collected now, it is not counted in this engine's peak.
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    max_len = config.cache.max_model_len or model.config.max_model_len
    scheduler = config.scheduler
    lens = profile_batch(scheduler.max_num_batched_tokens, scheduler.max_num_seqs, max_len)
    run_profiling_pass(model, lens, config.cache.block_size, config.backend)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    utilization = config.cache.gpu_memory_utilization
    free_for_kv = total * utilization - peak - reserved_bytes
    num_blocks = int(free_for_kv // block_bytes)
    if num_blocks < 1:
        raise ValueError(
            f"no room for a KV cache: peak {peak / GIB:.1f} GiB and CUDA graphs "
            f"{reserved_bytes / GIB:.1f} GiB of {total / GIB:.1f} GiB at "
            f"gpu_memory_utilization {utilization}"
        )
    return num_blocks
