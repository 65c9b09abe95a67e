"""The in-memory trace: `TraceRequest` (one request), `Trace` (an ordered run of them) and
`LengthTable` (prompt/output lengths without arrival times). Stdlib only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from traces.problems import MAX_LISTED_PROBLEMS, TraceProblem

DEFAULT_HASH_BLOCK_TOKENS = 512
# Where a problem message turns from its kind to the row's particular values.
_REASON_END = re.compile(r"[:(]|, got")


def _require_int(owner: str, field: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{owner}.{field} must be an int >= {minimum}, got {value!r}")


def _require_int_tuple(owner: str, field: str, value: object) -> None:
    if not isinstance(value, tuple):
        raise ValueError(f"{owner}.{field} must be a tuple of ints or None, got {value!r}")
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool):
            raise ValueError(f"{owner}.{field} must hold ints, got {item!r}")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives and how many tokens it reads and writes.

    `prompt_token_ids` (the prompt itself) or `prefix_hash_ids` (one id per `hash_block_tokens`
    block of the prompt; equal leading ids mean an equal prefix) let prefix caching hit.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    num_samples: int = 1
    prompt_token_ids: tuple[int, ...] | None = None
    prefix_hash_ids: tuple[int, ...] | None = None
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
    # Lower is served first under ``--scheduling-policy priority`` (vLLM's ``priority``).
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(
                f"TraceRequest.request_id must be a non-empty str, got {self.request_id!r}"
            )
        arrival = self.arrival_s
        if not isinstance(arrival, (int, float)) or not math.isfinite(arrival) or arrival < 0:
            raise ValueError(
                f"TraceRequest.arrival_s must be a finite float >= 0, got {arrival!r}"
                f" (request {self.request_id!r})"
            )
        _require_int("TraceRequest", "prompt_tokens", self.prompt_tokens, 1)
        _require_int("TraceRequest", "output_tokens", self.output_tokens, 1)
        _require_int("TraceRequest", "num_samples", self.num_samples, 1)
        _require_int("TraceRequest", "hash_block_tokens", self.hash_block_tokens, 1)
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(f"TraceRequest.priority must be an int, got {self.priority!r}")
        for field in ("prompt_token_ids", "prefix_hash_ids"):
            if getattr(self, field) == ():
                object.__setattr__(self, field, None)
        if self.prompt_token_ids is not None:
            _require_int_tuple("TraceRequest", "prompt_token_ids", self.prompt_token_ids)
            if len(self.prompt_token_ids) != self.prompt_tokens:
                raise ValueError(
                    f"TraceRequest.prompt_token_ids has {len(self.prompt_token_ids)} ids but"
                    f" prompt_tokens is {self.prompt_tokens} (request {self.request_id!r})"
                )
        if self.prefix_hash_ids is not None:
            _require_int_tuple("TraceRequest", "prefix_hash_ids", self.prefix_hash_ids)
            max_blocks = self.num_hash_blocks
            if len(self.prefix_hash_ids) > max_blocks:
                raise ValueError(
                    f"TraceRequest.prefix_hash_ids has {len(self.prefix_hash_ids)} ids but a"
                    f" {self.prompt_tokens}-token prompt has only {max_blocks} blocks of"
                    f" {self.hash_block_tokens} tokens (request {self.request_id!r})"
                )

    @property
    def num_hash_blocks(self) -> int:
        """Blocks of `hash_block_tokens` the prompt spans (the last may be partial)."""
        return -(-self.prompt_tokens // self.hash_block_tokens)


def _quantile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list (numpy's default)."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    frac = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac


def _describe(prefix: str, values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        f"{prefix}_mean": sum(ordered) / len(ordered),
        f"{prefix}_median": _quantile(ordered, 0.5),
        f"{prefix}_p99": _quantile(ordered, 0.99),
        f"{prefix}_min": float(ordered[0]),
        f"{prefix}_max": float(ordered[-1]),
    }


@dataclass(frozen=True, slots=True)
class Trace:
    """An ordered, non-empty sequence of requests with non-decreasing `arrival_s`.

    Loaded traces start at 0.0; `arrival_offset_s` is what was subtracted from the source's
    times (Unix seconds for date-time sources). With `on_error="skip"`, `num_skipped` counts the
    rows left out and `problems` says why; `notes` holds other loader remarks (e.g. kept
    failures) that a run summary should repeat.
    """

    name: str
    requests: tuple[TraceRequest, ...]
    source: str | None = None
    format: str = "servesim"
    num_skipped: int = 0
    problems: tuple[TraceProblem, ...] = ()
    arrival_offset_s: float = 0.0
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple):
            object.__setattr__(self, "requests", tuple(self.requests))
        if not self.requests:
            raise ValueError(f"Trace.requests must not be empty (trace {self.name!r})")
        _require_int("Trace", "num_skipped", self.num_skipped, 0)
        previous = -math.inf
        seen: set[str] = set()
        for idx, request in enumerate(self.requests):
            if not isinstance(request, TraceRequest):
                raise ValueError(f"Trace.requests[{idx}] must be a TraceRequest, got {request!r}")
            if request.arrival_s < previous:
                raise ValueError(
                    f"Trace.requests[{idx}].arrival_s {request.arrival_s!r} is before the"
                    f" previous request's {previous!r}: arrivals must be non-decreasing"
                )
            if request.request_id in seen:
                raise ValueError(
                    f"Trace.requests[{idx}].request_id {request.request_id!r} is a duplicate"
                )
            previous = request.arrival_s
            seen.add(request.request_id)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """Time from the first arrival to the last."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def mean_rate_per_s(self) -> float:
        """Requests / (last - first arrival); 0.0 when every request arrives at once."""
        duration = self.duration_s
        return len(self.requests) / duration if duration > 0 else 0.0

    def length_stats(self) -> dict[str, float]:
        """Counts, rate and prompt/output mean/median/p99/min/max, for report headers.

        With prefix hash ids, `hash_block_reuse` is the fraction of block references whose id
        appeared in an earlier request (the prefix-cache hit bound with an infinite cache).
        """
        stats: dict[str, float] = {
            "num_requests": float(len(self.requests)),
            "num_skipped": float(self.num_skipped),
            "duration_s": self.duration_s,
            "mean_rate_per_s": self.mean_rate_per_s,
            "num_samples_mean": sum(r.num_samples for r in self.requests) / len(self.requests),
        }
        stats |= _describe("prompt", [r.prompt_tokens for r in self.requests])
        stats |= _describe("output", [r.output_tokens for r in self.requests])
        references = [r.prefix_hash_ids for r in self.requests if r.prefix_hash_ids]
        num_refs = sum(len(ids) for ids in references)
        if num_refs:
            num_distinct = len({block_id for ids in references for block_id in ids})
            stats["hash_block_reuse"] = 1.0 - num_distinct / num_refs
        return stats

    def describe_skipped(self) -> str:
        """One line for a run summary: how many rows were skipped and why (empty if none)."""
        if not self.num_skipped:
            return ""
        reasons: dict[str, int] = {}
        for problem in self.problems:
            key = f"{problem.field}: {_REASON_END.split(problem.message, maxsplit=1)[0].strip()}"
            reasons[key] = reasons.get(key, 0) + 1
        listed = "; ".join(f"{count} x {reason}" for reason, count in sorted(reasons.items()))
        return f"skipped {self.num_skipped} row(s) of {self.source or self.name}: {listed}"

    def skipped_rows(self) -> list[str]:
        """What a run says of the rows left out (none: empty): `describe_skipped`, then each
        row as ``file:line: field: message``, the first `MAX_LISTED_PROBLEMS` of them and then
        how many more."""
        if not self.num_skipped:
            return []
        lines = [self.describe_skipped(), *map(str, self.problems[:MAX_LISTED_PROBLEMS])]
        if len(self.problems) > MAX_LISTED_PROBLEMS:
            lines.append(f"... and {len(self.problems) - MAX_LISTED_PROBLEMS} more row(s)")
        return lines

    def load_notes(self) -> list[str]:
        """What a command prints on stderr after loading the trace: the rows left out and why
        (`skipped_rows`, each row indented under the first line), then the other notes."""
        lines = [f"  {row}" for row in self.skipped_rows()]
        if lines:
            lines[0] = "note: " + lines[0].lstrip()
        return lines + [f"note: {note}" for note in self.notes]


@dataclass(frozen=True, slots=True)
class LengthTable:
    """Prompt/output token counts with no arrival times (e.g. Vidur/etalon stats CSVs).

    Pair it with an arrival process in `traces.generators` to make a `Trace`.
    """

    name: str
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    source: str | None = None
    num_skipped: int = 0
    problems: tuple[TraceProblem, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt_tokens:
            raise ValueError(f"LengthTable.prompt_tokens must not be empty (table {self.name!r})")
        if len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError(
                f"LengthTable.output_tokens has {len(self.output_tokens)} entries but"
                f" prompt_tokens has {len(self.prompt_tokens)}"
            )
        for field, values in (
            ("prompt_tokens", self.prompt_tokens),
            ("output_tokens", self.output_tokens),
        ):
            bad = next((v for v in values if not isinstance(v, int) or v < 1), None)
            if bad is not None:
                raise ValueError(f"LengthTable.{field} must hold ints >= 1, got {bad!r}")

    def __len__(self) -> int:
        return len(self.prompt_tokens)
