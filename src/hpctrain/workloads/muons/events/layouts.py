"""The physicists' file layouts: detection, readers (one 'unit' = a row group or an HDF5 slice), writers.

Layouts (detected from the schema and the row widths, never configured):
- `parquet` (current): primary_major_id, primary_minor_id uint64; primary list<float32>
  [E, zenith, mass, depth]; muons list<list<float32>> rows [E, x, y]; an event without muons is [].
- `parquet-legacy`: primary [major, minor, E, zenith, mass, depth]; muon rows [major, minor, E, x, y].
- `parquet-hdf5` (converted from HDF5): primary [major, minor, E, zenith, mass, time, depth]; muon rows
  [major, minor, E, x, y, t]; an event without muons is ONE all-zero muon (count 1), read as empty.
- `hdf5`: primaries (N, 7), muons (M, 6) float32 as above, counts (N,) int32; same empty-event convention.
Files are routed by format (suffix, else magic bytes): a Parquet file never reaches h5py.

Errors a user's data can cause are the one-line `LayoutError` and `UnreadableFileError` of formats.py (with the
layout names and the format check, re-exported here). A valid file without events has layout "empty" and no
units to read.

Size (~460 lines): one detector, reader and writer per physicists' layout, side by side so that a new layout is
added next to the ones it resembles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hpctrain.data.stream.ragged import (
    arrow_of,
    fixed_list,
    fixed_rows,
    gather_ragged,
    list_of_lists,
    nested_rows,
    numbers,
)
from hpctrain.fsutil import atomic_path
from hpctrain.workloads.muons.events import file_cache, first_batch
from hpctrain.workloads.muons.events.decoded import Events

# The format names and errors live in formats.py; readers of this module find them here too.
from hpctrain.workloads.muons.events.formats import HDF5_MAGIC as HDF5_MAGIC
from hpctrain.workloads.muons.events.formats import HDF5_SUFFIXES as HDF5_SUFFIXES
from hpctrain.workloads.muons.events.formats import LAYOUTS as LAYOUTS
from hpctrain.workloads.muons.events.formats import PARQUET_SUFFIXES as PARQUET_SUFFIXES
from hpctrain.workloads.muons.events.formats import LayoutError as LayoutError
from hpctrain.workloads.muons.events.formats import MissingFileError as MissingFileError
from hpctrain.workloads.muons.events.formats import UnreadableFileError as UnreadableFileError
from hpctrain.workloads.muons.events.formats import check_local as check_local
from hpctrain.workloads.muons.events.formats import file_format as file_format
from hpctrain.workloads.muons.events.formats import one_line as one_line
from hpctrain.workloads.muons.events.formats import unreadable as unreadable
from hpctrain.workloads.muons.spec import UNIT_EVENTS

# layout -> (primary width, muon width, columns of [E, zenith, mass, depth] in primary, of [E, x, y] in muon)
_WIDTHS = {
    "parquet": (4, 3, [0, 1, 2, 3], [0, 1, 2]),
    "parquet-legacy": (6, 5, [2, 3, 4, 5], [2, 3, 4]),
    "parquet-hdf5": (7, 6, [2, 3, 4, 6], [2, 3, 4]),
    "hdf5": (7, 6, [2, 3, 4, 6], [2, 3, 4]),
}
_EXPECTED = (
    "expected 'primary' list<float> of 4 values with primary_major_id/primary_minor_id columns (current), "
    "6 values (legacy) or 7 values (converted from HDF5), and 'muons' list<list<float>>"
)
SPEED_OF_LIGHT_M_PER_NS = 0.299792458
# Parquet pages written plain, without a dictionary: muon and primary values are floats that hardly repeat, and
# pyarrow's default built a dictionary per column chunk before falling back. 16 chunks of 1,024 generated events
# (1.7 M muons): 0.77 s and 31 MB with it, 0.20 s and 21 MB without (2026-11-29).
PARQUET_WRITE: dict[str, Any] = {"use_dictionary": False}


def _empty_convention(raw_muons: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the all-zero placeholder muon of events with count 1 (the HDF5 writer's empty event)."""
    single = np.flatnonzero(counts == 1)
    if len(single) == 0 or len(raw_muons) == 0:
        return raw_muons, counts
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[single]
    placeholder = ~raw_muons[starts].any(axis=1)
    if not placeholder.any():
        return raw_muons, counts
    keep = np.ones(len(raw_muons), dtype=bool)
    keep[starts[placeholder]] = False
    counts = counts.copy()
    counts[single[placeholder]] = 0
    return raw_muons[keep], counts


def _select(
    layout: str, raw_prim: np.ndarray, raw_muons: np.ndarray, counts: np.ndarray, ids: np.ndarray | None
) -> Events:
    _, _, pcols, mcols = _WIDTHS[layout]
    if layout in ("parquet-hdf5", "hdf5"):
        raw_muons, counts = _empty_convention(raw_muons, counts)
    if ids is None:
        with np.errstate(invalid="ignore"):  # a corrupt file's NaN ids: garbage in, not a warning per unit
            ids = raw_prim[:, :2].astype(np.int64)
    # the current layout is already [E, zenith, mass, depth] / [E, x, y]: no copy
    primaries = raw_prim if layout == "parquet" else raw_prim[:, pcols]
    muons = raw_muons if layout == "parquet" else raw_muons[:, mcols]
    primaries = np.ascontiguousarray(primaries, dtype=np.float32)
    muons = np.ascontiguousarray(muons, dtype=np.float32)
    return Events(primaries, muons.reshape(-1, 3), counts.astype(np.int64, copy=False), ids)


@contextlib.contextmanager
def _closed_on_error(file: Any, path: str) -> Iterator[None]:
    """Close a just-opened file when reading its layout fails: a LayoutError stays as it is (it names what is
    missing), anything else from the reader library becomes the one-line "cannot be read" error."""
    try:
        yield
    except LayoutError:
        file.close()
        raise
    except Exception as err:  # pyarrow and h5py raise many types for a bad file
        file.close()
        raise unreadable(path, err) from None


class ParquetReader:
    """One Parquet file; unit i is row group i. A file without events has layout "empty".

    `layout`: the one the index found when it opened the file; detecting it again reads a row group's
    primaries (~2 ms per open, most of the cost of a small file). Each unit read still checks its widths."""

    def __init__(self, path: str, layout: str | None = None) -> None:
        self.path = path
        try:
            # data.memory_cache_mb: from memory. Never memory_map=True: ~7% less decode CPU, but a file
            # truncated in place while mapped kills the process with SIGBUS where a read fails in one line.
            self.file = pq.ParquetFile(file_cache.source(path))
        except Exception as err:  # OSError, ArrowInvalid, ...: pyarrow raises many types for a bad file
            raise unreadable(path, err) from None
        with _closed_on_error(self.file, path):
            meta = self.file.metadata
            self.unit_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            # an empty file holds nothing to misread: whatever its columns, it is just empty
            if not sum(self.unit_rows):
                self.layout = "empty"
            elif layout in _WIDTHS and layout != "hdf5":
                self.layout = layout
            else:
                self.layout = self._detect(self.file.schema_arrow)
        self._columns = (
            ["primary_major_id", "primary_minor_id", "primary", "muons"]
            if self.layout == "parquet"
            else ["primary", "muons"]
        )

    def _detect(self, schema: pa.Schema) -> str:
        names = set(schema.names)
        if not {"primary", "muons"} <= names:
            raise LayoutError(f"{self.path}: unknown layout with columns {sorted(names)}; {_EXPECTED}")
        prim_t, muon_t = schema.field("primary").type, schema.field("muons").type
        nested_ok = pa.types.is_list(muon_t) or pa.types.is_large_list(muon_t)
        nested_ok = nested_ok and (
            pa.types.is_list(muon_t.value_type) or pa.types.is_large_list(muon_t.value_type)
        )
        if not (pa.types.is_list(prim_t) or pa.types.is_large_list(prim_t)) or not nested_ok:
            raise LayoutError(
                f"{self.path}: unknown layout (primary: {prim_t}, muons: {muon_t}); {_EXPECTED}"
            )
        width = 0
        for batch in self.file.iter_batches(batch_size=64, columns=["primary"]):
            if batch.num_rows:
                _, width = fixed_rows(batch.column(0), f"{self.path}: primary")
                break
        has_ids = {"primary_major_id", "primary_minor_id"} <= names
        if width == 4 and has_ids:
            return "parquet"
        if width == 6 and not has_ids:
            return "parquet-legacy"
        if width == 7 and not has_ids:
            return "parquet-hdf5"
        ids = "with" if has_ids else "without"
        raise LayoutError(
            f"{self.path}: unknown layout (primary of {width} values, {ids} id columns); {_EXPECTED}"
        )

    def read_unit(self, i: int) -> Events:
        return self.unit_of(i, self.fetch_unit(i))

    def fetch_unit(self, i: int) -> pa.Table | None:
        """Row group i as Arrow decodes it: nearly all of a unit's cost, with the GIL released (a background
        thread may run it: decode.py's read-ahead). `unit_of` makes the events of it."""
        if self.layout == "empty":
            return None
        try:
            # one thread: the muon column is nearly all of the work, so pyarrow's pool would add hand-offs
            return self.file.read_row_group(i, columns=self._columns, use_threads=False)
        except Exception as err:  # a corrupt page or row group: pyarrow raises many types
            raise unreadable(self.path, err, f"row group {i} cannot be read") from None

    def unit_of(self, i: int, table: pa.Table | None) -> Events:
        """The events of row group i from its table (`fetch_unit`), their widths checked."""
        if table is None:
            return concat_events([])
        try:
            events = self._events(i, table)
        except LayoutError:
            raise
        except Exception as err:  # a corrupt page or row group: pyarrow raises many types
            raise unreadable(self.path, err, f"row group {i} cannot be read") from None
        first_batch.note(self.path, events)  # data.report_first_batch
        return events

    def _events(self, i: int, table: pa.Table) -> Events:
        pwidth, mwidth, _, _ = _WIDTHS[self.layout]
        raw_prim, width = fixed_rows(table.column("primary"), f"{self.path}: primary")
        if len(raw_prim) and width != pwidth:
            raise LayoutError(f"{self.path}: row group {i} has primaries of {width} values, not {pwidth}")
        raw_muons, counts = nested_rows(table.column("muons"), mwidth, f"{self.path}: muons")
        ids = None
        if self.layout == "parquet":
            ids = np.stack(
                [numbers(table.column(n)).astype(np.int64) for n in ("primary_major_id", "primary_minor_id")],
                axis=1,
            ).reshape(-1, 2)
        events = _select(self.layout, raw_prim.reshape(-1, pwidth), raw_muons, counts, ids)
        if len(events) != table.num_rows:
            raise LayoutError(f"{self.path}: row group {i} has {len(events)} events, not {table.num_rows}")
        return events

    def close(self) -> None:
        self.file.close()


class HDF5Reader:
    """One HDF5 file; unit i is the slice of `unit_events` events starting at i * unit_events."""

    def __init__(self, path: str, unit_events: int = UNIT_EVENTS) -> None:
        import h5py

        self.path = path
        self.layout = "hdf5"
        try:
            self.file = h5py.File(path, "r")
        except Exception as err:  # OSError for truncated/foreign files, others for odd ones
            raise unreadable(path, err) from None
        with _closed_on_error(self.file, path):
            self._check(unit_events)

    def _check(self, unit_events: int) -> None:
        path = self.path
        missing = {"primaries", "muons", "counts"} - set(self.file.keys())
        if missing:
            raise LayoutError(
                f"{path}: unknown HDF5 layout (missing {sorted(missing)}); expected datasets "
                f"primaries (N, 7), muons (M, 6), counts (N,)"
            )
        prim, muons, raw_counts = self.file["primaries"], self.file["muons"], self.file["counts"]
        for name, node in (("primaries", prim), ("muons", muons), ("counts", raw_counts)):
            if not hasattr(node, "shape") or node.dtype.kind not in "iuf":
                raise LayoutError(
                    f"{path}: '{name}' is not a numeric dataset; expected HDF5 layout {LAYOUTS[3]}"
                )
        if (
            prim.ndim != 2
            or prim.shape[1] != 7
            or muons.ndim != 2
            or muons.shape[1] != 6
            or raw_counts.ndim != 1
        ):
            raise LayoutError(
                f"{path}: unknown HDF5 layout (primaries {prim.shape}, muons {muons.shape}, counts "
                f"{raw_counts.shape}); expected (N, 7), (M, 6) and (N,)"
            )
        counts = _checked_counts(path, raw_counts[:], prim.shape[0], muons.shape[0])
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.counts = counts
        self.unit_events = unit_events
        n = len(counts)
        self.unit_rows = [min(unit_events, n - s) for s in range(0, n, unit_events)]

    def read_unit(self, i: int) -> Events:
        return self.unit_of(i, self.fetch_unit(i))

    def fetch_unit(self, i: int) -> Events:
        """Unit i's events (all the work: `unit_of` has nothing left to do)."""
        a = i * self.unit_events
        b = a + self.unit_rows[i]
        try:
            raw_prim = np.asarray(self.file["primaries"][a:b], dtype=np.float32)
            raw_muons = np.asarray(self.file["muons"][self.offsets[a] : self.offsets[b]], dtype=np.float32)
        except Exception as err:  # a corrupt chunk: h5py raises OSError and others
            raise unreadable(self.path, err, f"events {a}..{b - 1} cannot be read") from None
        events = _select("hdf5", raw_prim, raw_muons, self.counts[a:b].copy(), None)
        first_batch.note(self.path, events)  # data.report_first_batch
        return events

    def unit_of(self, i: int, events: Events) -> Events:
        return events

    def close(self) -> None:
        self.file.close()


def _checked_counts(path: str, raw: np.ndarray, primaries: int, muons: int) -> np.ndarray:
    """An HDF5 file's `counts` as int64, once every count is a whole number 0 .. `muons` and they sum to `muons`
    exactly, one per primary; else a LayoutError naming the file and the first bad count. Checked before any
    cast or sum: a float count (2.7) cast would truncate, a uint64 one past 2**63 wrap, and int64 counts whose
    true sum overflows (4 x 2**62 + 5) would sum to 5 modulo 2**64 and pass."""
    raw = np.asarray(raw)
    problem = ""
    if len(raw) != primaries:
        problem = f"{len(raw)} counts for {primaries} primaries"
    elif raw.dtype.kind == "f" and not np.all(np.isfinite(raw) & (raw == np.floor(raw))):
        at = int(np.flatnonzero(~(np.isfinite(raw) & (raw == np.floor(raw))))[0])
        problem = f"count {at} is {raw[at]!r}, not a whole number"
    elif len(raw) and (raw.min() < 0 or raw.max() > muons):
        at = int(np.argmin(raw) if raw.min() < 0 else np.argmax(raw))
        problem = f"count {at} is {raw[at]}, outside 0 .. {muons} (the muons in the file)"
    if not problem:
        # each count is at most `muons` (< 2**63): a running sum past it is a mismatch, found before it can
        # overflow (at most one count past `muons`, so below 2**64 in uint64)
        total = np.cumsum(raw.astype(np.uint64), dtype=np.uint64) if len(raw) else np.zeros(1, np.uint64)
        past = np.flatnonzero(total > np.uint64(muons))
        if len(past):
            problem = f"the counts up to count {int(past[0])} already sum past {muons} muons"
        elif int(total[-1]) != muons:
            problem = f"the counts sum to {int(total[-1])}, not {muons} muons"
    if problem:
        raise LayoutError(
            f"{path}: counts do not match primaries/muons ({problem}); expected one whole count >= 0 per "
            "primary, summing to the rows of muons"
        )
    return raw.astype(np.int64)


Reader = ParquetReader | HDF5Reader


def open_reader(path: str, hdf5_unit_events: int = UNIT_EVENTS, layout: str | None = None) -> Reader:
    """A reader of the right format; raises MissingFileError (missing), LayoutError (unknown layout) or
    UnreadableFileError (no permission, truncated, corrupt): all one-line UserErrors naming the file.
    `layout`: already known (from the index), not detected again."""
    check_local(path)
    if file_format(path) == "parquet":
        return ParquetReader(path, layout)
    return HDF5Reader(path, hdf5_unit_events)


def read_all(path: str) -> tuple[str, Events]:
    """The layout and every event of a file (small files, tests and `data inspect`)."""
    reader = open_reader(path)
    try:
        parts = [reader.read_unit(i) for i in range(len(reader.unit_rows))]
    finally:
        reader.close()
    return reader.layout, concat_events(parts)


def concat_events(parts: list[Events]) -> Events:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return Events(
            np.zeros((0, 4), np.float32),
            np.zeros((0, 3), np.float32),
            np.zeros(0, np.int64),
            np.zeros((0, 2), np.int64),
        )
    return Events(
        np.concatenate([p.primaries for p in parts]),
        np.concatenate([p.muons for p in parts]),
        np.concatenate([p.counts for p in parts]),
        np.concatenate([p.ids for p in parts]),
    )


# ---- writers -----------------------------------------------------------------------------------------------


def _full_rows(events: Events) -> tuple[np.ndarray, np.ndarray]:
    """(n, 7) [major, minor, E, zen, mass, time, depth] and (M, 6) [major, minor, E, x, y, t] rows."""
    n = len(events)
    ids = events.ids.astype(np.float32)
    prim = np.zeros((n, 7), np.float32)
    prim[:, :2] = ids
    prim[:, 2:5] = events.primaries[:, :3]
    prim[:, 6] = events.primaries[:, 3]
    muons = np.zeros((len(events.muons), 6), np.float32)
    muons[:, :2] = np.repeat(ids, events.counts, axis=0)
    muons[:, 2:5] = events.muons
    muons[:, 5] = np.hypot(events.muons[:, 1], events.muons[:, 2]) / SPEED_OF_LIGHT_M_PER_NS
    return prim, muons


def _with_placeholders(muons: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The HDF5 writer's convention: an empty event gets ONE all-zero muon and count 1."""
    empty = counts == 0
    if not empty.any():
        return muons, counts
    new_counts = np.where(empty, 1, counts)
    out = np.zeros((int(new_counts.sum()), muons.shape[1]), muons.dtype)
    dest, _ = _rows_of(new_counts, ~empty)
    out[dest] = muons
    return out, new_counts


def _rows_of(counts: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return gather_ragged(offsets, np.flatnonzero(mask))


def events_table(events: Events, layout: str) -> pa.Table:
    """The Arrow table of `events` in a Parquet layout."""
    if layout == "parquet":
        return pa.table(
            {
                "primary_major_id": arrow_of(events.ids[:, 0].astype(np.uint64)),
                "primary_minor_id": arrow_of(events.ids[:, 1].astype(np.uint64)),
                "primary": fixed_list(events.primaries),
                "muons": list_of_lists(events.muons, events.counts),
            }
        )
    prim, muons = _full_rows(events)
    counts = events.counts
    if layout == "parquet-legacy":
        prim, muons = prim[:, [0, 1, 2, 3, 4, 6]], muons[:, :5]
    elif layout == "parquet-hdf5":
        muons, counts = _with_placeholders(muons, counts)
    else:
        raise LayoutError(f"unknown Parquet layout {layout!r}; choose from {', '.join(LAYOUTS[:3])}")
    return pa.table({"primary": fixed_list(prim), "muons": list_of_lists(muons, counts)})


def write_events(
    path: str,
    events: Events,
    layout: str,
    row_group_size: int = 65536,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write `events` in `layout` (atomically: temporary name, then rename); `metadata`: key-value pairs kept
    in the file (Parquet schema metadata, HDF5 attributes), e.g. the truth version."""
    if layout not in LAYOUTS:
        raise LayoutError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    with atomic_path(Path(path)) as tmp:
        if layout == "hdf5":
            _write_hdf5(str(tmp), events, metadata or {})
        else:
            table = events_table(events, layout)
            if metadata:
                table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
            pq.write_table(table, str(tmp), row_group_size=row_group_size, **PARQUET_WRITE)


def _write_hdf5(path: str, events: Events, metadata: dict[str, str]) -> None:
    import h5py

    prim, muons = _full_rows(events)
    muons, counts = _with_placeholders(muons, events.counts)
    with h5py.File(path, "w") as fh:
        fh.attrs.update(metadata)
        fh.create_dataset("primaries", data=prim)
        # (a file without events has no muons: an empty dataset cannot be chunked)
        fh.create_dataset("muons", data=muons, chunks=(min(len(muons), 65536), 6) if len(muons) else None)
        fh.create_dataset("counts", data=counts.astype(np.int32))
