"""How servesim's split-KV decode kernel divides a step's work, and which padded batch a decode
graph replays: the plan the engine launches (``kernels.paged_attention``, ``engine.cuda_graphs``)
and the one the cost model prices (``sim.costmodel.decode_chain``), from one place.

The kernel runs one program per (sequence, KV head, split): each program walks its share of the
sequence's context one tile of K and V at a time, in series. A step's decode attention therefore
lasts at least as long as its longest walk, ``longest_walk_tiles``, whatever the bandwidth.

How a sequence's context is shared among its splits (``SPLIT_MODES``):

- ``"fixed"``: every split is ``tokens_per_split`` long, planned for the longest context the
  launch allows. A decode graph plans for the whole ``max_model_len``, so at 5-8 decodes a
  2,000-token context walks 1,664 tokens in its first split while the other splits idle. The
  engine ran this plan until commit 39ba127 (2026-11-27); so did every run recorded without
  a ``decode_split`` field.
- ``"per_sequence"``: each sequence divides its own context among the launch's splits (whole
  tiles each, ``sequence_split_tokens``), so the count fixed at capture no longer sets the walk.
  The engine's plan since then.

Standard library only.
"""

from __future__ import annotations

import bisect
import math
from typing import Final

MIN_TILES_PER_SPLIT: Final = 4
"""Splitting below this many tiles per split costs more in the reduce than it wins."""
MAX_SPLITS: Final = 64

SPLIT_MODES: Final = ("per_sequence", "fixed")
"""How a sequence's context is shared among its splits (see the module docstring)."""
DEFAULT_SPLIT: Final = "per_sequence"
"""The engine's split mode; a run or profile that names none ran ``"fixed"`` (``split_mode_of``)."""

GRAPH_MAX_BATCH: Final = 512
SMALL_BATCH_SIZES: Final = (1, 2, 4, 8)
BATCH_SIZE_STEP: Final = 8


def gpu_tile_tokens(head_dim: int) -> int:
    """Tokens per K/V tile on a GPU: registers hold the tiles, which caps them for head_dim 256."""
    return 32 if head_dim >= 256 else 64


def choose_num_splits(num_programs: int, max_tiles: int, target_programs: int) -> int:
    """Split the tokens only when (sequences x kv heads) programs cannot fill the device."""
    if num_programs >= target_programs:
        return 1
    wanted = math.ceil(target_programs / max(num_programs, 1))
    by_length = max(1, max_tiles // MIN_TILES_PER_SPLIT)
    return max(1, min(wanted, by_length, MAX_SPLITS))


def plan_splits(
    num_programs: int,
    max_seq_len: int,
    tile: int,
    target_programs: int,
    num_splits: int | None = None,
) -> tuple[int, int]:
    """(num_splits, tokens_per_split) for ``num_programs`` (sequences x KV heads) over contexts
    of at most ``max_seq_len`` tokens, the split a whole number of tiles long; ``num_splits``
    given fixes the count."""
    max_tiles = math.ceil(max_seq_len / tile)
    if num_splits is None:
        num_splits = choose_num_splits(num_programs, max_tiles, target_programs)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return num_splits, math.ceil(max(max_tiles, 1) / num_splits) * tile


def check_split_mode(mode: object, where: str = "decode_split") -> str:
    """``mode`` if it is one of ``SPLIT_MODES``, else a ValueError naming ``where``."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"{where} must be one of {SPLIT_MODES}, got {mode!r}")
    return str(mode)


def split_mode_of(recorded: dict[str, object] | None, where: str = "decode_split") -> str:
    """The split mode a run's or profile's engine settings name (``decode_split``); ``"fixed"``
    where they name none: those were recorded before the engine had another."""
    mode = (recorded or {}).get("decode_split", "fixed")
    return check_split_mode(mode, where)


def sequence_split_tokens(context: int, num_splits: int, tile: int) -> int:
    """Tokens in each split of one ``context``-token sequence under ``"per_sequence"``: its
    tiles divided among ``num_splits``, rounded up to whole tiles (the last split may be
    shorter, and later ones empty)."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return math.ceil(math.ceil(max(context, 0) / tile) / num_splits) * tile


def longest_walk_tiles(
    max_context: int,
    tokens_per_split: int,
    tile: int,
    *,
    num_splits: int = 1,
    mode: str = "fixed",
) -> int:
    """Tiles the busiest program walks in series: the longest context's first split, which is
    ``tokens_per_split`` long (``"fixed"``) or its own share of ``num_splits``
    (``"per_sequence"``)."""
    if max_context <= 0:
        return 0
    if check_split_mode(mode, "mode") == "per_sequence":
        tokens_per_split = sequence_split_tokens(max_context, num_splits, tile)
    return math.ceil(min(max_context, tokens_per_split) / tile)


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The padded batch sizes to capture: 1, 2, 4, 8, then every multiple of 8 below
    ``min(max_num_seqs, 512)``, and that bound itself (so every batch up to it has one)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs!r}")
    largest = min(max_num_seqs, GRAPH_MAX_BATCH)
    steps = range(2 * BATCH_SIZE_STEP, largest, BATCH_SIZE_STEP)
    sizes = [s for s in (*SMALL_BATCH_SIZES, *steps) if s < largest]
    return (*sizes, largest)


def padded_batch_size(sizes: tuple[int, ...], num_rows: int) -> int | None:
    """The smallest of ``sizes`` (ascending) that holds ``num_rows`` rows, None if none."""
    idx = bisect.bisect_left(sizes, num_rows)
    return sizes[idx] if idx < len(sizes) and num_rows > 0 else None
