"""Shared-memory buffers the main process lends to DataLoader workers, reused once nothing refers to them.

A worker ships a work item's result as one shared-memory buffer. A fresh buffer per item costs creating a
segment, a page fault per page in the worker (writing) and again in the main process (reading), and unlinking
it: about 3x a copy into memory already mapped (84 vs 26 ms per 127 MB of muons on the bench machine). So the
main process owns a few buffers and lends one with each work item it hands out:

- the worker writes the item's result into the lent buffer if it is big enough (else into a fresh one, as
  before) and sends back only the buffer's slot number: no file descriptor, no new mapping;
- the main process builds every tensor of that result from its own NumPy view of the buffer, so the view's
  reference count says whether any tensor made from it is still alive, wherever a consumer keeps it;
- a buffer is lent again only when its result has come back AND no tensor refers to it: a consumer that keeps
  a batch for as long as it likes never sees it overwritten. A result that never comes back (an abandoned
  epoch) keeps its buffer out of use for good.

Buffers are sized from the results seen (1.25 x the biggest so far); one too small for an item is dropped and
replaced by a bigger one. At most `keep` buffers exist.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Loan:
    """A buffer lent with one work item. Pickled to the worker, `buffer` travels as a file descriptor; the
    worker's torch maps it once as long as the worker keeps a reference (see Borrowed)."""

    slot: int
    buffer: torch.Tensor


@dataclass
class _Slot:
    array: np.ndarray  # the main process's view: the only long-lived reference to it is in _SLOTS
    shared: torch.Tensor
    out: bool = False  # lent, its result not back yet


# slot -> buffer, in the main process (a result names its slot; unpickling it looks the slot up here)
_SLOTS: dict[int, _Slot] = {}
_next_slot = itertools.count()


def returned(slot: int) -> np.ndarray:
    """The main process's view of `slot`, whose result has just come back (called while unpickling it)."""
    entry = _SLOTS[slot]
    entry.out = False
    return entry.array


class LentBuffers:
    """The main process's buffers for one stream (see the module docstring)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._slots: list[int] = []
        self._size = 0  # bytes of a new buffer: 1.25 x the biggest result seen
        self.stats = {"lent": 0, "fitted": 0}

    def _free(self, slot: int) -> bool:
        entry = _SLOTS[slot]
        # references: _SLOTS' entry and getrefcount's argument; any tensor made from the view adds one
        return not entry.out and sys.getrefcount(entry.array) == 2

    def lend(self) -> Loan | None:
        """A free buffer, marked out until its result comes back; None when all are in use (the worker then
        writes into a fresh buffer)."""
        slot = next((s for s in self._slots if self._free(s)), None)
        if slot is None and len(self._slots) < self.keep and self._size:
            shared = torch.empty(self._size, dtype=torch.uint8).share_memory_()
            slot = next(_next_slot)
            _SLOTS[slot] = _Slot(shared.numpy(), shared)
            self._slots.append(slot)
        if slot is None:
            return None
        _SLOTS[slot].out = True
        self.stats["lent"] += 1
        return Loan(slot, _SLOTS[slot].shared)

    def note(self, slot: int, fitted: bool, nbytes: int) -> None:
        """A result of `nbytes` came back for a loan of `slot` (-1: none), written into it or not (too small:
        the buffer is dropped, a bigger one is made at the next lend)."""
        self._size = max(self._size, nbytes + nbytes // 4)
        if slot < 0:
            return
        if fitted:
            self.stats["fitted"] += 1
        elif slot in self._slots:
            self._slots.remove(slot)
            del _SLOTS[slot]  # tensors made from it keep its memory until they go

    def close(self) -> None:
        for slot in self._slots:
            _SLOTS.pop(slot, None)
        self._slots.clear()


class Borrowed:
    """The worker's side: keeps the last buffers it was lent referenced, so that torch maps each only once."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._buffers: dict[int, torch.Tensor] = {}

    def hold(self, loan: Loan) -> torch.Tensor:
        self._buffers.pop(loan.slot, None)
        self._buffers[loan.slot] = loan.buffer
        while len(self._buffers) > self.keep:
            del self._buffers[next(iter(self._buffers))]
        return loan.buffer
