"""Whether a run was offered more load than its deployment served: prompt tokens offered per
second while requests arrived against those served in the same window, and the backlog left at
the last arrival. A run that is overloaded never reaches a steady state: its latencies grow
with the trace's length and describe the queue, not the deployment."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from core.request import Request, RequestStatus

# A run is overloaded when, over the arrival window, it served (brought to a first token) less
# than this share of the prompt tokens offered in it. A deployment that keeps up leaves unserved
# only the requests of the last TTFT before the final arrival, a share of about TTFT / window.
SERVED_SHARE_FLOOR = 0.9


@dataclass(frozen=True, slots=True)
class Overload:
    """The two rates over the arrival window (from the first arrival to the last) and what
    was still waiting for a first token when the last request arrived."""

    offered_prompt_tokens_per_s: float
    served_prompt_tokens_per_s: float
    backlog_requests: int
    backlog_prompt_tokens: int
    drain_s: float  # from the last arrival to the end of the run

    def __post_init__(self) -> None:
        for name in ("offered_prompt_tokens_per_s", "served_prompt_tokens_per_s", "drain_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Overload.{name} must be >= 0, got {getattr(self, name)!r}")

    @property
    def warning(self) -> str:
        """One line for a run's summary and report."""
        return (
            f"offered load exceeds what the deployment serves: "
            f"{self.offered_prompt_tokens_per_s:,.0f} prompt tokens/s offered, "
            f"{self.served_prompt_tokens_per_s:,.0f} served while requests arrived; at the last "
            f"arrival {self.backlog_requests:,} requests ({self.backlog_prompt_tokens:,} prompt "
            f"tokens) still had no first token, and the run went on {self.drain_s:,.1f} s more"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "warning": self.warning}


def find_overload(
    arrival_s: np.ndarray, first_token_s: np.ndarray, prompt_tokens: np.ndarray, end_s: float
) -> Overload | None:
    """The overload of a run whose admitted (not rejected) requests have these columns
    (``first_token_s`` NaN where none came), ending at ``end_s``; None when it kept up, or when
    every request arrived at one instant (no arrival rate to compare)."""
    if arrival_s.size < 2:
        return None
    first, last = float(arrival_s.min()), float(arrival_s.max())
    window_s = last - first
    if not window_s > 0:
        return None
    # Offered: what arrived before the window's end (the last arrival closes it).
    offered = arrival_s < last
    served = offered & (first_token_s <= last)  # (NaN compares False)
    offered_tokens = float(prompt_tokens[offered].sum())
    served_tokens = float(prompt_tokens[served].sum())
    if served_tokens >= SERVED_SHARE_FLOOR * offered_tokens:
        return None
    waiting = ~(first_token_s <= last)
    return Overload(
        offered_prompt_tokens_per_s=offered_tokens / window_s,
        served_prompt_tokens_per_s=served_tokens / window_s,
        backlog_requests=int(waiting.sum()),
        backlog_prompt_tokens=int(prompt_tokens[waiting].sum()),
        drain_s=max(0.0, end_s - last),
    )


def request_overload(requests: Sequence[Request], end_s: float) -> Overload | None:
    """`find_overload` of a run's requests (the rejected ones left out: nothing serves them)."""
    admitted = [r for r in requests if r.status is not RequestStatus.REJECTED]
    return find_overload(
        np.array([r.arrival_s for r in admitted], dtype=np.float64),
        np.array([np.nan if r.first_token_s is None else r.first_token_s for r in admitted]),
        np.array([r.num_prompt_tokens for r in admitted], dtype=np.float64),
        end_s,
    )


def frame_overload(requests: pd.DataFrame, end_s: float) -> Overload | None:
    """`find_overload` of a ``requests.csv`` frame (any executor's, rejected rows left out)."""
    needed = {"arrival_s", "first_token_s", "prompt_tokens"}
    if requests.empty or not needed <= set(requests.columns):
        return None
    rows = requests[requests["status"] != "rejected"] if "status" in requests else requests
    return find_overload(
        rows["arrival_s"].to_numpy(np.float64),
        pd.to_numeric(rows["first_token_s"], errors="coerce").to_numpy(np.float64),
        rows["prompt_tokens"].to_numpy(np.float64),
        end_s,
    )
