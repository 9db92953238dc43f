"""The global order of one epoch over files read a unit (row group, HDF5 slice) at a time, cut into work items.

The order: files shuffled, units shuffled within each file, consecutive units grouped into chunks of at least
`window` samples, samples shuffled within each chunk (all seeded by (seed, epoch)). It is cut into global
batches of batch_size * world_size; rank r takes the r-th slice of each. A work item is one chunk's share of
this rank's batches: a reader decodes only that chunk's units, so no unit is decoded twice per rank and memory
stays at a few chunks. A batch crossing a chunk boundary is made of pieces from two items, in order.

Nothing here reads a file: the plan needs only the samples per unit of each file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

import numpy as np

from hpctrain.runtime.seeding import CHUNK_EVENTS, EPOCH_UNITS, numpy_rng

if TYPE_CHECKING:
    from hpctrain.data.stream.lent_buffers import Loan

T = TypeVar("T")


class Unit(NamedTuple):
    """One unit of a file in the epoch's order."""

    file: int
    unit: int
    rows: int  # samples in it


class Piece(NamedTuple):
    """Part `part` of `parts` of this rank's batch `batch`: chunk-local positions [lo, hi) of one chunk."""

    batch: int
    part: int
    parts: int
    lo: int
    hi: int


class EpochPlan:
    """The global order of one epoch (deterministic from unit_rows, seed, epoch; cheap: units only)."""

    def __init__(
        self, unit_rows: Sequence[Sequence[int]], seed: int, epoch: int, shuffle: bool, window: int
    ) -> None:
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        rng = numpy_rng(seed, epoch, EPOCH_UNITS)
        n_files = len(unit_rows)
        file_order = rng.permutation(n_files) if shuffle else np.arange(n_files)
        units: list[Unit] = []
        for f in file_order:
            rows = unit_rows[f]
            order = rng.permutation(len(rows)) if shuffle else range(len(rows))
            units += [Unit(int(f), int(u), rows[u]) for u in order if rows[u] > 0]
        # chunks: consecutive units with at least `window` samples (one unit each without shuffling)
        chunks: list[list[Unit]] = []
        size = 0
        for unit in units:
            if not chunks or (size >= window or not shuffle):
                chunks.append([])
                size = 0
            chunks[-1].append(unit)
            size += unit.rows
        self.chunks = chunks
        sizes = np.array([sum(u.rows for u in c) for c in chunks], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])  # (chunks + 1,) global positions
        self.total = int(self.starts[-1])

    def chunk_of(self, position: int) -> int:
        return int(np.searchsorted(self.starts, position, side="right") - 1)

    def chunk_order(self, c: int) -> np.ndarray:
        """(samples of chunk c,) chunk-local sample indices in this epoch's order (units concatenated, then
        shuffled)."""
        n = int(self.starts[c + 1] - self.starts[c])
        return (
            numpy_rng(self.seed, self.epoch, c, CHUNK_EVENTS).permutation(n) if self.shuffle else np.arange(n)
        )

    def files_from(self, chunk: int = 0) -> list[int]:
        """Files in the order their first unit is read, from `chunk` on."""
        return list(dict.fromkeys(u.file for c in self.chunks[chunk:] for u in c))


@dataclass
class WorkItem:
    """One chunk's pieces of this rank's batches, in batch order."""

    epoch: int
    chunk: int
    pieces: list[Piece]
    # staged inputs: file -> local path (a file that could not be: missing)
    paths: dict[int, str] | None = None
    # a buffer for the result, lent by the main process (data/stream/lent_buffers.py)
    loan: Loan | None = None


class PieceSize(NamedTuple):
    """What became of one piece once read: `samples` kept (bad ones dropped), for reassembly in order."""

    batch: int
    part: int
    parts: int
    samples: int


def _batch_parts(starts: list[int], c: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(chunk, chunk-local lo, chunk-local hi) of the global positions [lo, hi), lo < hi, in chunk `c` (that
    of lo) and those after it, in order (chunks are never empty)."""
    parts = []
    while lo < hi:
        end = min(hi, starts[c + 1])
        parts.append((c, lo - starts[c], end - starts[c]))
        lo, c = end, c + 1
    return parts


def work_items(
    plan: EpochPlan, start: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> Iterator[WorkItem]:
    """This rank's work items from global position `start` (items in chunk order, pieces in batch order).

    The batches' bounds and chunks are found for the whole epoch at once (a search per batch cost the main
    process ~15 us per batch); a batch across chunks is cut by `_batch_parts`."""
    g = batch_size * world_size
    n = plan.total
    last = n - (g if drop_last else 1) - start  # batch k is made while k * g <= last
    count = last // g + 1 if last >= 0 else 0
    lo = start + np.arange(count, dtype=np.int64) * g + rank * batch_size
    hi = np.minimum(lo + batch_size, n)
    first = np.searchsorted(plan.starts, np.minimum(lo, n - 1), side="right") - 1
    end = np.searchsorted(plan.starts, np.maximum(hi - 1, lo), side="right") - 1
    starts = plan.starts.tolist()
    current: WorkItem | None = None
    for k, (a, b, c, e) in enumerate(zip(lo.tolist(), hi.tolist(), first.tolist(), end.tolist())):
        if a >= b:  # the rank's slice of a partial last batch is empty: still one (empty) batch
            parts = [(c, 0, 0)]
        elif c == e:  # within one chunk
            parts = [(c, a - starts[c], b - starts[c])]
        else:
            parts = _batch_parts(starts, c, a, b)
        for i, (c, a, b) in enumerate(parts):
            if current is not None and current.chunk != c:
                yield current
                current = None
            if current is None:
                current = WorkItem(plan.epoch, c, [])
            current.pieces.append(Piece(k, i, len(parts), a, b))
    if current is not None:
        yield current


@dataclass
class Reassembly(Generic[T]):
    """Puts batches back together from the pieces of work items, handing each out once complete, in order."""

    pending: dict[int, list[T | None]] = field(default_factory=dict)
    next_batch: int = 0

    def add(self, size: PieceSize, piece: T) -> None:
        self.pending.setdefault(size.batch, [None] * size.parts)[size.part] = piece

    def ready(self) -> Iterator[tuple[int, list[T]]]:
        """(batch number, its pieces in order) of every batch complete now, in batch order."""
        while self.next_batch in self.pending and all(p is not None for p in self.pending[self.next_batch]):
            k = self.next_batch
            self.next_batch += 1
            yield k, self.pending.pop(k)  # type: ignore[misc]  # complete: no None left

    def check_done(self) -> None:
        assert not self.pending, "a batch was left incomplete"
