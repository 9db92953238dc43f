"""The event rules applied while decoding: bad events, events with too many muons (outliers), empty events.

Outliers can be kept for a look: written to data.outliers_dir as Parquet (the current layout, plus source_file
and source_row), under names no earlier run used.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hpctrain.data.stream.ragged import gather_ragged
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_path
from hpctrain.workloads.muons import physics
from hpctrain.workloads.muons.events import layouts

# row of the decoded events -> (file, row in that file), for messages and the outlier files
Locate = Callable[[int], tuple[str, int]]
# why an event was removed (EventRules.keep's `why` codes are these indices + 1; event_counts.py's kinds)
REASONS = ("bad_events", "outliers", "empty_dropped")


@dataclass(frozen=True)
class EventRules:
    """What happens to unusual events (data.on_bad_event, max_muons_per_event, drop_empty_events)."""

    on_bad_event: str = "fail"
    max_muons_per_event: int = 0
    drop_empty_events: bool = False
    outliers_dir: str | None = None  # write the outliers here (None: only count them)
    rank: int = 0  # names this rank's outlier files

    def keep(
        self,
        data: layouts.Events,
        offsets: np.ndarray,
        epoch: int,
        locate: Locate,
        why: np.ndarray,
        muons_proven: bool | None = None,
    ) -> np.ndarray:
        """(events,) bool: events kept after the bad-event, outlier and empty-event rules; `why` (events,) int8
        is set to the reason of each removed one (its index in REASONS + 1; 0: kept).

        `muons_proven`: whether muons_fine holds for `data.muons`, when the caller knows (True: only the
        primaries are checked; False: the muons are checked event by event; None: proven here first)."""
        keep = np.ones(len(data), dtype=bool)
        bad = _bad_events(data, offsets, muons_proven)
        if bad.any():
            if self.on_bad_event != "skip":
                first = int(np.flatnonzero(bad)[0])
                path, row = locate(first)
                raise UserError(
                    f"{path}: event at row {row} has a zero, negative or non-finite energy/mass or value "
                    f"(primary {data.primaries[first].tolist()}); set data.on_bad_event=skip to skip such "
                    f"events"
                )
            keep &= ~bad
            why[bad] = REASONS.index("bad_events") + 1
        cap = self.max_muons_per_event
        if cap:
            big = keep & (data.counts > cap)
            if big.any():
                keep &= ~big
                why[big] = REASONS.index("outliers") + 1
                if self.outliers_dir and epoch == 0:  # once: later epochs would only repeat them
                    write_outliers(data, offsets, np.flatnonzero(big), locate, self.outliers_dir, self.rank)
        if self.drop_empty_events:
            empty = keep & (data.counts == 0)
            keep &= ~empty
            why[empty] = REASONS.index("empty_dropped") + 1
        return keep


def _bad_events(data: layouts.Events, offsets: np.ndarray, muons_proven: bool | None = None) -> np.ndarray:
    """(events,) bool: events with a zero, negative or non-finite energy/mass or value."""
    # Fast path: when the per-column extremes prove every muon fine, only the primaries need checking.
    muons = data.muons
    if muons_proven is None:
        muons_proven = len(muons) > 0 and muons_fine(muons)
    if muons_proven:
        muons = muons[:0]
    return physics.bad_events(data.primaries, muons, offsets)


_WIDE = 1024  # rows per line of the 2-D view reduced by _column_extremes


def _column_extremes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(width,) minimum and maximum of each column of values (rows, width); NaN if a column holds one.

    Reduced over a (rows / 1024, 1024 * width) view: NumPy's reduction along the first axis of an (n, 3) array
    calls its inner loop once per row (~10x slower than this), a strided column min still ~2x."""
    rows, width = values.shape
    bulk = rows // _WIDE * _WIDE
    parts = [values[bulk:]] if bulk < rows else []
    if bulk:
        wide = values[:bulk].reshape(-1, _WIDE * width)
        parts.append(wide.min(axis=0).reshape(_WIDE, width))
        parts.append(wide.max(axis=0).reshape(_WIDE, width))
    stacked = np.concatenate(parts)
    return stacked.min(axis=0), stacked.max(axis=0)


def muons_fine(muons: np.ndarray) -> bool:
    """True proves every muon energy positive and finite and every x, y finite (False: look row by row).

    NaN propagates through min and max, so a NaN anywhere makes a comparison below False."""
    lo, hi = _column_extremes(np.ascontiguousarray(muons))
    return bool(lo[0] > 0 and np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)))


def write_outliers(
    data: layouts.Events, offsets: np.ndarray, rows: np.ndarray, locate: Locate, folder: str, rank: int
) -> Path:
    """The events `rows` of `data` with their source file and row, to a new file in `folder`."""
    muon_rows, counts = gather_ragged(offsets, rows)
    events = layouts.Events(data.primaries[rows], data.muons[muon_rows], counts, data.ids[rows])
    table = layouts.events_table(events, "parquet")
    where = [locate(int(r)) for r in rows]  # few rows: outliers are rare
    table = table.append_column("source_file", pa.array([w[0] for w in where], pa.string()))
    table = table.append_column("source_row", pa.array([w[1] for w in where], pa.int64()))
    return write_unique(Path(folder), f"outliers-r{rank}", table)


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
        with atomic_path(target) as tmp:
            pq.write_table(table, tmp)
        return target
    raise RuntimeError(f"{folder}: no free outlier file name")
