"""The runner's inputs kept between steps, as vLLM v1's ``InputBatch``/``BlockTable``: every
sequence's block table as one row of a host array, changed only where a batch names a new
table (``ScheduledBatch.block_tables``), and the step's input buffers at fixed addresses,
filled with numpy and copied to the device once per buffer per step (``StepBuffers``).

On CUDA the host buffers are pinned and copied with ``non_blocking``: the step that filled
them always ends in a synchronisation (its sampled tokens, or an explicit one), so the next
step's host writes never race a copy still in flight.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch


class UnknownSequenceError(KeyError):
    """A step runs a sequence whose block table no batch has named."""


class BlockTables:
    """Block tables of every sequence the runner has seen, one int32 row each
    ``[max_blocks_per_seq]``; entries past a table's end hold stale block ids (never read:
    attention stops at each sequence's length)."""

    def __init__(self, max_blocks_per_seq: int, num_rows: int = 64) -> None:
        if max_blocks_per_seq < 1 or num_rows < 1:
            raise ValueError(
                f"max_blocks_per_seq and num_rows must be >= 1, got {max_blocks_per_seq!r} "
                f"and {num_rows!r}"
            )
        self.array = np.zeros((num_rows, max_blocks_per_seq), dtype=np.int32)
        self._rows: dict[int, int] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))

    @property
    def max_blocks_per_seq(self) -> int:
        return int(self.array.shape[1])

    @property
    def num_sequences(self) -> int:
        return len(self._rows)

    def update(self, tables: Mapping[int, Sequence[int]]) -> None:
        """Replace the tables of the named sequences (new ones get a row)."""
        width = self.max_blocks_per_seq
        for seq_id, table in tables.items():
            if len(table) > width:
                raise ValueError(
                    f"sequence {seq_id} holds {len(table)} blocks, more than the "
                    f"{width} its model length allows"
                )
            row = self._rows.get(seq_id)
            if row is None:
                row = self._rows[seq_id] = self._take_row()
            self.array[row, : len(table)] = table

    def row(self, seq_id: int) -> int:
        row = self._rows.get(seq_id)
        if row is None:
            raise UnknownSequenceError(
                f"sequence {seq_id} runs, but no batch has named its block table (a scheduler "
                "without record_block_tables?)"
            )
        return row

    def forget(self, seq_ids: Iterable[int]) -> None:
        """Free the rows of sequences that will not run again."""
        for seq_id in seq_ids:
            row = self._rows.pop(seq_id, None)
            if row is not None:
                self._free_rows.append(row)

    def _take_row(self) -> int:
        if not self._free_rows:
            grown = np.zeros_like(self.array, shape=(2 * len(self.array), self.array.shape[1]))
            grown[: len(self.array)] = self.array
            self._free_rows = list(range(len(grown) - 1, len(self.array) - 1, -1))
            self.array = grown
        return self._free_rows.pop()


class CpuGpuBuffer:
    """One input kept between steps: a host tensor (pinned on CUDA) with its numpy view, and
    the device tensor it is copied to (on CPU the host tensor itself: nothing is copied)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=on_cuda)
        self.np: np.ndarray = self.host.numpy()
        self.device = torch.zeros(shape, dtype=dtype, device=device) if on_cuda else self.host
        self._copies = on_cuda

    def upload(self, num_rows: int) -> torch.Tensor:
        """Copy the first ``num_rows`` rows to the device (not waiting); their device view."""
        view = self.device[:num_rows]
        if self._copies:
            view.copy_(self.host[:num_rows], non_blocking=True)
        return view


# name -> (dtype, whether rows are block tables [rows, max_blocks], extra rows)
_BUFFERS: dict[str, tuple[torch.dtype, bool, int]] = {
    "input_ids": (torch.int64, False, 0),
    "positions": (torch.int64, False, 0),
    "slot_mapping": (torch.int64, False, 0),
    "logits_indices": (torch.int64, False, 0),
    "decode_seq_lens": (torch.int32, False, 0),
    "decode_block_tables": (torch.int32, True, 0),
    "prefill_block_tables": (torch.int32, True, 0),
    "prefill_query_start_loc": (torch.int32, False, 1),
    "prefill_seq_lens": (torch.int32, False, 0),
    "prefill_context_lens": (torch.int32, False, 0),
}


class StepBuffers:
    """The step's named input buffers (``_BUFFERS``), grown when a step needs more rows (a
    grown buffer has new addresses: CUDA graphs keep buffers of their own)."""

    def __init__(self, max_blocks_per_seq: int, device: torch.device, num_rows: int = 256):
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = device
        self.buffers: dict[str, CpuGpuBuffer] = {}
        for name in _BUFFERS:
            self._allocate(name, num_rows)

    def _allocate(self, name: str, num_rows: int) -> None:
        dtype, is_table, extra = _BUFFERS[name]
        shape = (num_rows + extra, self.max_blocks_per_seq) if is_table else (num_rows + extra,)
        self.buffers[name] = CpuGpuBuffer(shape, dtype, self.device)

    def host(self, name: str, num_rows: int) -> np.ndarray:
        """The host rows ``[:num_rows]`` of buffer ``name`` to fill (grown if needed)."""
        buffer = self.buffers[name]
        if len(buffer.np) < num_rows:
            self._allocate(name, max(num_rows, 2 * len(buffer.np)))
            buffer = self.buffers[name]
        return buffer.np[:num_rows]

    def upload(self, name: str, host: np.ndarray) -> torch.Tensor:
        """Copy ``host`` (rows of ``self.host(name, ...)``) to the device; its device view."""
        buffer = self.buffers[name]
        assert host.base is buffer.np, f"{name}: not this buffer's host rows"
        return buffer.upload(len(host))
