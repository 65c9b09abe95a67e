"""What a run of repeated steps grows: per request (``Growth``) and in aggregate
(``RepeatShape``), shared by the scheduler's skipping ahead, the memory managers and the
simulator's pricing."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.request import Request

# (request, positions it grows by per repeated step, positions left to grow by)
Growth = tuple[Request, int, int]


@dataclass(slots=True)
class RepeatShape:
    """A repeated step in aggregate: what pricing it and summing its memory need, gathered
    once by the scheduler instead of once per use.

    Decoding sequences are counted with the tokens they hold now, and by those tokens modulo
    the block size (which tells when each starts a block); each prompt chunk is (positions
    per step, tokens held, positions left, sequences). When the run's last step also admits
    the waiting head (``admit_request``, its first chunk of ``admit_positions`` filling the
    budget that a prompt's last chunk left), ``admit_step`` is that step's index.
    """

    decode_seqs: int
    decode_tokens: int
    decode_phases: list[int]
    chunks: list[tuple[int, int, int, int]]
    admit_step: int = 1 << 62  # none
    admit_positions: int = 0
    admit_request: Request | None = None
