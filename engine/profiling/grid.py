"""What calibration times at: the sizes of every table and check point (``CalibrationGrid``),
and a grid small enough for tests (``SMALL_GRID``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class CalibrationGrid:
    """Sizes to time at. Contexts past the model's length are dropped."""

    num_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    decode_seqs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_context: tuple[int, ...] = (16, 64, 256, 1024, 2048, 4096)
    # Skewed decode batches (num_seqs, short context, long context), half of each: check points
    # that tell whether the kernel's cost follows the batch's mean context or its longest.
    decode_skew: tuple[tuple[int, int, int], ...] = ((4, 64, 1024), (16, 64, 1024), (16, 16, 256))
    prefill_query: tuple[int, ...] = (16, 64, 256, 1024, 2048)
    prefill_context: tuple[int, ...] = (0, 256, 1024, 2048)
    lm_seqs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    num_blocks: tuple[int, ...] = (1, 4, 16, 64)
    repeats: int = 15
    min_repeats: int = 3
    warmup: int = 2
    max_point_s: float = 1.5  # past this, a point stops at min_repeats
    check_requests: int = 12  # requests of the whole-step check run
    # The step grid: whole engine steps (engine.step, every code path of a real step) for
    # num_seqs requests of a prompt of context tokens, each prefilled at the engine's own
    # token budget and then decoded ``step_decodes`` steps. Synthetic prompts, no trace: the
    # cost model's terms are fitted jointly to these steps (docs/profile_format.md).
    step_seqs: tuple[int, ...] = (1, 2, 4, 8, 16, 48)
    step_context: tuple[int, ...] = (64, 256, 1024)
    step_decodes: int = 16
    # Half-way through each group's decodes a prompt of this many tokens arrives, so that one
    # step prefills beside the group's decodes (a mixed step, the one a request's TTFT ends on).
    step_mixed_prompt: int = 128
    # Rounds of the whole step grid, one after the other (each round runs every group once),
    # so that drift hits every group alike; each step keeps its median and spread.
    step_repeats: int = 3

    def __post_init__(self) -> None:
        for name in (
            "num_tokens",
            "decode_seqs",
            "decode_context",
            "prefill_query",
            "prefill_context",
            "lm_seqs",
            "num_blocks",
            "step_seqs",
            "step_context",
        ):
            values = getattr(self, name)
            if not values or any(b <= a for a, b in pairwise(values)):
                raise ValueError(f"CalibrationGrid.{name} must be increasing, got {values!r}")
            if values[0] < (0 if name == "prefill_context" else 1):
                raise ValueError(f"CalibrationGrid.{name} starts too low: {values!r}")
        for skew in self.decode_skew:
            if len(skew) != 3 or skew[0] < 2 or not 1 <= skew[1] < skew[2]:
                raise ValueError(
                    "CalibrationGrid.decode_skew: each entry is (num_seqs >= 2, short, long) "
                    f"with 1 <= short < long, got {skew!r}"
                )
        for name in (
            "repeats",
            "min_repeats",
            "check_requests",
            "step_decodes",
            "step_mixed_prompt",
            "step_repeats",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"CalibrationGrid.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"CalibrationGrid.warmup must be >= 0, got {self.warmup}")


SMALL_GRID = CalibrationGrid(
    num_tokens=(1, 16, 128),
    decode_seqs=(1, 4),
    decode_context=(16, 128),
    decode_skew=((4, 16, 128),),
    prefill_query=(16, 64),
    prefill_context=(0, 64),
    lm_seqs=(1, 4),
    num_blocks=(1, 4),
    repeats=3,
    min_repeats=1,
    warmup=1,
    check_requests=3,
    step_seqs=(1, 2),
    step_context=(16, 64),
    step_decodes=2,
    step_mixed_prompt=8,
    step_repeats=2,
)
"""A grid small enough for tests (seconds on CPU)."""


def for_backend(grid: CalibrationGrid, backend: str, row_path_max_seqs: int) -> CalibrationGrid:
    """``grid`` with a decode-batch knot where ``backend``'s decode attention changes path: the
    torch backend attends up to ``row_path_max_seqs`` rows one at a time and more by split and
    merge (``kernels.torch_attention``), so the first batch past the switch is timed too, where
    the grid reaches past it. Without it, the tables interpolate from the row path at 8 to the
    split path at 16, and the CPU runs' decode steps of 9 or more were priced 6-10% fast (sets
    8 and 9 of ``benchmarks/results/cpu-calibrations-2026-11-28``, their preparation measured)."""
    knot = row_path_max_seqs + 1
    if backend != "torch" or knot in grid.decode_seqs or knot >= grid.decode_seqs[-1]:
        return grid
    return replace(grid, decode_seqs=tuple(sorted((*grid.decode_seqs, knot))))
