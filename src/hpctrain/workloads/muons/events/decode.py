"""The worker side of the muon stream: decode the units of one work item's chunk, keep the wanted events.

`ChunkDataset` is a map-style data set whose 'index' is a WorkItem (data/stream/epoch_plan.py). It runs in a
DataLoader worker (or in the main process with 0 workers): it opens the chunk's files (a few kept open),
decodes only the units the item's events lie in, applies the event rules (outliers.py) and gathers the events
in batch order into one ItemResult.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from hpctrain.data.stream.epoch_plan import EpochPlan, PieceSize, Unit, WorkItem
from hpctrain.data.stream.lent_buffers import Borrowed
from hpctrain.data.stream.read_ahead import ReadAhead
from hpctrain.errors import UserError
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.event_counts import UnitTally
from hpctrain.workloads.muons.events.event_index import EventIndex, note_bad_file
from hpctrain.workloads.muons.events.item_result import ItemError, ItemResult, Recycled, gather
from hpctrain.workloads.muons.events.outliers import REASONS, EventRules, muons_fine
from hpctrain.workloads.muons.spec import UNIT_EVENTS

_OPEN_FILES = 4  # readers kept open per worker


@dataclass(frozen=True)
class ReadOptions:
    """How files are read: a bad one fails or is skipped (noted in run_dir/bad_files.txt)."""

    on_bad_file: str = "fail"
    run_dir: str | None = None
    hdf5_unit_events: int = UNIT_EVENTS


@dataclass
class Located:
    """Where one work item's events are in its chunk."""

    plan: EpochPlan
    units: list[Unit]  # the chunk's units in order
    unit_starts: np.ndarray  # (units + 1,) chunk-local position of each unit's first event
    lo: np.ndarray  # (pieces,) chunk-local start of each piece
    hi: np.ndarray  # (pieces,) chunk-local end of each piece
    wanted: np.ndarray  # (events,) chunk-local event (units concatenated) of each position, in batch order
    where: np.ndarray  # (events,) chunk-local position of each
    unit: np.ndarray  # (events,) index into `units` of each


@dataclass
class Decoded:
    """The needed units of a chunk decoded and concatenated."""

    events: layouts.Events
    # (units of the chunk,) first row of each unit in `events` (-1: not decoded or unreadable)
    base: np.ndarray
    sources: list[tuple[int, int]]  # (file, unit) of each decoded unit, in order
    keys: list[tuple[int, int, int, tuple[int, int, int]]]  # (file, unit, rows, file identity) of each


class ChunkDataset(Dataset[ItemResult | ItemError]):
    """Map-style data set whose 'index' is a WorkItem; decodes the chunk's units it needs."""

    def __init__(
        self, index: EventIndex, seed: int, shuffle: bool, window: int, read: ReadOptions, rules: EventRules
    ) -> None:
        self.index, self.seed, self.shuffle, self.window = index, seed, shuffle, window
        self.read, self.rules = read, rules
        self._plan: EpochPlan | None = None
        self._readers: OrderedDict[int, layouts.Reader] = OrderedDict()
        self._paths: dict[int, str] | None = None  # the current item's staged paths
        self._recycled = Recycled()
        self._borrowed = Borrowed()
        # Units whose muons were proven fine (outliers.muons_fine), keyed by (file, unit, rows, the file's
        # identity when opened: inode, size, mtime): a later epoch checks only their primaries. The proof is
        # two passes over the muons (~10% of a shuffled epoch's CPU); a file rewritten since gets a new key.
        self._proven: set[tuple[int, int, int, tuple[int, int, int]]] = set()
        self._identity: dict[int, tuple[int, int, int]] = {}
        # 0 workers: units decoded on a background thread, announced an item ahead (start_read_ahead)
        self._ahead: ReadAhead[Unit, tuple[layouts.Reader, Any]] | None = None
        self._located: dict[tuple[int, int], Located] = {}  # announced items, located already

    def __len__(self) -> int:
        return self.index.total

    def plan(self, epoch: int) -> EpochPlan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = EpochPlan(self.index.unit_rows, self.seed, epoch, self.shuffle, self.window)
        return self._plan

    def close(self) -> None:
        """Stop reading ahead, close the open files."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        while self._readers:
            self._readers.popitem()[1].close()

    def __getitem__(self, item: WorkItem) -> ItemResult | ItemError:  # type: ignore[override]
        try:
            return self._item(item)
        except (
            UserError
        ) as err:  # raised again on the main side: a worker's exception would carry its traceback
            return ItemError(str(err))

    # ---- reading ahead (main process, 0 workers, local files) ----------------------------------------------

    def start_read_ahead(self) -> None:
        """From now on every unit is decoded on one background thread; `announce` starts an item's early."""
        if self._ahead is None:
            self._ahead = ReadAhead(self._fetch)

    def announce(self, item: WorkItem) -> None:
        """Start decoding the units `item` needs (after those announced before): it comes next but one."""
        if self._ahead is None:
            return
        at = self._locate(item)
        while len(self._located) >= 4:  # announced but never asked for (a restart): forgotten
            self._located.pop(next(iter(self._located)))
        self._located[(item.epoch, item.chunk)] = at
        self._ahead.announce(at.units[j] for j in np.unique(at.unit))

    def forget_announced(self) -> None:
        """The items announced so far will not come (the sampler starts again)."""
        self._located.clear()
        if self._ahead is not None:
            self._ahead.forget()

    # ---- files ---------------------------------------------------------------------------------------------

    def _reader(self, f: int) -> layouts.Reader:
        if f in self._readers:
            self._readers.move_to_end(f)
            return self._readers[f]
        path = self.index.files[f] if self._paths is None else self._paths[f]
        # the layout the index found (remote files: only the family is known before staging: detect it)
        known = None if self.index.remote[f] else self.index.layouts[f]
        reader = layouts.open_reader(path, self.read.hdf5_unit_events, known)
        st = os.stat(path)
        self._identity[f] = (st.st_ino, st.st_size, st.st_mtime_ns)
        expected = self.index.expected_rows[f]
        if list(reader.unit_rows) != expected:
            reader.close()
            cached = "; cached in <run folder>/data_index/: delete it" if self.index.remote[f] else ""
            raise layouts.UnreadableFileError(
                self.index.files[f],
                f"changed since the run indexed it (units of {list(reader.unit_rows)} events, the index "
                f"{expected}{cached})",
            )
        self._readers[f] = reader
        while len(self._readers) > _OPEN_FILES:  # bounded: a few open files per worker
            self._readers.popitem(last=False)[1].close()
        return reader

    def _fetch(self, unit: Unit) -> tuple[layouts.Reader, Any]:
        """The costly half of reading a unit (on the read-ahead thread, if there is one): its reader, and the
        unit as the reader fetched it (`unit_of` makes its events)."""
        reader = self._reader(unit.file)
        return reader, reader.fetch_unit(unit.unit)

    def _read(self, f: int, u: int, rows: int, skipped: list[UnitTally]) -> layouts.Events | None:
        """Unit u of file f (its first `rows` events), or None when the file is bad and skipped (tallied in
        `skipped`)."""
        if self._paths is not None and f not in self._paths:  # could not be staged: noted by the sampler
            skipped.append(UnitTally(f, u, rows, 0, (("bad_file_events", rows, 0),)))
            return None
        try:
            unit = Unit(f, u, rows)
            reader, fetched = self._fetch(unit) if self._ahead is None else self._ahead.get(unit)
            events = reader.unit_of(u, fetched)
        except Exception as err:  # a corrupt row group, a file gone or changed: many types (see layouts)
            path = self.index.files[f]  # the URI of a staged file, not its copy on scratch
            local = path if self._paths is None else self._paths.get(f, path)
            if isinstance(err, layouts.UnreadableFileError):
                reason = err.reason
            elif isinstance(err, layouts.LayoutError):
                reason = str(err).removeprefix(f"{local}: ")
            else:
                reason = f"unit {u} cannot be read ({layouts.one_line(err)})"
            if self.read.on_bad_file != "skip":
                raise UserError(f"{path}: {reason}; set data.on_bad_file=skip to go on without it") from None
            note_bad_file(self.read.run_dir, path, reason)
            skipped.append(UnitTally(f, u, rows, 0, (("bad_file_events", rows, 0),)))
            return None
        if len(events) > rows:  # data.max_events cut this unit
            off = events.offsets
            events = layouts.Events(
                events.primaries[:rows], events.muons[: off[rows]], events.counts[:rows], events.ids[:rows]
            )
        return events

    # ---- one item ------------------------------------------------------------------------------------------

    def _locate(self, item: WorkItem) -> Located:
        """The chunk-local events the item wants in batch order, their positions, and the unit of each."""
        plan = self.plan(item.epoch)
        units = plan.chunks[item.chunk]
        order = plan.chunk_order(item.chunk)
        unit_starts = np.concatenate([[0], np.cumsum([u.rows for u in units])])
        lo = np.array([p.lo for p in item.pieces], dtype=np.int64)
        hi = np.array([p.hi for p in item.pieces], dtype=np.int64)
        if np.array_equal(lo[1:], hi[:-1]):  # back to back (one rank): one slice of the order
            wanted, where = order[lo[0] : hi[-1]], np.arange(lo[0], hi[-1], dtype=np.int64)
        else:
            wanted = np.concatenate([order[a:b] for a, b in zip(lo, hi)])
            where = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo, hi)])
        wanted = wanted.astype(np.int64, copy=False)
        unit = np.searchsorted(unit_starts, wanted, side="right") - 1
        return Located(plan, units, unit_starts, lo, hi, wanted, where, unit)

    def _decode(self, units: list[Unit], need: np.ndarray, skipped: list[UnitTally]) -> Decoded:
        """The units `need` (indices into `units`) decoded and concatenated (unreadable ones in `skipped`)."""
        parts, sources, keys = [], [], []
        base = np.full(len(units), -1, dtype=np.int64)
        rows_so_far = 0
        for j in need:
            f, u, rows = units[j]
            unit_events = self._read(f, u, rows, skipped)
            if unit_events is None:
                continue
            base[j] = rows_so_far
            rows_so_far += len(unit_events)
            parts.append(unit_events)
            sources.append((f, u))
            keys.append((f, u, rows, self._identity[f]))
        return Decoded(layouts.concat_events(parts), base, sources, keys)

    def _muons_proven(self, decoded: Decoded) -> bool:
        """Whether every decoded muon is fine: known from an earlier epoch, or proven now (and remembered)."""
        if all(k in self._proven for k in decoded.keys):
            return True
        muons = decoded.events.muons
        if not len(muons) or muons_fine(muons):
            self._proven.update(decoded.keys)
            return True
        return False

    def _source(self, decoded: Decoded, row: int) -> tuple[str, int]:
        """(file, row in file) of a row of the decoded concatenation."""
        starts = [int(b) for b in decoded.base if b >= 0]
        i = int(np.searchsorted(starts, row, side="right") - 1)
        f, u = decoded.sources[i]
        return self.index.files[f], self.index.row_in_file(f, u, row - starts[i], self.read.hdf5_unit_events)

    def _use_staged(self, paths: dict[int, str]) -> None:
        # staged files are deleted after use: hold only this item's files open (an open deleted file would keep
        # its scratch space)
        self._paths = paths
        for f in [f for f in self._readers if f not in paths]:
            self._readers.pop(f).close()

    def _item(self, item: WorkItem) -> ItemResult:
        if item.paths is not None:
            self._use_staged(item.paths)
        at = self._located.pop((item.epoch, item.chunk), None) or self._locate(item)
        skipped: list[UnitTally] = []
        decoded = self._decode(at.units, np.unique(at.unit), skipped)
        data = decoded.events
        offsets = data.offsets
        proven = self._muons_proven(decoded)
        why = np.zeros(len(data), dtype=np.int8)
        keep_all = self.rules.keep(data, offsets, item.epoch, lambda r: self._source(decoded, r), why, proven)
        tallies = (*_tallies(decoded, why), *skipped)
        # `row`: each wanted event's row in the decoded concatenation (dropped: unit unreadable or filtered)
        row = decoded.base[at.unit] + (at.wanted - at.unit_starts[at.unit])
        ok = decoded.base[at.unit] >= 0
        ok[ok] &= keep_all[row[ok]]
        kept = np.concatenate([[0], np.cumsum(ok)])
        ends = np.cumsum(at.hi - at.lo)
        n_kept = kept[ends] - kept[ends - (at.hi - at.lo)]
        sizes = [PieceSize(p.batch, p.part, p.parts, int(n)) for p, n in zip(item.pieces, n_kept)]
        where = at.where
        if not ok.all():
            row, where = row[ok], where[ok]
        start = int(at.plan.starts[item.chunk])
        lent = self._borrowed.hold(item.loan) if item.loan is not None else None
        events, buffer, in_lent = gather(data, offsets, row, where + start, self._recycled, lent)
        slot = item.loan.slot if item.loan is not None else -1
        proofs = tuple(decoded.keys) if proven else ()  # for the main process to remember (see remember)
        return ItemResult(events, sizes, tallies, item.epoch, item.chunk, buffer, slot, in_lent, proofs)

    def remember(self, proven: tuple[Any, ...]) -> None:
        """Main side: units a worker proved fine. Workers started later (not persistent: every epoch) are
        forked from this object, so they begin with what the earlier ones proved."""
        self._proven.update(proven)


def _tallies(decoded: Decoded, why: np.ndarray) -> tuple[UnitTally, ...]:
    """Each decoded unit's events and muons, and per reason the events removed from it and their muons (`why`:
    EventRules.keep's codes): what event_counts.py counts once per unit."""
    data = decoded.events
    starts = np.array([b for b in decoded.base if b >= 0], dtype=np.int64)  # in the order of decoded.sources
    n = len(starts)
    if n == 0:
        return ()
    lengths = np.diff(np.append(starts, len(data)))
    unit_of = np.repeat(np.arange(n), lengths)  # (events,) which unit each decoded event is of
    counts = data.counts.astype(np.float64)
    muons = np.bincount(unit_of, weights=counts, minlength=n)
    removed: list[list[tuple[str, int, int]]] = [[] for _ in range(n)]
    for code in np.unique(why[why > 0]) if why.any() else ():
        mask = why == code
        events = np.bincount(unit_of[mask], minlength=n)
        lost = np.bincount(unit_of[mask], weights=counts[mask], minlength=n)
        for i in np.flatnonzero(events):
            removed[i].append((REASONS[int(code) - 1], int(events[i]), int(lost[i])))
    return tuple(
        UnitTally(f, u, int(lengths[i]), int(muons[i]), tuple(removed[i]))
        for i, (f, u) in enumerate(decoded.sources)
    )
