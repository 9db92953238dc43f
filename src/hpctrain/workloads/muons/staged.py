"""Remote muon files: their index without downloading them, and staging them just ahead of use.

Index. The global order needs the events per unit (Parquet row group, HDF5 slice) of every file, before any
file is read. For a remote file we read only its metadata through the fsspec/pelicanfs file object with Range
requests: a Parquet footer (one HEAD and usually one 64 KiB GET) or the HDF5 dataset shapes. Arrow parses the
footer from the file object (`pq.ParquetFile(fs.open(...))`); `pq.read_table(path, filesystem=pelicanfs)` is
never used (pelicanfs' string mtime breaks it). The result is cached in `<run folder>/data_index/` so that a
resumed or requeued run starts without a single remote request; a cached entry that no longer matches the
staged file (another row count) is caught when the file is opened and handled as a bad file.

Staging. `StagedFiles` runs in the stream's main side (the sampler, in the main process or the prefetch thread
of the stream): for each epoch it opens a `Stager` over the files in the order their first row group is read,
from the epoch's start position, plus the first `ahead` files of the next epoch (so an epoch boundary does
not stall). Before a work item goes to a DataLoader worker, the files of its chunk are staged (`Stager.get`,
which blocks only if the file is not there yet); when the item's result comes back and no later chunk of the
epoch needs a file, it is released (deleted with delete_after_use, within max_bytes). Every local rank computes
the same list, so local rank 0 downloads and the others wait for the files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.remote import FolderError, RemoteFiles, classify_failure, is_folder, is_remote
from hpctrain.data.staging import BadFileError, Stager, StagingError
from hpctrain.workloads.muons import layouts

log = logging.getLogger("hpctrain.muons")
INDEX_VERSION = 1
_FOOTER_BLOCK = 1 << 16  # one Range GET covers a typical Parquet footer; pyarrow asks for more if needed


@dataclass
class StagingSpec:
    """How this rank reaches remote inputs: data.staging, data.pelican and its place on the node."""

    staging: StagingConfig = field(default_factory=StagingConfig)
    pelican: PelicanConfig | None = None
    local_rank: int = 0
    local_world_size: int = 1
    job_id: str | None = None
    storage_options: dict[str, Any] | None = None
    index_threads: int = 8


@dataclass
class FileMeta:
    """What the index needs of one remote file: its format and events per unit."""

    uri: str
    layout: str  # "parquet" (the Parquet family: the exact layout is found once staged) or "hdf5"
    unit_rows: list[int]
    size: int


# ---- the index of remote files -----------------------------------------------------------------------------


def _remote_format(uri: str, fh: Any) -> str:
    lower = uri.lower().split("?", 1)[0]
    if lower.endswith(layouts.PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(layouts.HDF5_SUFFIXES):
        return "hdf5"
    head = fh.read(8)
    fh.seek(0)
    if head[:4] == b"PAR1":
        return "parquet"
    if head == layouts.HDF5_MAGIC:
        return "hdf5"
    raise layouts.LayoutError(f"{uri}: neither Parquet nor HDF5 (unknown suffix and magic bytes)")


def _read_meta(uri: str, fs: Any, path: str, hdf5_unit_events: int) -> FileMeta:
    """One remote file's metadata through Range requests (no download)."""
    import pyarrow.parquet as pq

    with fs.open(path, "rb", block_size=_FOOTER_BLOCK, cache_type="readahead") as fh:
        kind = _remote_format(uri, fh)
        size = int(fh.size)
        if kind == "parquet":
            pf = pq.ParquetFile(fh)
            names = set(pf.schema_arrow.names)
            if not {"primary", "muons"} <= names:
                raise layouts.LayoutError(
                    f"{uri}: unknown layout with columns {sorted(names)}; {layouts._EXPECTED}"
                )
            meta = pf.metadata
            return FileMeta(
                uri, "parquet", [meta.row_group(i).num_rows for i in range(meta.num_row_groups)], size
            )
        import h5py

        with h5py.File(fh, "r") as h5:
            if "primaries" not in h5 or h5["primaries"].ndim != 2:
                raise layouts.LayoutError(f"{uri}: unknown HDF5 layout (no 2-d 'primaries' dataset)")
            n = int(h5["primaries"].shape[0])
        rows = [min(hdf5_unit_events, n - s) for s in range(0, n, hdf5_unit_events)]
        return FileMeta(uri, "hdf5", rows, size)


def remote_meta(uri: str, files: RemoteFiles, staging: StagingConfig, hdf5_unit_events: int) -> FileMeta:
    """Metadata of a remote file, retrying transient failures like the stager; BadFileError for 404/403,
    FolderError (a UserError) for a folder, LayoutError for a file of another layout."""
    fs, path = files.resolve(uri)
    if uri.endswith("/"):
        raise FolderError(uri)
    attempt = 0
    while True:
        try:
            return _read_meta(uri, fs, path, hdf5_unit_events)
        except Exception as err:  # network and format errors come in many types; classified below
            if is_folder(fs, path):  # a folder answers 403/404/405, a listing, or "neither Parquet nor HDF5"
                raise FolderError(uri) from None
            if isinstance(err, layouts.LayoutError):
                raise
            kind, reason = classify_failure(err, fs, path, files.scrub)
            if kind == "fatal":
                raise StagingError(f"{uri}: {reason}") from None
            if kind == "bad":  # 404, 403, or a footer Arrow/h5py cannot parse (a corrupt file)
                raise BadFileError(uri, reason) from None
            attempt += 1
            if attempt > staging.retries:
                raise BadFileError(uri, f"metadata: gave up after {attempt} attempts: {reason}") from None
            delay = min(staging.backoff_cap, staging.backoff_base * 2 ** (attempt - 1))
            log.warning("reading the metadata of %s: %s; retry %d in %.2f s", uri, reason, attempt, delay)
            time.sleep(delay)


def _cache_file(run_dir: str | None, uris: Sequence[str], hdf5_unit_events: int) -> Path | None:
    if run_dir is None or not uris:
        return None
    key = hashlib.sha1(("\n".join(uris) + f"\n{hdf5_unit_events}").encode()).hexdigest()[:16]
    return Path(run_dir) / "data_index" / f"remote-{key}.json"


def _load_cache(path: Path | None) -> dict[str, FileMeta]:
    if path is None or not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != INDEX_VERSION:
            return {}
        return {
            m["uri"]: FileMeta(m["uri"], m["layout"], list(m["unit_rows"]), int(m["size"]))
            for m in raw["files"]
        }
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("ignoring unreadable remote index cache %s", path)
        return {}


def _save_cache(path: Path, metas: dict[str, FileMeta]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": INDEX_VERSION, "files": [vars(m) for m in metas.values()]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)  # several ranks may write the same content: readers never see half a file


def remote_index(
    uris: Sequence[str],
    spec: StagingSpec,
    hdf5_unit_events: int,
    run_dir: str | None,
    write_cache: bool,
) -> dict[str, FileMeta | BaseException]:
    """Metadata (or the BadFileError) of each remote URI: from the run folder's cache, else read remotely in
    parallel (one HEAD and a footer GET each). LayoutError, FolderError and StagingError are raised."""
    remote = [u for u in uris if is_remote(u)]
    cache = _cache_file(run_dir, remote, hdf5_unit_events)
    found: dict[str, FileMeta | BaseException] = dict(_load_cache(cache))
    todo = [u for u in remote if u not in found]
    if todo:
        files = RemoteFiles(spec.pelican, spec.storage_options, timeout=spec.staging.timeout)
        start = time.monotonic()

        def one(uri: str) -> FileMeta | BaseException:
            try:
                return remote_meta(uri, files, spec.staging, hdf5_unit_events)
            except BadFileError as err:
                return err

        with ThreadPoolExecutor(max(1, min(spec.index_threads, len(todo)))) as pool:
            for uri, meta in zip(todo, pool.map(one, todo)):
                found[uri] = meta
        log.info("read the metadata of %d remote files in %.1f s", len(todo), time.monotonic() - start)
        good = {u: m for u, m in found.items() if isinstance(m, FileMeta)}
        if write_cache and cache is not None and good:
            _save_cache(cache, good)
    return found


# ---- staging along the epoch's order -----------------------------------------------------------------------


class StagedFiles:
    """Stages the files of each work item before it is handed to a worker; releases them after use.

    Lives on the stream's main side (one thread). `wait_seconds` is the time spent blocked on staging.
    """

    def __init__(self, uris: Sequence[str], spec: StagingSpec) -> None:
        self.uris = list(uris)
        self.spec = spec
        self.bad: dict[int, str] = {}  # file -> reason; not asked for again in later epochs
        self.stats: dict[str, int] = {}
        self._wait_closed = 0.0
        self._stager: Stager | None = None
        self._epoch: int | None = None
        self._seq: dict[int, int] = {}
        self._paths: dict[int, str] = {}
        self._last_chunk: dict[int, int] = {}

    @property
    def wait_seconds(self) -> float:
        return self._wait_closed + (self._stager.wait_seconds if self._stager is not None else 0.0)

    def begin(
        self, epoch: int, chunks: list[list[tuple[int, int, int]]], start_chunk: int, after: list[int]
    ) -> None:
        """Open the epoch's stager: files in first-use order from `start_chunk`, then `after` (the next
        epoch's first files, prefetched within `ahead`). Identical on every local rank."""
        self.close()
        order: list[int] = []
        seen: set[int] = set()
        self._last_chunk = {}
        for c in range(start_chunk, len(chunks)):
            for f, _, _ in chunks[c]:
                self._last_chunk[f] = c
                if f not in seen:
                    seen.add(f)
                    order.append(f)
        tail = [f for f in after if f not in self.bad][: self.spec.staging.ahead]
        self._seq = {f: i for i, f in enumerate(order)}
        self._epoch = epoch
        s = self.spec
        self._stager = Stager(
            [self.uris[f] for f in order + tail],
            s.staging,
            local_rank=s.local_rank,
            local_world_size=s.local_world_size,
            job_id=s.job_id,
            pelican=s.pelican,
            storage_options=s.storage_options,
        )

    def paths(self, epoch: int, files: Sequence[int]) -> tuple[dict[int, str], list[tuple[int, str]]]:
        """Local paths of `files` (staged now if needed) and the files newly found bad, (file, reason)."""
        assert self._stager is not None and epoch == self._epoch, "begin() the epoch first"
        out: dict[int, str] = {}
        newly_bad: list[tuple[int, str]] = []
        for f in files:
            if f in self.bad:
                continue
            if f not in self._paths:
                try:
                    self._paths[f] = str(self._stager.get(self._seq[f]))
                except BadFileError as err:
                    self.bad[f] = err.reason
                    newly_bad.append((f, err.reason))
                    continue
            out[f] = self._paths[f]
        return out, newly_bad

    def done(self, epoch: int, chunk: int) -> None:
        """The result of `chunk` was consumed: release files no later chunk of this epoch reads."""
        if self._stager is None or epoch != self._epoch:
            return
        for f in [f for f in self._paths if self._last_chunk.get(f, -1) <= chunk]:
            self._stager.release(self._seq[f])
            del self._paths[f]

    def end_epoch(self) -> None:
        """Release everything and close the epoch's stager (waits for the other local ranks to finish it)."""
        if self._stager is not None:
            for f in list(self._paths):
                self._stager.release(self._seq[f])
        self.close()

    def close(self) -> None:
        if self._stager is None:
            return
        stager, self._stager = self._stager, None
        self._paths = {}
        try:
            stager.close()
        finally:
            self._wait_closed += stager.wait_seconds
            for key, value in stager.stats.items():
                self.stats[key] = self.stats.get(key, 0) + value
