"""What a worker sends back for one work item: its events as ONE batch, cut back into pieces on the main side.

`gather` writes the wanted events into that batch with one copy of the muons: in a DataLoader worker straight
into one shared-memory buffer, the one the main process lent with the work item when it is big enough
(data/stream/lent_buffers.py: shipping it then costs neither a copy nor a new mapping), in the main process into a
recycled buffer (or as views, when the rows are consecutive).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from hpctrain.data.stream import lent_buffers
from hpctrain.data.stream.epoch_plan import PieceSize
from hpctrain.data.stream.ragged import take_ragged, take_rows
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.batch import MuonBatch, from_buffer, packed, packed_size
from hpctrain.workloads.muons.events.event_counts import UnitTally


@dataclass
class ItemResult:
    """All pieces of one work item as ONE batch of events (few tensors to ship from a worker) and the size of
    each piece in order; `pieces()` cuts it back into views.

    When `buffer` is set, every tensor of `events` is a view into it (see batch.packed): pickling (from a
    DataLoader worker) then ships that one buffer, whose shared memory the main process maps without a copy;
    when it is the buffer lent with the item (`in_slot`), only its slot number travels.

    `slot`: the loan that came with the item (-1: none), `in_slot`: whether the events were written into it.
    `proven`: keys of the units whose muons the worker proved fine (decode.py), for the main process to remember:
    workers that are not persistent start each epoch from its copy. `tallies`: each unit decoded, with the events
    removed from it and why (event_counts.py)."""

    events: MuonBatch
    sizes: list[PieceSize]
    tallies: tuple[UnitTally, ...] = ()
    epoch: int = -1
    chunk: int = -1
    buffer: torch.Tensor | None = None
    slot: int = -1
    in_slot: bool = False
    proven: tuple[Any, ...] = ()

    def _head(self) -> tuple[Any, ...]:
        """Everything but the events and their buffer (what `_result` takes back)."""
        return self.sizes, self.tallies, self.epoch, self.chunk, self.slot, self.proven

    def __reduce__(self) -> tuple[Any, ...]:
        shape = (len(self.events), self.events.num_muons)
        if self.in_slot:
            return (_rebuild_lent, (shape, self._head()))
        if self.buffer is None:
            return (_result, (self.events, self._head()))
        return (_rebuild_item, (self.buffer, shape, self._head()))

    def pin_memory(self) -> ItemResult:
        """Page-locked copies (the lent buffer, if any, is free again once this result is dropped)."""
        if self.buffer is None:
            pinned = _result(self.events.pin_memory(), self._head())
        else:
            shape = (len(self.events), self.events.num_muons)
            pinned = _rebuild_item(self.buffer.pin_memory(), shape, self._head())
        pinned.in_slot = self.in_slot
        return pinned

    @property
    def nbytes(self) -> int:
        """Bytes of the one buffer that holds this result's events."""
        return packed_size(len(self.events), self.events.num_muons)

    def pieces(self) -> Iterator[tuple[PieceSize, MuonBatch]]:
        """Each piece's size and events, as views of `events` (its offsets rebased: a new small array). Cut
        with one split per tensor and item, not a slice per piece and tensor (part of the ~15% less
        main-process CPU with 2 workers: docs/performance.md)."""
        ev = self.events
        if not self.sizes:
            return
        samples = [size.samples for size in self.sizes]
        bounds = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(samples, out=bounds[1:])
        offsets = ev.offsets.numpy()  # (events + 1,)
        lo = offsets[bounds]  # (pieces + 1,) each piece's first muon
        # every piece's offsets (its events + 1) back to back, from its own first muon
        spans = np.asarray(samples, dtype=np.int64) + 1
        piece_of = np.repeat(np.arange(len(samples)), spans)
        local = offsets[np.arange(len(piece_of)) - piece_of] - lo[piece_of]
        cut = (  # (split_with_sizes: Tensor.split's Python wrapper costs as much again)
            ev.primaries.split_with_sizes(samples),
            ev.muons.split_with_sizes(np.diff(lo).tolist()),
            ev.counts.split_with_sizes(samples),
            torch.from_numpy(local).split_with_sizes(spans.tolist()),
            ev.ids.split_with_sizes(samples),
            ev.positions.split_with_sizes(samples),
        )
        for size, prim, muons, counts, offs, ids, positions in zip(self.sizes, *cut, strict=True):
            yield size, MuonBatch(prim, muons, counts, offs, ids, positions, ev.normalized)


@dataclass
class ItemError:
    """A UserError met while decoding a work item (maybe in a DataLoader worker), raised on the main side."""

    message: str


def _result(
    events: MuonBatch, head: tuple[Any, ...], buffer: torch.Tensor | None = None, in_slot: bool = False
) -> ItemResult:
    """An ItemResult from its events, `ItemResult._head()` and the buffer the events are views into."""
    sizes, tallies, epoch, chunk, slot, proven = head
    return ItemResult(events, sizes, tallies, epoch, chunk, buffer, slot, in_slot, proven)


def _rebuild_item(buffer: torch.Tensor, shape: tuple[int, int], head: tuple[Any, ...]) -> ItemResult:
    return _result(from_buffer(buffer, *shape), head, buffer)


def _rebuild_lent(shape: tuple[int, int], head: tuple[Any, ...]) -> ItemResult:
    """A result written into the buffer lent with its item, in the main process: every tensor is made from the
    main process's own view of that buffer, whose reference count then tells when it is free again."""
    buffer = torch.from_numpy(lent_buffers.returned(head[4]))  # head[4]: the slot
    nbytes = packed_size(*shape)
    return _result(from_buffer(buffer[:nbytes], *shape), head, buffer, in_slot=True)


class Recycled:
    """Byte buffers for the items of the main process (0 workers), reused once no tensor refers to them.

    Fresh pages cost a page fault each when first written: for a chunk's muons, as long as the gather itself.
    Bounded: at most `keep` buffers are kept; beyond that (batches held elsewhere) new ones are not kept."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._arrays: list[np.ndarray] = []

    def _unused(self, i: int) -> bool:
        # only this list (and getrefcount's argument) refer to it: every view made from it is gone
        return sys.getrefcount(self._arrays[i]) == 2

    def get(self, nbytes: int) -> torch.Tensor:
        free = [i for i in range(len(self._arrays)) if self._unused(i)]
        for i in free:
            if len(self._arrays[i]) >= nbytes:
                return torch.from_numpy(self._arrays[i][:nbytes])
        array = np.empty(nbytes + nbytes // 4, dtype=np.uint8)  # room for a slightly bigger next chunk
        if free:  # replace a free one that was too small
            self._arrays[free[0]] = array
        elif len(self._arrays) < self.keep:
            self._arrays.append(array)
        return torch.from_numpy(array[:nbytes])


def gather(
    data: layouts.Events,
    offsets: np.ndarray,
    row: np.ndarray,
    where: np.ndarray,
    recycled: Recycled,
    lent: torch.Tensor | None = None,
) -> tuple[MuonBatch, torch.Tensor | None, bool]:
    """The events `row` of `data` in that order as one batch (positions `where`), with one copy of the muons
    (`recycled`: the main process's buffers), its buffer (None: its tensors are not all in one), and whether
    that is `lent`.

    In a DataLoader worker the batch is written straight into one shared-memory buffer (`lent`, the buffer lent
    with the item, if big enough). In the main process consecutive rows stay views of the decoded arrays; in
    another order the muons are gathered into a buffer of their own (take_ragged's: no second copy) and the
    rest into a recycled one."""
    shared = get_worker_info() is not None
    n = len(row)
    contiguous = n > 0 and int(row[-1] - row[0]) == n - 1 and bool(np.all(row[1:] > row[:-1]))
    if contiguous and not shared:  # no shuffling: views, no copy
        a, b = int(row[0]), int(row[-1]) + 1
        views = (data.primaries[a:b], data.muons[offsets[a] : offsets[b]], data.counts[a:b], data.ids[a:b])
        return MuonBatch.from_numpy(*views, where), None, False
    counts = data.counts[row]  # (n,)
    m = int(counts.sum())
    in_lent = shared and lent is not None and lent.numel() >= packed_size(n, m)
    buffer: torch.Tensor | None
    if in_lent:
        buffer, batch = packed(n, m, buffer=lent)
    elif shared:
        buffer, batch = packed(n, m, shared=True)
    else:  # in the main process: the muons in take_ragged's own buffer, the rest packed without them
        _, batch = packed(n, 0, buffer=recycled.get(packed_size(n, 0)))
        muons = torch.from_numpy(take_ragged(data.muons, offsets, row).reshape(m, 3))
        buffer, batch = None, dataclasses.replace(batch, muons=muons)
    batch.counts.numpy()[:] = counts
    batch.offsets[0] = 0
    np.cumsum(counts, out=batch.offsets.numpy()[1:])
    take_rows(data.primaries, row, out=batch.primaries.numpy())
    take_rows(data.ids, row, out=batch.ids.numpy())
    batch.positions.numpy()[:] = where
    if buffer is not None:  # (else gathered above)
        muons_out = batch.muons.numpy()
        if contiguous:
            muons_out[:] = data.muons[offsets[row[0]] : offsets[row[-1] + 1]]
        else:
            take_ragged(data.muons, offsets, row, muons_out)
    return batch, buffer, in_lent
