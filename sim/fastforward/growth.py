"""What a run of repeated steps grows: per request (``RequestGrowth``) and in aggregate
(``RepeatShape``), shared by the plan, the memory sums and the simulator's pricing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from core.request import Request

# Positions left for a decode: it grows until it finishes, however long the run.
# The largest int a compiled build holds unboxed (docs/compiled_core.md): 1 << 62 would be a
# boxed long, and every comparison with it a call into the interpreter's integers.
UNBOUNDED: Final = (1 << 62) - 1


# One request's growth over the run: (request, positions per step for each of its active
# sequences, positions left until done: ``UNBOUNDED`` for a decode). A plain tuple, not a
# named one: planning builds one per running request per run, and a named tuple's
# constructor costs 0.2-0.3 us more each (about 4% of a 20k-request chunked run).
RequestGrowth = tuple[Request, int, int]


# A prompt taking one chunk a step: (positions_per_step, tokens_held, positions_left,
# num_seqs): ``num_seqs`` sequences each holding ``tokens_held`` tokens, growing
# ``positions_per_step`` a step until ``positions_left``. Plain tuples, as ``RequestGrowth``:
# a named tuple's constructor runs as Python even in a compiled build.
ChunkRun = tuple[int, int, int, int]

# Tokens that steps compute: (prefill, decode).
StepTokens = tuple[int, int]


@dataclass(frozen=True, slots=True, init=False)
class RepeatShape:
    """A repeated step in aggregate: what pricing it and summing its memory need, gathered
    once when the run is planned instead of once per use.

    Decoding sequences are counted with the tokens they hold now, and by those tokens modulo
    the block size (``decode_phases``, which tells when each starts a block); each prompt
    chunk is a ``ChunkRun``. When the run's last step also admits the waiting head
    (``admit_request``, its first chunk of ``admit_positions`` filling the budget that a
    prompt's last chunk left), ``admit_step`` is that step's index (else ``UNBOUNDED``).
    ``sum(decode_phases) == decode_seqs`` holds by construction (tests check it against the
    per-request growth, ``PagedRunMemory.shape_of``). Planning builds one per planned run: a
    class with its ``__init__`` written out, which a compiled build (docs/compiled_core.md)
    builds and reads natively (a named tuple's constructor would run as Python, and each
    field read be a generic attribute lookup).
    """

    decode_seqs: int
    decode_tokens: int
    decode_phases: tuple[int, ...]
    chunks: tuple[ChunkRun, ...]
    admit_step: int
    admit_positions: int
    admit_request: Request | None

    def __init__(
        self,
        decode_seqs: int,
        decode_tokens: int,
        decode_phases: tuple[int, ...],
        chunks: tuple[ChunkRun, ...],
        admit_step: int = UNBOUNDED,
        admit_positions: int = 0,
        admit_request: Request | None = None,
    ) -> None:
        object.__setattr__(self, "decode_seqs", decode_seqs)
        object.__setattr__(self, "decode_tokens", decode_tokens)
        object.__setattr__(self, "decode_phases", decode_phases)
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "admit_step", admit_step)
        object.__setattr__(self, "admit_positions", admit_positions)
        object.__setattr__(self, "admit_request", admit_request)

    def admitting(self, step: int, positions: int, request: Request | None) -> RepeatShape:
        """The same shape with the waiting head ``request`` admitted in repeat ``step`` with
        its first ``positions`` (``UNBOUNDED``, 0 and None: admitting nobody)."""
        return RepeatShape(
            self.decode_seqs,
            self.decode_tokens,
            self.decode_phases,
            self.chunks,
            step,
            positions,
            request,
        )
