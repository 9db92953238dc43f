"""EventStream: muon-bundle batches from Parquet/HDF5 files, sharded over ranks and workers, resumable.

The epoch's global order: files shuffled, row groups ("units") shuffled within each file, consecutive units
grouped into chunks of at least `shuffle_window` events, events shuffled within each chunk (all seeded by
(seed, epoch)). The order is cut into global batches of batch_size * world_size; rank r takes the r-th slice.
A work item is one chunk's share of this rank's batches: the main process (sampler) hands items to the
DataLoader workers, each worker decodes only that chunk's units, so no row group is decoded twice per rank and
memory stays at a few chunks per worker. A batch crossing a chunk boundary is assembled from its pieces in
order. The position (epoch, events of the epoch consumed by all ranks) is counted where batches are handed
out.

Remote inputs (pelican://, osdf:///, https://): the index comes from their metadata read remotely (see
staged.py); the sampler stages the files of each work item just before handing it to a worker, `ahead` files
in advance in reading order, and releases them once the item's result is back and no later chunk needs them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from hpctrain.data.fingerprint import FileList, check_resume
from hpctrain.data.loader import seed_worker
from hpctrain.data.ragged import gather_ragged, take_rows
from hpctrain.data.remote import is_remote
from hpctrain.errors import UserError
from hpctrain.runtime.budget import check_stop
from hpctrain.workloads.muons import layouts, physics
from hpctrain.workloads.muons.batch import MuonBatch, from_buffer, packed, packed_size
from hpctrain.workloads.muons.staged import FileMeta, StagedFiles, StagingSpec, remote_index

log = logging.getLogger("hpctrain.muons")


# ---- the index of files and units, and the epoch's order ---------------------------------------------------


@dataclass
class EventIndex:
    """Files that opened, their layouts and events per unit (row group or HDF5 slice)."""

    files: list[str]
    layouts: list[str]
    unit_rows: list[list[int]]
    # per file: the units the file must still have when read (a remote file's index came from its metadata)
    expected_rows: list[list[int] | None] = field(default_factory=list)
    # per file: bytes and events (before data.max_events): what a checkpoint's fingerprint compares
    sizes: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    remote: list[bool] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(sum(rows) for rows in self.unit_rows)

    def file_list(self) -> FileList:
        return FileList(list(self.files), list(self.sizes), list(self.events))

    def add(self, path: str, layout: str, unit_rows: list[int], size: int, remote: bool) -> None:
        self.files.append(path)
        self.layouts.append(layout)
        self.unit_rows.append(list(unit_rows))
        self.expected_rows.append(list(unit_rows))
        self.remote.append(remote)
        self.sizes.append(size)
        self.events.append(sum(unit_rows))


def note_bad_file(run_dir: str | None, path: str, reason: str) -> None:
    """Append `path<TAB>reason` to <run_dir>/bad_files.txt (once per path)."""
    log.warning("skipping bad file %s: %s", path, reason)
    if run_dir is None:
        return
    target = Path(run_dir) / "bad_files.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and any(line.split("\t")[0] == path for line in target.read_text().splitlines()):
        return
    with open(target, "a") as fh:  # O_APPEND: short lines from several processes do not interleave
        fh.write(f"{path}\t{reason.splitlines()[0] if reason else ''}\n")


def build_index(
    files: Sequence[str],
    on_bad_file: str = "fail",
    run_dir: str | None = None,
    max_events: int = 0,
    hdf5_unit_events: int = 65536,
    report: bool = True,
    staging: StagingSpec | None = None,
) -> EventIndex:
    """Open every file's metadata once. A missing path always fails; a corrupt file fails or is skipped
    (on_bad_file); a file without events is skipped with a warning. Errors are one-line UserErrors.

    Remote files are not downloaded: their footers are read remotely (or taken from the run folder's cache)."""
    index = EventIndex([], [], [])
    metas: dict[str, FileMeta | BaseException] = {}
    if any(is_remote(f) for f in files):
        metas = remote_index(files, staging or StagingSpec(), hdf5_unit_events, run_dir, write_cache=report)
    empty: list[str] = []
    for path in files:
        if path in metas:
            meta = metas[path]
            if isinstance(meta, BaseException):
                if on_bad_file != "skip":
                    raise UserError(f"{meta}; set data.on_bad_file=skip to go on without this file") from None
                note_bad_file(run_dir if report else None, path, str(getattr(meta, "reason", meta)))
            elif sum(meta.unit_rows) == 0:
                empty.append(path)
            else:
                index.add(path, meta.layout, meta.unit_rows, meta.size, remote=True)
            continue
        try:
            reader = layouts.open_reader(path, hdf5_unit_events)
        except layouts.MissingFileError:
            raise  # listed a moment ago: gone now (a volume unmounted?); never skipped
        except (layouts.UnreadableFileError, layouts.LayoutError) as err:  # no permission, corrupt, foreign
            if on_bad_file != "skip":
                raise UserError(f"{err}; set data.on_bad_file=skip to go on without it") from None
            note_bad_file(run_dir if report else None, path, str(err).removeprefix(f"{path}: "))
            continue
        rows = list(reader.unit_rows)
        reader.close()
        if sum(rows) == 0:
            empty.append(path)
            continue
        index.add(path, reader.layout, rows, os.path.getsize(path), remote=False)
    if empty and report:
        shown = ", ".join(empty[:3]) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
        log.warning("skipping %d file(s) without events: %s", len(empty), shown)
    if max_events:
        left = max_events
        for rows in index.unit_rows:
            for j, n in enumerate(rows):
                rows[j] = min(n, left)
                left -= rows[j]
    if index.total == 0:
        raise UserError(
            f"no events in the {len(files)} data file(s) ({len(index.files)} readable, {len(empty)} empty): "
            f"check data.paths"
        )
    return index


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng([k & 0xFFFFFFFF for k in keys])


class EpochPlan:
    """The global order of one epoch (deterministic from index, seed, epoch; cheap: units only)."""

    def __init__(self, index: EventIndex, seed: int, epoch: int, shuffle: bool, window: int) -> None:
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        rng = _rng(seed, epoch, 17)
        file_order = rng.permutation(len(index.files)) if shuffle else np.arange(len(index.files))
        units: list[tuple[int, int, int]] = []  # (file, unit, rows)
        for f in file_order:
            rows = index.unit_rows[f]
            order = rng.permutation(len(rows)) if shuffle else range(len(rows))
            units += [(int(f), int(u), rows[u]) for u in order if rows[u] > 0]
        # chunks: consecutive units with at least `window` events (one unit each without shuffling)
        chunks: list[list[tuple[int, int, int]]] = []
        size = 0
        for unit in units:
            if not chunks or (size >= window or not shuffle):
                chunks.append([])
                size = 0
            chunks[-1].append(unit)
            size += unit[2]
        self.chunks = chunks
        sizes = np.array([sum(u[2] for u in c) for c in chunks], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])  # (chunks + 1,) global positions
        self.total = int(self.starts[-1])

    def chunk_of(self, position: int) -> int:
        return int(np.searchsorted(self.starts, position, side="right") - 1)

    def chunk_order(self, c: int) -> np.ndarray:
        """Chunk-local event indices in this epoch's order (units concatenated, then shuffled)."""
        n = int(self.starts[c + 1] - self.starts[c])
        return _rng(self.seed, self.epoch, c, 29).permutation(n) if self.shuffle else np.arange(n)


@dataclass
class WorkItem:
    """One chunk's pieces of this rank's batches: (batch k, part, parts, lo, hi) in chunk-local positions."""

    epoch: int
    chunk: int
    pieces: list[tuple[int, int, int, int, int]]
    paths: dict[int, str] | None = None  # staged inputs: file -> local path (a bad file is missing)


@dataclass
class ItemResult:
    """All pieces of one work item as ONE batch of events (few tensors to ship from a worker) and the pieces
    as (batch k, part, parts, events) in order; `pieces()` cuts it back into views.

    When `buffer` is set, every tensor of `events` is a view into it (see batch.packed): pickling (from a
    DataLoader worker) then ships that one buffer, whose shared memory the main process maps without a copy."""

    events: MuonBatch
    sizes: list[tuple[int, int, int, int]]
    stats: dict[str, int] = field(default_factory=dict)
    epoch: int = -1
    chunk: int = -1
    buffer: torch.Tensor | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        if self.buffer is None:
            return (ItemResult, (self.events, self.sizes, self.stats, self.epoch, self.chunk))
        shape = (len(self.events), self.events.num_muons)
        return (_rebuild_item, (self.buffer, shape, self.sizes, self.stats, self.epoch, self.chunk))

    def pin_memory(self) -> ItemResult:
        if self.buffer is None:
            return ItemResult(self.events.pin_memory(), self.sizes, self.stats, self.epoch, self.chunk)
        shape = (len(self.events), self.events.num_muons)
        return _rebuild_item(self.buffer.pin_memory(), shape, self.sizes, self.stats, self.epoch, self.chunk)

    def pieces(self) -> Iterator[tuple[int, int, int, MuonBatch]]:
        ev = self.events
        offsets = ev.offsets.numpy()  # (events + 1,) read through NumPy: tensor indexing costs µs per call
        start = 0
        for k, part, nparts, n in self.sizes:
            stop = start + n
            lo, hi = int(offsets[start]), int(offsets[stop])
            piece = MuonBatch(
                ev.primaries[start:stop],
                ev.muons[lo:hi],
                ev.counts[start:stop],
                torch.from_numpy(offsets[start : stop + 1] - lo),
                ev.ids[start:stop],
                ev.positions[start:stop],
                ev.normalized,
            )
            yield k, part, nparts, piece
            start = stop


@dataclass
class ItemError:
    """A UserError met while decoding a work item (maybe in a DataLoader worker), raised on the main side."""

    message: str


def _rebuild_item(
    buffer: torch.Tensor,
    shape: tuple[int, int],
    sizes: list[tuple[int, int, int, int]],
    stats: dict[str, int],
    epoch: int,
    chunk: int,
) -> ItemResult:
    return ItemResult(from_buffer(buffer, *shape), sizes, stats, epoch, chunk, buffer)


def work_items(
    plan: EpochPlan, start: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> Iterator[WorkItem]:
    """This rank's work items from global position `start` (items in chunk order, pieces in batch order)."""
    g = batch_size * world_size
    n = plan.total
    k = 0
    current: WorkItem | None = None
    while start + k * g + (g if drop_last else 1) <= n:
        lo = start + k * g + rank * batch_size
        hi = min(lo + batch_size, n)
        parts = []
        pos = lo
        while pos < hi:
            c = plan.chunk_of(pos)
            end = min(hi, int(plan.starts[c + 1]))
            parts.append((c, pos - int(plan.starts[c]), end - int(plan.starts[c])))
            pos = end
        if not parts:  # the rank's slice of a partial last batch is empty: still one (empty) batch
            c = plan.chunk_of(min(lo, n - 1))
            parts.append((c, 0, 0))
        for i, (c, a, b) in enumerate(parts):
            if current is not None and current.chunk != c:
                yield current
                current = None
            if current is None:
                current = WorkItem(plan.epoch, c, [])
            current.pieces.append((k, i, len(parts), a, b))
        k += 1
    if current is not None:
        yield current


# ---- the worker side: decoding a chunk ---------------------------------------------------------------------


@dataclass
class ReadOptions:
    max_muons_per_event: int = 0
    drop_empty_events: bool = False
    on_bad_event: str = "fail"
    on_bad_file: str = "fail"
    outliers_dir: str | None = None
    run_dir: str | None = None
    hdf5_unit_events: int = 65536
    rank: int = 0


class ChunkDataset(Dataset[ItemResult]):
    """Map-style data set whose 'index' is a WorkItem; decodes the chunk's units it needs."""

    def __init__(self, index: EventIndex, seed: int, shuffle: bool, window: int, opts: ReadOptions) -> None:
        self.index, self.seed, self.shuffle, self.window, self.opts = index, seed, shuffle, window, opts
        self._plan: EpochPlan | None = None
        self._readers: OrderedDict[int, layouts.Reader] = OrderedDict()
        self._paths: dict[int, str] | None = None  # the current item's staged paths
        self._outlier_seq = 0
        self._scratch = np.empty(0, dtype=np.int64)
        self._recycled = _Recycled()

    def __len__(self) -> int:
        return self.index.total

    def plan(self, epoch: int) -> EpochPlan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = EpochPlan(self.index, self.seed, epoch, self.shuffle, self.window)
        return self._plan

    def _reader(self, f: int) -> layouts.Reader:
        if f in self._readers:
            self._readers.move_to_end(f)
            return self._readers[f]
        path = self.index.files[f] if self._paths is None else self._paths[f]
        reader = layouts.open_reader(path, self.opts.hdf5_unit_events)
        expected = self.index.expected_rows[f] if self.index.expected_rows else None
        if expected is not None and list(reader.unit_rows) != expected:
            reader.close()
            remote = bool(self.index.remote and self.index.remote[f])
            raise layouts.UnreadableFileError(
                self.index.files[f],
                f"changed since the run indexed it (units of {list(reader.unit_rows)} events, the index "
                + (
                    f"{expected}; cached in <run folder>/data_index/: delete it)"
                    if remote
                    else f"{expected})"
                ),
            )
        self._readers[f] = reader
        while len(self._readers) > 4:  # bounded: a few open files per worker
            self._readers.popitem(last=False)[1].close()
        return reader

    def _read(self, f: int, u: int, rows: int, stats: dict[str, int]) -> layouts.Events | None:
        if self._paths is not None and f not in self._paths:  # could not be staged: noted by the sampler
            stats["bad_file_events"] = stats.get("bad_file_events", 0) + rows
            return None
        try:
            events = self._load(f, u)
        except Exception as err:  # a corrupt row group, a file gone or changed: many types (see layouts)
            path = self.index.files[f]  # the URI of a staged file, not its copy on scratch
            local = path if self._paths is None else self._paths.get(f, path)
            if isinstance(err, layouts.UnreadableFileError):
                reason = err.reason
            elif isinstance(err, layouts.LayoutError):
                reason = str(err).removeprefix(f"{local}: ")
            else:
                reason = f"unit {u} cannot be read ({layouts.one_line(err)})"
            if self.opts.on_bad_file != "skip":
                raise UserError(f"{path}: {reason}; set data.on_bad_file=skip to go on without it") from None
            note_bad_file(self.opts.run_dir, path, reason)
            stats["bad_file_events"] = stats.get("bad_file_events", 0) + rows
            return None
        if len(events) > rows:  # data.max_events cut this unit
            off = events.offsets
            events = layouts.Events(
                events.primaries[:rows], events.muons[: off[rows]], events.counts[:rows], events.ids[:rows]
            )
        return events

    def _locate(self, item: WorkItem) -> tuple[Any, ...]:
        """(plan, units, unit_starts, lo, hi, wanted, where, unit) of an item: the chunk-local events it wants
        in batch order, their chunk-local positions, and the unit (index into `units`) of each."""
        plan = self.plan(item.epoch)
        units = plan.chunks[item.chunk]
        order = plan.chunk_order(item.chunk)
        unit_starts = np.concatenate([[0], np.cumsum([u[2] for u in units])])
        lo = np.array([p[3] for p in item.pieces], dtype=np.int64)  # (pieces,) chunk-local positions
        hi = np.array([p[4] for p in item.pieces], dtype=np.int64)
        if np.array_equal(lo[1:], hi[:-1]):  # back to back (one rank): one slice of the order
            wanted, where = order[lo[0] : hi[-1]], np.arange(lo[0], hi[-1], dtype=np.int64)
        else:
            wanted = np.concatenate([order[a:b] for a, b in zip(lo, hi)])
            where = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo, hi)])
        wanted = wanted.astype(np.int64, copy=False)  # (events,) chunk-local events in batch order
        unit = np.searchsorted(unit_starts, wanted, side="right") - 1
        return plan, units, unit_starts, lo, hi, wanted, where, unit

    def _load(self, f: int, u: int) -> layouts.Events:
        return self._reader(f).read_unit(u)

    def close(self) -> None:
        """Close the open files."""
        while self._readers:
            self._readers.popitem()[1].close()

    def __getitem__(self, item: WorkItem) -> ItemResult | ItemError:  # type: ignore[override]
        try:
            return self._item(item)
        except (
            UserError
        ) as err:  # raised again on the main side: a worker's exception would carry its traceback
            return ItemError(str(err))

    def _item(self, item: WorkItem) -> ItemResult:
        if item.paths is not None:
            # staged files are deleted after use: hold only this item's files open (an open deleted file
            # would keep its scratch space)
            self._paths = item.paths
            for f in [f for f in self._readers if f not in item.paths]:
                self._readers.pop(f).close()
        plan, units, unit_starts, lo, hi, wanted, where, unit = self._locate(item)
        stats: dict[str, int] = {}
        data, base, sources = self._decode(units, np.unique(unit), stats)
        offsets = data.offsets
        keep_all = self._filter(data, offsets, units, unit_starts, base, sources, item, stats)
        # `row`: each wanted event's row in the decoded concatenation (dropped: unit unreadable or filtered)
        row = base[unit] + (wanted - unit_starts[unit])
        ok = base[unit] >= 0
        ok[ok] &= keep_all[row[ok]]
        kept = np.concatenate([[0], np.cumsum(ok)])
        ends = np.cumsum(hi - lo)
        n_kept = kept[ends] - kept[ends - (hi - lo)]
        sizes = [(k, part, nparts, int(n)) for (k, part, nparts, _, _), n in zip(item.pieces, n_kept)]
        if not ok.all():
            row, where = row[ok], where[ok]
        muons = int(data.counts[row].sum()) if len(row) else 0
        if len(self._scratch) < muons:  # room for the muon indices of the gather, kept between items
            self._scratch = np.empty(muons + muons // 4, dtype=np.int64)
        events, buffer = _gather(
            data, offsets, row, where + int(plan.starts[item.chunk]), self._scratch, self._recycled
        )
        return ItemResult(events, sizes, stats, item.epoch, item.chunk, buffer)

    def _decode(
        self, units: list[tuple[int, int, int]], need: np.ndarray, stats: dict[str, int]
    ) -> tuple[layouts.Events, np.ndarray, list[tuple[int, int]]]:
        """The needed units decoded and concatenated, each unit's first row in it (-1: not readable) and the
        (file, unit) of each part."""
        parts, sources = [], []
        base = np.full(len(units), -1, dtype=np.int64)
        rows_so_far = 0
        for j in need:
            f, u, rows = units[j]
            unit_events = self._read(f, u, rows, stats)
            if unit_events is None:
                continue
            base[j] = rows_so_far
            rows_so_far += len(unit_events)
            parts.append(unit_events)
            sources.append((f, u))
        return layouts.concat_events(parts), base, sources

    def _filter(
        self,
        data: layouts.Events,
        offsets: np.ndarray,
        units: list[tuple[int, int, int]],
        unit_starts: np.ndarray,
        base: np.ndarray,
        sources: list[tuple[int, int]],
        item: WorkItem,
        stats: dict[str, int],
    ) -> np.ndarray:
        """(events,) bool: events kept after the bad-event, outlier and empty-event rules."""
        opts = self.opts
        keep = np.ones(len(data), dtype=bool)
        # Fast path: a float32 sum is finite only if every value is (an overflow just takes the exact path)
        # and a positive minimum energy proves all positive; then only the primaries need checking.
        muons = data.muons
        if len(muons) and np.isfinite(muons.sum()) and muons[:, 0].min() > 0:
            muons = muons[:0]
        bad = physics.bad_events(data.primaries, muons, offsets)
        if bad.any():
            if opts.on_bad_event != "skip":
                first = int(np.flatnonzero(bad)[0])
                path, row = self._source(first, base, units, sources)
                raise UserError(
                    f"{path}: event at row {row} has a zero, negative or non-finite energy/mass or value "
                    f"(primary {data.primaries[first].tolist()}); set data.on_bad_event=skip to skip such "
                    f"events"
                )
            keep &= ~bad
            stats["bad_events"] = int(bad.sum())
        cap = opts.max_muons_per_event
        if cap:
            big = keep & (data.counts > cap)
            if big.any():
                keep &= ~big
                stats["outliers"] = int(big.sum())
                if opts.outliers_dir and item.epoch == 0:  # once: later epochs would only repeat them
                    self._write_outliers(data, offsets, np.flatnonzero(big), base, units, sources)
        if opts.drop_empty_events:
            empty = keep & (data.counts == 0)
            keep &= ~empty
            stats["empty_dropped"] = int(empty.sum())
        return keep

    def _source(
        self, row: int, base: np.ndarray, units: list[tuple[int, int, int]], sources: list[tuple[int, int]]
    ) -> tuple[str, int]:
        """(file, row in file) of a row of the decoded concatenation."""
        starts = [int(base[j]) for j in range(len(units)) if base[j] >= 0]
        i = int(np.searchsorted(starts, row, side="right") - 1)
        f, u = sources[i]
        before = (
            sum(self.index.unit_rows[f][:u])
            if self.index.layouts[f] != "hdf5"
            else u * self.opts.hdf5_unit_events
        )
        return self.index.files[f], before + row - starts[i]

    def _write_outliers(
        self,
        data: layouts.Events,
        offsets: np.ndarray,
        rows: np.ndarray,
        base: np.ndarray,
        units: list[tuple[int, int, int]],
        sources: list[tuple[int, int]],
    ) -> None:
        muon_rows, counts = gather_ragged(offsets, rows)
        events = layouts.Events(data.primaries[rows], data.muons[muon_rows], counts, data.ids[rows])
        table = layouts.events_table(events, "parquet")
        where = [self._source(int(r), base, units, sources) for r in rows]  # few rows: outliers are rare
        table = table.append_column("source_file", pa.array([w[0] for w in where], pa.string()))
        table = table.append_column("source_row", pa.array([w[1] for w in where], pa.int64()))
        write_unique(Path(self.opts.outliers_dir or "."), f"outliers-r{self.opts.rank}", table)


class _Recycled:
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


def _gather(
    data: layouts.Events,
    offsets: np.ndarray,
    row: np.ndarray,
    where: np.ndarray,
    scratch: np.ndarray,
    recycled: _Recycled,
) -> tuple[MuonBatch, torch.Tensor | None]:
    """The events `row` of `data` in that order as one batch (positions `where`), with one copy of the muons
    (`scratch`: int64 room for the muon indices, see gather_ragged; `recycled`: the main process's buffers).

    In a DataLoader worker the batch is written straight into one shared-memory buffer (shipping it then
    costs no further copy); in the main process consecutive rows stay views of the decoded arrays."""
    shared = get_worker_info() is not None
    n = len(row)
    contiguous = n > 0 and int(row[-1] - row[0]) == n - 1 and bool(np.all(row[1:] > row[:-1]))
    if contiguous and not shared:  # no shuffling: views, no copy
        a, b = int(row[0]), int(row[-1]) + 1
        views = (data.primaries[a:b], data.muons[offsets[a] : offsets[b]], data.counts[a:b], data.ids[a:b])
        return MuonBatch.from_numpy(*views, where), None
    counts = data.counts[row]  # (n,)
    m = int(counts.sum())
    buffer, batch = (
        packed(n, m, shared=True) if shared else packed(n, m, buffer=recycled.get(packed_size(n, m)))
    )
    batch.counts.numpy()[:] = counts
    batch.offsets[0] = 0
    np.cumsum(counts, out=batch.offsets.numpy()[1:])
    take_rows(data.primaries, row, out=batch.primaries.numpy())
    take_rows(data.ids, row, out=batch.ids.numpy())
    batch.positions.numpy()[:] = where
    if contiguous:
        batch.muons.numpy()[:] = data.muons[offsets[row[0]] : offsets[row[-1] + 1]]
    else:
        take_rows(data.muons, gather_ragged(offsets, row, scratch)[0], out=batch.muons.numpy())
    return batch, buffer


def write_unique(folder: Path, prefix: str, table: pa.Table) -> Path:
    """Write `table` to a new file in `folder` whose name no earlier run used (reserved with O_EXCL)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    host = socket.gethostname().split(".")[0]
    for seq in range(100_000):
        target = folder / f"{prefix}-{stamp}-{host}-p{os.getpid()}-{seq:05d}.parquet"
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        tmp = folder / f".{target.name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, target)
        return target
    raise RuntimeError(f"{folder}: no free outlier file name")


# ---- the main side: sampler, stream ------------------------------------------------------------------------


class _Items(Sampler[WorkItem]):
    """Runs in the main process: this rank's work items from the stream's current position."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[WorkItem]:
        s = self.stream
        plan = s._dataset.plan(s._start_epoch)
        items = work_items(plan, s._start_position, s.batch_size, s.rank, s.world_size, s.drop_last)
        return items if s._staged is None else s._stage_items(plan, items)


def _identity(x: Any) -> Any:
    return x


def _init_worker(worker_id: int) -> None:
    seed_worker(worker_id)
    torch.set_num_threads(1)  # decoding is NumPy/Arrow work; torch threads would only compete
    pa.set_cpu_count(1)  # one core per worker: Arrow's decode threads would compete with the other workers


class EventStream:
    """Endless batches of MuonBatch (BatchStream protocol); see the module docstring for the order."""

    def __init__(
        self,
        files: Sequence[str],
        batch_size: int,
        seed: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        pin_memory: bool = False,
        shuffle: bool = True,
        shuffle_window: int = 8192,
        prefetch_batches: int = 0,
        max_muons_per_event: int = 0,
        outliers_dir: str | None = None,
        drop_empty_events: bool = False,
        on_bad_file: str = "fail",
        on_bad_event: str = "fail",
        max_events: int = 0,
        run_dir: str | os.PathLike[str] | None = None,
        hdf5_unit_events: int = 65536,
        drop_last: bool = True,
        on_close: Callable[[], None] | None = None,
        staging: StagingSpec | None = None,
        allow_changed_files: bool = False,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        for name, value in (("on_bad_file", on_bad_file), ("on_bad_event", on_bad_event)):
            if value not in ("fail", "skip"):
                raise ValueError(f"data.{name} must be 'fail' or 'skip', not {value!r}")
        run = str(run_dir) if run_dir is not None else None
        self.index = build_index(
            list(files), on_bad_file, run, max_events, hdf5_unit_events, report=rank == 0, staging=staging
        )
        # remote inputs: staged along the order by the sampler (local files in the list pass through)
        self._staged = (
            StagedFiles(self.index.files, staging or StagingSpec())
            if any(is_remote(f) for f in self.index.files)
            else None
        )
        self.on_bad_file, self.run_dir = on_bad_file, run
        # The file list's state, built again only when the index changes: state_dict() runs every update.
        self._files_state: tuple[tuple[int, int], dict[str, Any]] | None = None
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.drop_last, self.prefetch_batches = drop_last, prefetch_batches
        if drop_last and self.index.total < batch_size * world_size:
            raise UserError(
                f"the training files hold {self.index.total} events"
                + (f" (data.max_events={max_events})" if max_events else "")
                + f", fewer than one global batch of {batch_size * world_size} (data.batch_size={batch_size} x "
                f"{world_size} ranks): lower data.batch_size to at most {self.index.total // world_size} or add files"
            )
        self.allow_changed_files = allow_changed_files
        opts = ReadOptions(
            max_muons_per_event,
            drop_empty_events,
            on_bad_event,
            on_bad_file,
            outliers_dir,
            run,
            hdf5_unit_events,
            rank,
        )
        self._dataset = ChunkDataset(self.index, seed, shuffle, max(shuffle_window, 1), opts)
        self._generator = torch.Generator()
        self._seed, self._rank = seed, rank
        self.epoch = 0
        self.position = 0
        self._start_epoch = 0
        self._start_position = 0
        self.stats: dict[str, int] = {}
        self._warned: dict[str, int] = {}
        self._prefetcher: _Prefetcher | None = None
        self._on_close = on_close
        self._loader = DataLoader(
            self._dataset,
            sampler=_Items(self),
            batch_size=None,
            collate_fn=_identity,
            num_workers=num_workers,
            worker_init_fn=_init_worker if num_workers > 0 else None,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            pin_memory=pin_memory,
            # Worker base seeds come from this private generator, never from the global torch RNG: creating an
            # iterator (each epoch, after a resume, for validation) must leave the model's random stream alone.
            generator=self._generator,
        )

    @property
    def samples_per_epoch(self) -> int:
        g = self.batch_size * self.world_size
        return self.index.total // g * g if self.drop_last else self.index.total

    @property
    def stage_wait_seconds(self) -> float:
        """Seconds spent blocked waiting for remote files to be staged (0 for local inputs)."""
        return self._staged.wait_seconds if self._staged is not None else 0.0

    @property
    def staging_stats(self) -> dict[str, int]:
        """Counts of the stagers closed so far (downloaded, downloaded_bytes, reused, retries, evicted)."""
        return dict(self._staged.stats) if self._staged is not None else {}

    def _begin_staging(self, epoch: int, position: int, then_next: bool) -> None:
        plan = self._dataset.plan(epoch)
        if self._staged is None or position >= plan.total:
            return
        after: list[int] = []
        if then_next:  # the next epoch's first files, so that crossing into it does not stall
            nxt = EpochPlan(self.index, self.seed, epoch + 1, self._dataset.shuffle, self._dataset.window)
            after = list(dict.fromkeys(f for chunk in nxt.chunks for f, _, _ in chunk))
        self._staged.begin(epoch, plan.chunks, plan.chunk_of(position), after)

    def _stage_items(self, plan: EpochPlan, items: Iterator[WorkItem]) -> Iterator[WorkItem]:
        """Main side: stage the files of each item's chunk before a worker gets it (blocks if not there)."""
        assert self._staged is not None
        for item in items:
            files = list(dict.fromkeys(f for f, _, _ in plan.chunks[item.chunk]))
            item.paths, bad = self._staged.paths(item.epoch, files)
            for f, reason in bad:
                uri = self.index.files[f]
                if self.on_bad_file != "skip":
                    raise UserError(
                        f"{uri}: cannot be staged ({reason}); set data.on_bad_file=skip to go on without it"
                    )
                note_bad_file(self.run_dir if self.rank == 0 else None, uri, f"staging: {reason}")
            yield item

    def epoch_batches(
        self, epoch: int, position: int, then_next: bool = False
    ) -> Iterator[tuple[MuonBatch, int]]:
        """(batch, global position after it) of one epoch from `position`, in order (`then_next`: the next
        epoch follows, so remote files of its start may be staged already)."""
        self._start_epoch, self._start_position = epoch, position
        self._generator.manual_seed(self._seed * 7919 + epoch + 104_729 * self._rank)
        self._begin_staging(epoch, position, then_next)
        g = self.batch_size * self.world_size
        pending: dict[int, list[MuonBatch | None]] = {}
        next_k = 0
        for result in self._loader:
            if isinstance(result, ItemError):
                raise UserError(result.message)
            self._count(result.stats)
            if self._staged is not None:
                self._staged.done(result.epoch, result.chunk)
            for k, part, nparts, batch in result.pieces():
                pending.setdefault(k, [None] * nparts)[part] = batch
            while next_k in pending and all(b is not None for b in pending[next_k]):
                parts = pending.pop(next_k)
                yield MuonBatch.concat(parts), min(position + (next_k + 1) * g, self.index.total)  # type: ignore[arg-type]
                next_k += 1
        assert not pending, "a batch was left incomplete"
        if self._staged is not None:
            self._staged.end_epoch()
            log.info(
                "epoch %d: %.1f s waiting for staged files so far (%s)",
                epoch,
                self._staged.wait_seconds,
                ", ".join(f"{k} {v}" for k, v in self._staged.stats.items()),
            )

    def _count(self, stats: dict[str, int]) -> None:
        for key, value in stats.items():
            self.stats[key] = self.stats.get(key, 0) + value
            # say so in the log, at most at every doubling
            if value and self.stats[key] >= 2 * self._warned.get(key, 0):
                self._warned[key] = self.stats[key]
                log.warning("muon data: %s so far: %d events skipped/removed", key, self.stats[key])

    def _endless(self) -> Iterator[tuple[MuonBatch, int, int]]:
        epoch, position = self.epoch, self.position
        while True:
            for batch, end in self.epoch_batches(epoch, position, then_next=True):
                yield batch, epoch, end
            epoch, position = epoch + 1, 0

    def __iter__(self) -> Iterator[MuonBatch]:
        self._stop_prefetcher()
        source: Iterator[tuple[MuonBatch, int, int]] = self._endless()
        if self.prefetch_batches > 0:
            self._prefetcher = _Prefetcher(source, self.prefetch_batches)
            source = iter(self._prefetcher)
        for batch, epoch, end in source:
            self.epoch, self.position = epoch, end  # counted when handed out, not when prefetched
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position, the counts, and the file list the position refers to (see data/fingerprint.py)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "stats": dict(self.stats),
            "files": self._file_list_state(),
        }

    def _file_list_state(self) -> dict[str, Any]:
        key = (len(self.index.files), sum(self.index.events))
        if self._files_state is None or self._files_state[0] != key:
            self._files_state = (key, self.index.file_list().state())
        return self._files_state[1]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved position; UserError if the files changed (unless allow_changed_files: then
        the saved epoch restarts from its start with the files found now)."""
        self.epoch = int(state["epoch"])
        self.position = int(state.get("position", state.get("offset", 0)))
        self.stats = dict(state.get("stats", {}))
        if check_resume(state.get("files"), self.index.file_list(), self.allow_changed_files, self.epoch):
            self.position = 0

    def _stop_prefetcher(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def close(self) -> None:
        self._stop_prefetcher()
        self._loader._iterator = None  # type: ignore[attr-defined]  # shuts persistent workers down
        self._dataset.close()
        if self._staged is not None:
            self._staged.close()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class _Prefetcher:
    """A background thread keeping up to `size` ready batches ahead of the consumer."""

    _END = object()

    def __init__(self, source: Iterator[Any], size: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._source = source
        self._thread = threading.Thread(target=self._run, name="hpctrain-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._source:
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except BaseException as err:  # handed to the consumer, raised there
            self._queue.put(err)

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                check_stop()  # a stop (signal, deadline) must not wait for data that is slow to come
                continue
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.1)
        self._thread.join()
