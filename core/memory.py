"""Memory accounting snapshot: where every KV token slot is, for both memory models."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """A partition of the KV cache's token slots at one step, plus sharing savings.

    ``total_slots = real_token_slots + internal_fragmentation_slots + reservation_waste_slots
    + cached_free_slots + external_fragmentation_slots + free_slots``.

    - *real tokens*: slots holding the KV of a token (prompt or generated, computed or being
      computed this step). A block shared by several sequences counts once.
    - *internal fragmentation*: unused slots inside allocated blocks (the tail of each
      sequence's last block). Zero for contiguous reservations.
    - *reservation waste*: slots reserved for tokens not generated yet (contiguous only).
    - *cached-free*: free blocks still holding prefix-cache content, reusable on a hit.
    - *external fragmentation*: free slots in holes too small for the reservation of the next
      waiting request (contiguous only; paged memory has none by construction).
    - *free*: the rest.

    ``shared_saved_slots``: slots that sharing (prefix hits, parallel-sampling forks) avoided
    allocating: every reference to a block beyond its first counts one block.
    """

    total_slots: int
    real_token_slots: int
    internal_fragmentation_slots: int
    reservation_waste_slots: int
    cached_free_slots: int
    external_fragmentation_slots: int
    free_slots: int
    shared_saved_slots: int

    def __post_init__(self) -> None:
        parts = (
            self.real_token_slots
            + self.internal_fragmentation_slots
            + self.reservation_waste_slots
            + self.cached_free_slots
            + self.external_fragmentation_slots
            + self.free_slots
        )
        assert parts == self.total_slots, f"snapshot parts {parts} != total {self.total_slots}"

    def __sub__(self, other: MemorySnapshot) -> MemorySnapshot:
        """Field by field: e.g. the last step's snapshot, from the sums with and without it."""
        names = [f.name for f in fields(self)]
        return MemorySnapshot(*(getattr(self, n) - getattr(other, n) for n in names))

    @property
    def used_slots(self) -> int:
        """Slots taken away from the free pool (real + internal + reservation waste)."""
        return (
            self.real_token_slots + self.internal_fragmentation_slots + self.reservation_waste_slots
        )

    @property
    def real_token_fraction_of_used(self) -> float:
        """Share of allocated KV memory that holds real tokens (vLLM paper, Figure 2)."""
        used = self.used_slots
        return self.real_token_slots / used if used else 1.0
