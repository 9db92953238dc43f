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

A loan travels as five integers. Each buffer is an anonymous memory file (memfd) the main process keeps open;
a worker maps it once, the first time it is lent that buffer, through /proc/<main pid>/fd/<fd>, and keeps the
mapping. The file's inode, in the loan, proves it is that buffer (not another process's file, as /proc of
another pid namespace would give: the worker then writes into a fresh buffer). A torch shared tensor in the
loan would be pickled as a file descriptor: every loan then cost the worker a socket connection to the main
process, an authentication handshake and a wait for the main process's GIL, ~2.4 ms per item, 12% of a
worker's time on the bench files. Where there are no memory files (not Linux) nothing is lent: workers write
into fresh buffers.

Buffers are sized from the results seen (1.25 x the biggest so far); one too small for an item is dropped and
replaced by a bigger one. At most `keep` buffers exist.
"""

from __future__ import annotations

import functools
import itertools
import mmap
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Loan:
    """A buffer lent with one work item: its slot, and where the worker maps it from (the main process's pid
    and its descriptor of the buffer's memory file, whose inode is `inode`) and its size."""

    slot: int
    owner: int
    fd: int
    inode: int
    nbytes: int


@dataclass
class _Slot:
    fd: int
    inode: int
    array: np.ndarray  # the main process's view of the mapping: the only long-lived reference to it is here
    out: bool = False  # lent, its result not back yet

    def drop(self) -> None:
        """Close the descriptor; the memory goes with the last view of it (tensors still made from it)."""
        os.close(self.fd)


# slot -> buffer, in the main process (a result names its slot; unpickling it looks the slot up here)
_SLOTS: dict[int, _Slot] = {}
_next_slot = itertools.count()


def returned(slot: int) -> np.ndarray:
    """The main process's view of `slot`, whose result has just come back (called while unpickling it)."""
    entry = _SLOTS[slot]
    entry.out = False
    return entry.array


def _map(path: str, inode: int, nbytes: int) -> mmap.mmap:
    """The memory file at `path` mapped, if it is the one with `inode` (OSError if not)."""
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_ino != inode:
            raise OSError(f"{path} is not the lent buffer")
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def _new_slot(nbytes: int) -> _Slot:
    fd = os.memfd_create("hpctrain-lent", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        memory = mmap.mmap(fd, nbytes)
    except OSError:
        os.close(fd)
        raise
    return _Slot(fd, os.fstat(fd).st_ino, np.frombuffer(memory, dtype=np.uint8))  # (the view keeps the map)


@functools.cache
def can_lend() -> bool:
    """Whether buffers can be lent here: memory files, and a process reaching one by /proc/<pid>/fd/."""
    if not hasattr(os, "memfd_create"):
        return False
    try:
        slot = _new_slot(mmap.PAGESIZE)
    except OSError:
        return False
    try:
        _map(f"/proc/{os.getpid()}/fd/{slot.fd}", slot.inode, mmap.PAGESIZE).close()
        return True
    except OSError:
        return False
    finally:
        slot.drop()


class LentBuffers:
    """The main process's buffers for one stream (see the module docstring)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep if can_lend() else 0
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
            try:
                made = _new_slot(self._size)
            except OSError:  # out of memory or descriptors: this item's result goes in a fresh buffer
                return None
            slot = next(_next_slot)
            _SLOTS[slot] = made
            self._slots.append(slot)
        if slot is None:
            return None
        entry = _SLOTS[slot]
        entry.out = True
        self.stats["lent"] += 1
        return Loan(slot, os.getpid(), entry.fd, entry.inode, len(entry.array))

    def note(self, slot: int, fitted: bool, nbytes: int) -> None:
        """A result of `nbytes` came back for a loan of `slot` (-1: none), written into it or not (too small:
        the buffer is dropped, a bigger one is made at the next lend; a worker that could not map it wrote
        into a fresh one)."""
        self._size = max(self._size, nbytes + nbytes // 4)
        if slot < 0:
            return
        if fitted:
            self.stats["fitted"] += 1
        elif slot in self._slots and nbytes > len(_SLOTS[slot].array):
            self._slots.remove(slot)
            _SLOTS.pop(slot).drop()  # tensors made from it keep its memory until they go

    def close(self) -> None:
        for slot in self._slots:
            entry = _SLOTS.pop(slot, None)
            if entry is not None:
                entry.drop()
        self._slots.clear()


class Borrowed:
    """The worker's side: the buffers it was lent, each mapped once (the last `keep` stay mapped)."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}

    def hold(self, loan: Loan) -> torch.Tensor | None:
        """The lent buffer, mapped the first time; None if it cannot be (the result then goes in a fresh one)."""
        key = (loan.owner, loan.slot)
        buffer = self._buffers.pop(key, None)
        if buffer is None:
            try:
                memory = _map(f"/proc/{loan.owner}/fd/{loan.fd}", loan.inode, loan.nbytes)
            except OSError:
                return None
            buffer = torch.frombuffer(memory, dtype=torch.uint8)  # keeps the mapping alive
        self._buffers[key] = buffer
        while len(self._buffers) > self.keep:
            del self._buffers[next(iter(self._buffers))]
        return buffer
