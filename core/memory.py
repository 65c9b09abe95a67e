"""Memory accounting snapshot: where every KV token slot is, for both memory models."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, init=False)
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

    # Written out, as ``ScheduledRequest``'s: generated, it cost 7% of a compiled run's
    # instructions (docs/compiled_core.md). Made once a step, and for each run skipped over.
    def __init__(
        self,
        total_slots: int,
        real_token_slots: int,
        internal_fragmentation_slots: int,
        reservation_waste_slots: int,
        cached_free_slots: int,
        external_fragmentation_slots: int,
        free_slots: int,
        shared_saved_slots: int,
    ) -> None:
        parts = (
            real_token_slots
            + internal_fragmentation_slots
            + reservation_waste_slots
            + cached_free_slots
            + external_fragmentation_slots
            + free_slots
        )
        assert parts == total_slots, f"snapshot parts {parts} != total {total_slots}"
        object.__setattr__(self, "total_slots", total_slots)  # (frozen)
        object.__setattr__(self, "real_token_slots", real_token_slots)
        object.__setattr__(self, "internal_fragmentation_slots", internal_fragmentation_slots)
        object.__setattr__(self, "reservation_waste_slots", reservation_waste_slots)
        object.__setattr__(self, "cached_free_slots", cached_free_slots)
        object.__setattr__(self, "external_fragmentation_slots", external_fragmentation_slots)
        object.__setattr__(self, "free_slots", free_slots)
        object.__setattr__(self, "shared_saved_slots", shared_saved_slots)

    def __sub__(self, other: MemorySnapshot) -> MemorySnapshot:
        """Field by field: e.g. the last step's snapshot, from the sums with and without it."""
        return MemorySnapshot(
            self.total_slots - other.total_slots,
            self.real_token_slots - other.real_token_slots,
            self.internal_fragmentation_slots - other.internal_fragmentation_slots,
            self.reservation_waste_slots - other.reservation_waste_slots,
            self.cached_free_slots - other.cached_free_slots,
            self.external_fragmentation_slots - other.external_fragmentation_slots,
            self.free_slots - other.free_slots,
            self.shared_saved_slots - other.shared_saved_slots,
        )

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
