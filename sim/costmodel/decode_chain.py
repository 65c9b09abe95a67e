"""The longest walk of servesim's split-KV decode kernel, priced: a step's decode attention lasts
at least as long as the program that walks the most tiles of K and V in series
(``core.decode_split``), whatever bandwidth the batch's total reads would allow.

Which plan a step runs is the engine's: an eager step splits for its own batch and its longest
context; a decode-only step on CUDA graphs replays the graph of its padded batch size, whose
split count was fixed at capture for the whole ``max_model_len``. How long a walk that makes
depends on the split mode (``core.decode_split.SPLIT_MODES``). Under ``"fixed"`` (the engine
until 39ba127, 2026-11-27) every split spans the capture's length: at 5-8 decodes on an H200 (8
KV heads, 8,192 tokens) a 2,000-token context walks 1,664 tokens in its first split. Under
``"per_sequence"`` it divides its own 2,000 tokens five ways, walks of 448.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.decode_split import (
    DEFAULT_SPLIT,
    check_split_mode,
    gpu_tile_tokens,
    graph_batch_sizes,
    longest_walk_tiles,
    padded_batch_size,
    plan_splits,
)

if TYPE_CHECKING:
    from core.model.spec import ModelSpec
    from sim.costmodel.config import CostModelConfig
    from sim.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True)
class DecodeChain:
    """servesim's decode plan on one GPU: ``kv_heads`` per rank, tiles of ``tile_tokens``, as
    many programs as ``target_programs`` fill (two per SM), ``tile_s`` seconds per tile; and
    with CUDA graphs, the captured batch sizes and the length their plan is sized for; how a
    sequence's context is shared among its splits (``split_mode``)."""

    kv_heads: int
    tile_tokens: int
    target_programs: int
    tile_s: float
    graph_sizes: tuple[int, ...] = ()
    graph_len: int = 0
    split_mode: str = DEFAULT_SPLIT

    def __post_init__(self) -> None:
        check_split_mode(self.split_mode, "DecodeChain.split_mode")
        for name in ("kv_heads", "tile_tokens", "target_programs"):
            if getattr(self, name) < 1:
                raise ValueError(f"DecodeChain.{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.tile_s >= 0:
            raise ValueError(f"DecodeChain.tile_s must be >= 0, got {self.tile_s!r}")
        if self.graph_sizes and self.graph_len < 1:
            raise ValueError(f"DecodeChain.graph_len must be >= 1, got {self.graph_len!r}")

    @classmethod
    def for_engine(
        cls,
        *,
        kv_heads: int,
        head_dim: int,
        num_sms: int,
        tile_s: float,
        cuda_graphs: bool,
        max_num_seqs: int,
        max_model_len: int,
        split_mode: str = DEFAULT_SPLIT,
    ) -> DecodeChain:
        """The plan servesim's engine launches on a GPU of ``num_sms`` SMs."""
        sizes = graph_batch_sizes(max_num_seqs) if cuda_graphs else ()
        tile = gpu_tile_tokens(head_dim)
        return cls(kv_heads, tile, 2 * num_sms, tile_s, sizes, max_model_len, split_mode)

    @classmethod
    def for_cost_model(
        cls, model: ModelSpec, hardware: HardwareSpec, tp: int, config: CostModelConfig
    ) -> DecodeChain | None:
        """servesim's decode plan where the engine priced is servesim's own and the hardware
        states a tile time; None otherwise (vLLM runs other kernels)."""
        if config.engine == "vllm" or not hardware.decode_tile_s:
            return None
        return cls.for_engine(
            kv_heads=model.kv_heads_per_shard(tp),
            head_dim=model.head_dim,
            num_sms=hardware.num_sms,
            tile_s=hardware.decode_tile_s,
            cuda_graphs=config.host_params().cuda_graphs,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len or model.full_attention_len,
            split_mode=config.decode_split,
        )

    def replays(self, num_decodes: int, mixed: bool = False) -> bool:
        """Whether a step of ``num_decodes`` decodes replays a captured graph, whose plan is
        sized for ``graph_len``; otherwise (``mixed``, no graphs, or a batch above the largest
        captured) it launches eagerly, its plan sized for its own longest context."""
        return not mixed and padded_batch_size(self.graph_sizes, num_decodes) is not None

    def on_graph(self, eager_s: float, floor_s: float, num_decodes: int, context: int) -> float:
        """``eager_s``, a uniform batch's decode attention timed eagerly (its splits sized for
        ``context`` itself, so its busiest program walks ``tiles(..., mixed=True)``), on a
        decode graph's plan. That plan is sized for ``graph_len``; under the per-sequence split
        each sequence shares its own context among its splits and walks fewer tiles (one
        context of 2,048 tokens on the H200: 8 splits of 4 tiles eager, 32 of one in the
        graph). Each tile the graph does not walk is ``tile_s`` off, never below ``floor_s``
        (the shortest context's time: one tile, no split). Where the graph walks as far or
        further (the fixed split), ``eager_s`` as it is: the walk floors the term elsewhere."""
        unwalked = self.tiles(num_decodes, context, mixed=True) - self.tiles(num_decodes, context)
        if unwalked <= 0:
            return eager_s
        return max(floor_s, eager_s - unwalked * self.tile_s)

    def tiles(self, num_decodes: int, max_context: int, mixed: bool = False) -> int:
        """Tiles the busiest program walks in a step of ``num_decodes`` decodes, the longest of
        ``max_context`` tokens; ``mixed``: the step also prefills (it runs eagerly)."""
        if num_decodes <= 0 or max_context <= 0:
            return 0
        padded = None if mixed else padded_batch_size(self.graph_sizes, num_decodes)
        rows, plan_len = (num_decodes, max_context) if padded is None else (padded, self.graph_len)
        num_splits, per_split = plan_splits(
            rows * self.kv_heads, plan_len, self.tile_tokens, self.target_programs
        )
        return longest_walk_tiles(
            max_context, per_split, self.tile_tokens, num_splits=num_splits, mode=self.split_mode
        )

    def layer_s(self, num_decodes: int, max_context: int, mixed: bool = False) -> float:
        """One layer's longest walk, in seconds."""
        return self.tile_s * self.tiles(num_decodes, max_context, mixed)
