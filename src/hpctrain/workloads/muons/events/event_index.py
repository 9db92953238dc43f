"""The index of muon files: which files opened, their layouts and events per unit (row group or HDF5 slice).

Built once per stream from the files' metadata (a remote file's from its footer, read remotely: see
remote_index.py), before any event is read: the epoch's order (data/stream/epoch_plan.py) needs only these counts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config.secrets import mask_secrets
from hpctrain.data.fingerprint import FileList
from hpctrain.data.stream.staged import StagingSpec
from hpctrain.errors import UserError
from hpctrain.fsutil import make_folders, open_append
from hpctrain.remote.uris import is_remote
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.remote_index import FileMeta, remote_index
from hpctrain.workloads.muons.spec import UNIT_EVENTS

log = logging.getLogger("hpctrain.muons")


@dataclass
class EventIndex:
    """Files that opened, their layouts and events per unit (row group or HDF5 slice)."""

    files: list[str] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    unit_rows: list[list[int]] = field(default_factory=list)
    # per file: the units the file must still have when read (a remote file's index came from its metadata)
    expected_rows: list[list[int]] = field(default_factory=list)
    # per file: bytes and events (before data.max_events): what a checkpoint's fingerprint compares
    sizes: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    remote: list[bool] = field(default_factory=list)
    # remote files' content evidence (listing stamp, sampled hash): what the fingerprint compares for them
    evidence: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(sum(rows) for rows in self.unit_rows)

    def file_list(self) -> FileList:
        return FileList(list(self.files), list(self.sizes), list(self.events), dict(self.evidence))

    def add(self, path: str, layout: str, unit_rows: list[int], size: int, remote: bool) -> None:
        self.files.append(path)
        self.layouts.append(layout)
        self.unit_rows.append(list(unit_rows))
        self.expected_rows.append(list(unit_rows))
        self.remote.append(remote)
        self.sizes.append(size)
        self.events.append(sum(unit_rows))

    def cap_events(self, max_events: int) -> None:
        """Keep only the first `max_events` events of the files in their order (data.max_events)."""
        left = max_events
        for rows in self.unit_rows:
            for j, n in enumerate(rows):
                rows[j] = min(n, left)
                left -= rows[j]

    def row_in_file(self, f: int, unit: int, row: int, hdf5_unit_events: int) -> int:
        """The row in file `f` of row `row` of its unit `unit` (for messages naming a file and row)."""
        if self.layouts[f] == "hdf5":
            return unit * hdf5_unit_events + row
        return sum(self.unit_rows[f][:unit]) + row


def note_bad_file(run_dir: str | None, path: str, reason: str) -> None:
    """Append `path<TAB>reason` to <run_dir>/bad_files.txt (once per path)."""
    log.warning("skipping bad file %s: %s", path, reason)
    if run_dir is None:
        return
    target = Path(run_dir) / "bad_files.txt"
    make_folders(target.parent)
    path = mask_secrets(path)  # a token in a URI's query is not written
    if target.is_file() and any(line.split("\t")[0] == path for line in target.read_text().splitlines()):
        return
    with open_append(target) as fh:  # O_APPEND: short lines from several processes do not interleave; no link
        fh.write(f"{path}\t{mask_secrets(reason.splitlines()[0]) if reason else ''}\n")


def _bad(on_bad_file: str, run_dir: str | None, path: str, message: str, reason: str) -> None:
    """A file that cannot be indexed: UserError (`message` + the hint), or noted and skipped."""
    if on_bad_file != "skip":
        raise UserError(f"{message}; set data.on_bad_file=skip to go on without it") from None
    note_bad_file(run_dir, path, reason)


def _add_local(
    index: EventIndex, path: str, hdf5_unit_events: int, on_bad_file: str, run_dir: str | None
) -> bool:
    """Index one local file; False if it holds no events."""
    try:
        reader = layouts.open_reader(path, hdf5_unit_events)
    except layouts.MissingFileError:
        raise  # listed a moment ago: gone now (a volume unmounted?); never skipped
    except (layouts.UnreadableFileError, layouts.LayoutError) as err:  # no permission, corrupt, foreign
        _bad(on_bad_file, run_dir, path, str(err), str(err).removeprefix(f"{path}: "))
        return True
    rows = list(reader.unit_rows)
    reader.close()
    if sum(rows) == 0:
        return False
    index.add(path, reader.layout, rows, os.path.getsize(path), remote=False)
    return True


def build_index(
    files: Sequence[str],
    on_bad_file: str = "fail",
    run_dir: str | None = None,
    max_events: int = 0,
    hdf5_unit_events: int = UNIT_EVENTS,
    report: bool = True,
    staging: StagingSpec | None = None,
) -> EventIndex:
    """Open every file's metadata once. A missing path always fails; a corrupt file fails or is skipped
    (on_bad_file); a file without events is skipped with a warning. Errors are one-line UserErrors. `report`:
    this rank writes bad_files.txt and the remote index cache, and warns (one rank does).

    Remote files are not downloaded: their footers are read remotely (or taken from the run folder's cache)."""
    index = EventIndex()
    noted = run_dir if report else None
    metas: dict[str, FileMeta | BaseException] = {}
    if any(is_remote(f) for f in files):
        metas = remote_index(files, staging or StagingSpec(), hdf5_unit_events, run_dir, write_cache=report)
    empty: list[str] = []
    for path in files:
        meta = metas.get(path)
        if meta is None:
            if not _add_local(index, path, hdf5_unit_events, on_bad_file, noted):
                empty.append(path)
        elif isinstance(meta, BaseException):
            _bad(on_bad_file, noted, path, str(meta), str(getattr(meta, "reason", meta)))
        elif sum(meta.unit_rows) == 0:
            empty.append(path)
        else:
            index.add(path, meta.layout, meta.unit_rows, meta.size, remote=True)
            index.evidence[path] = (meta.stamp, meta.sample)
    if empty and report:
        shown = ", ".join(empty[:3]) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
        log.warning("skipping %d file(s) without events: %s", len(empty), shown)
    if max_events:
        index.cap_events(max_events)
    if index.total == 0:
        raise UserError(
            f"no events in the {len(files)} data file(s) ({len(index.files)} readable, {len(empty)} empty): "
            f"check data.paths"
        )
    return index
